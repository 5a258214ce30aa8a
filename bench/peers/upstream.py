"""The peers' client of the upstream API (KIE's market jobs, as the shipped simulator serves it):
create a task, read its state, download its output. Plain ``requests``, one session per thread.

The job id rides in the callback URL's query string (``?job_id=``), as ``reconcile`` plants it,
so the simulator counts creates per job for every system alike; the simulator sends no webhook
(its default script), so no callback is ever made to it.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import requests

MODEL = "seedream/4.5-edit"  # a kie-standard model (the simulator's example)
CALLBACK = "http://127.0.0.1:9/callback"  # never called (no webhook in the script)
DONE = {"success": "succeeded", "fail": "failed"}

_local = threading.local()


def _session() -> requests.Session:
    session = getattr(_local, "session", None)
    if session is None:
        session = _local.session = requests.Session()
        session.trust_env = False  # loopback only, never through a proxy
        session.headers["Authorization"] = f"Bearer {os.environ['BENCH_UPSTREAM_KEY']}"
    return session


def _base() -> str:
    return os.environ["BENCH_UPSTREAM_URL"].rstrip("/")


def _data(response: requests.Response) -> Any:
    response.raise_for_status()
    body = response.json()
    if body.get("code") != 200:
        raise RuntimeError(f"upstream answered {body.get('code')}: {body.get('msg')}")
    return body["data"]


def create(job_id: str) -> str:
    """Create the job's upstream task; its task id."""
    return str(_data(_session().post(f"{_base()}/api/v1/jobs/createTask", json={
        "model": MODEL, "input": {"prompt": "bench"},
        "callBackUrl": f"{CALLBACK}?job_id={job_id}"}, timeout=(5, 30)))["taskId"])


def status(task_id: str) -> tuple[str, list[str]]:
    """("running" | "succeeded" | "failed", the output URLs)."""
    data = _data(_session().get(f"{_base()}/api/v1/jobs/recordInfo",
                                params={"taskId": task_id}, timeout=(5, 30)))
    state = DONE.get(data["state"], "running")
    urls = json.loads(data["resultJson"])["resultUrls"] if data.get("resultJson") else []
    return state, urls


def download(url: str, dest: Path) -> Path:
    """The output, written to ``dest`` (replaced atomically: a second download is harmless)."""
    response = _session().get(url, timeout=(5, 120))
    response.raise_for_status()
    partial = dest.with_name(dest.name + f".{os.getpid()}.{threading.get_ident()}.part")
    partial.write_bytes(response.content)
    os.replace(partial, dest)
    return dest
