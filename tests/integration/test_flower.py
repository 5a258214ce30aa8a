"""Flower shows reconcile's tasks by name with their job id (a real worker and Flower process)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

ROOT = Path(__file__).resolve().parents[2]
BROKER = "redis://127.0.0.1:6379/14"
DEADLINE = 40.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def process_group(args: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Start ``args`` in its own process group; stop the whole group (TERM, then KILL) after."""
    with log.open("wb") as out:
        proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        yield proc
    finally:
        for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read().decode())


def test_flower_lists_a_reconcile_task_with_its_job_id(redis_url: str, pg_url: str,
                                                       tmp_path: Path) -> None:
    """A `reconcile.settle` run by a real worker appears in Flower's /api/tasks, by name, with its
    job id in the args and state SUCCESS."""
    job_id = str(uuid.uuid4())  # an unknown job: settle is a no-op
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RECONCILE_", "FLOWER_"))}
    env.update(RECONCILE_BROKER_URL=BROKER, RECONCILE_DATABASE_URL=pg_url,
               FLOWER_UNAUTHENTICATED_API="true", PYTHONPATH=str(ROOT))
    celery = [sys.executable, "-m", "celery", "-A", "reconcile.celery_app"]
    worker = celery + ["worker", "--pool", "solo", "-Q", "reconcile", "--without-mingle",
                       "--without-gossip", "-n", f"flower-test-{job_id[:8]}@%h", "-l", "INFO"]
    flower = celery + ["flower", "--address=127.0.0.1", f"--port={port}"]
    client = Celery("flower-test", broker=BROKER)
    found: dict[str, Any] | None = None
    started = time.monotonic()
    with process_group(worker, env, tmp_path / "worker.log") as w, \
            process_group(flower, env, tmp_path / "flower.log") as f:
        last_send = 0.0
        while found is None and time.monotonic() - started < DEADLINE:
            assert w.poll() is None, (tmp_path / "worker.log").read_text()
            assert f.poll() is None, (tmp_path / "flower.log").read_text()
            # events sent before Flower subscribed are lost, so send again until it has one
            if time.monotonic() - last_send > 4:
                client.send_task("reconcile.settle", args=[job_id], queue="reconcile")
                last_send = time.monotonic()
            try:
                tasks = get_json(f"http://127.0.0.1:{port}/api/tasks?taskname=reconcile.settle")
            except (urllib.error.URLError, ConnectionError, json.JSONDecodeError):
                tasks = {}
            found = next((t for t in tasks.values()
                          if t.get("name") == "reconcile.settle" and job_id in str(t.get("args"))
                          and t.get("state") == "SUCCESS"),
                         None)
            time.sleep(0.5)
    client.close()
    if found is None:
        pytest.fail(f"Flower never listed the task within {DEADLINE:.0f}s\n--- worker\n"
                    f"{(tmp_path / 'worker.log').read_text()[-3000:]}\n--- flower\n"
                    f"{(tmp_path / 'flower.log').read_text()[-3000:]}")
    assert found["name"] == "reconcile.settle" and job_id in found["args"]
