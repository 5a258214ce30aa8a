"""Figure 2's floor: the drain's per-job work with no library and no Celery — what a lean
Python client reaches on this host, against which the library's drain rate is read.

Each of ``N`` stale jobs (seeded exactly as figure 2 seeds them, upstream already succeeded in
the same simulator) gets, from ``2`` forked processes of ``THREADS`` threads each (the worker's
``-c 2`` and the sweep's ``SWEEP_THREADS``), with psycopg and requests alone:

1. the claim, one transaction: ``UPDATE jobs … RETURNING`` (the attempt counted, a lease taken);
2. the status read: ``GET /api/v1/jobs/recordInfo``, its ``resultJson`` parsed;
3. the media read: ``GET`` of the output's URL;
4. the storage write: a file written, fsynced and renamed into place, as ``LocalStorage`` does;
5. the completion, one statement in one transaction: the ledger's installed commit function,
   the job's compare-and-set, the asset row and the outbox event, as the library's completion
   statement does.

That is the library's drain minus its decision table, its guards, its SQLAlchemy and its
Celery: an upper bound for a Python drain of these jobs here, so "≥ 50 % of the no-op rate" is
read against it. Every row is checked completed and committed in the ledger at the end.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import queue
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import text

from .common import throwaway_db
from .fig_ledger import _COMMIT_CALL
from .seed import add_stale_jobs

PROCESSES = 2
THREADS = 4
USERS = 100

_CLAIM = """UPDATE jobs SET reconcile_attempts = reconcile_attempts + 1,
  poll_lease_expires_at = now() + interval '60 seconds'
WHERE id = %(j)s::uuid AND status IN ('accepted', 'processing')
RETURNING provider_task_id, user_id, job_type"""

# the ledger's commit (bench.fig_ledger's call, with the library's arguments), the job's
# CAS, the asset and the event in one statement, as the library's completion statement
_COMPLETE = """WITH c AS (""" + _COMMIT_CALL.format(job="%(j)s::uuid") + """)
, u AS (
  UPDATE jobs SET status = 'completed', completed_at = now(), progress = 100,
    output_data = %(out)s::jsonb, poll_lease_expires_at = NULL,
    credits_actual = (SELECT r_committed FROM c), display_cost = (SELECT r_committed FROM c)
  WHERE id = %(j)s::uuid AND status IN ('accepted', 'processing') RETURNING id, user_id)
, a AS (
  INSERT INTO reconcile_assets (id, job_id, user_id, index, storage_key, media_type, is_public,
    watermarked, created_at)
  SELECT %(asset)s, id, user_id, 0, %(key)s, %(media_type)s, true, false, now() FROM u)
INSERT INTO reconcile_job_events (event_id, job_id, user_id, type, payload, created_at)
SELECT %(event)s, id, user_id, 'completed', %(payload)s::jsonb, now() FROM u
RETURNING (SELECT r_committed FROM c)"""


def run(n: int = 2000) -> dict[str, Any]:
    """``n`` stale jobs drained by the lean client; jobs/s and its CPU per job."""
    from reconcile.db.session import make_engine
    from reconcile.testing.simulator import Script, Simulator

    with throwaway_db("floor") as (url, libpq), tempfile.TemporaryDirectory() as tmp, \
            Simulator() as sim:
        sim.script_default(Script(timeline=((0.0, "succeeded"),), outputs=1))
        engine = make_engine(url)
        ids = add_stale_jobs(engine, sim, n, USERS)
        with engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT").execute(text("VACUUM ANALYZE"))
        env = sim.env()
        base = env["RECONCILE_KIE_BASE_URL"].rstrip("/")
        key = env.get("RECONCILE_KIE_API_KEY", "sim-key")
        ctx = mp.get_context("fork")
        out = ctx.Queue()
        start_at = time.time() + 1.0
        shares = [ids[p::PROCESSES] for p in range(PROCESSES)]
        procs = [ctx.Process(target=_process, args=(libpq, base, key, Path(tmp) / "media",
                                                    [str(j) for j in share], start_at, out))
                 for share in shares]
        for p in procs:
            p.start()
        results = [out.get(timeout=600) for _ in procs]
        for p in procs:
            p.join(timeout=30)
        with engine.connect() as conn:
            completed, committed = conn.execute(text(
                "SELECT (SELECT count(*) FROM jobs WHERE status = 'completed'), "
                "(SELECT count(*) FROM reconcile_credit_transactions WHERE type = 'COMMIT')")).one()
        engine.dispose()
    errors = [e for r in results for e in r["errors"]]
    if errors or completed != n or committed != n:
        raise RuntimeError(f"the lean drain did not finish its rows: {completed} completed, "
                           f"{committed} committed of {n}; errors {errors[:3]}")
    seconds = max(r["end"] for r in results) - start_at
    cpu = sum(r["cpu"] for r in results)
    return {"jobs": n, "processes": PROCESSES, "threads": THREADS,
            "seconds": round(seconds, 2), "jobs_per_s": round(n / seconds, 1),
            "client_cpu_ms_per_job": round(cpu / n * 1000, 2),
            "client": "psycopg + requests, no library, no Celery: claim, status GET, media GET, "
                      "file write (fsync), the completion as one statement"}


def _process(libpq: str, base: str, api_key: str, root: Path, ids: list[str], start_at: float,
             out: Any) -> None:
    work: queue.Queue[str] = queue.Queue()
    for job_id in ids:
        work.put(job_id)
    errors: list[str] = []
    ends: list[float] = []
    threads = [threading.Thread(target=_thread, args=(libpq, base, api_key, root, work, start_at,
                                                      errors, ends)) for _ in range(THREADS)]
    cpu0 = time.process_time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.put({"cpu": time.process_time() - cpu0, "end": max(ends, default=time.time()),
             "errors": errors[:10]})


def _thread(libpq: str, base: str, api_key: str, root: Path, work: queue.Queue[str],
            start_at: float, errors: list[str], ends: list[float]) -> None:
    import psycopg
    import requests

    http = requests.Session()
    auth = {"Authorization": f"Bearer {api_key}"}
    with psycopg.connect(libpq) as conn:
        while time.time() < start_at:
            time.sleep(0.002)
        while True:
            try:
                job_id = work.get_nowait()
            except queue.Empty:
                break
            try:
                _one(conn, http, base, auth, root, job_id)
            except Exception as exc:  # reported: the run then fails, never counts it
                errors.append(f"{job_id}: {exc.__class__.__name__}: {exc}")
    ends.append(time.time())


def _one(conn: Any, http: Any, base: str, auth: dict[str, str], root: Path, job_id: str) -> None:
    with conn.transaction():
        row = conn.execute(_CLAIM, {"j": uuid.UUID(job_id)}).fetchone()
    if row is None:
        raise RuntimeError("the claim found no row in flight")
    task_id, _, job_type = row
    status = http.get(f"{base}/api/v1/jobs/recordInfo", params={"taskId": task_id},
                      headers=auth, timeout=(5, 30))
    status.raise_for_status()
    data = status.json()["data"]
    if data.get("state") != "success":
        raise RuntimeError(f"upstream not finished: {data.get('state')}")
    url = json.loads(data["resultJson"])["resultUrls"][0]
    media = http.get(url, timeout=(5, 30))
    media.raise_for_status()
    media_type = media.headers.get("Content-Type", "application/octet-stream")
    key = f"{job_type}/{job_id}/0.bin"
    path = root / key
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".part")
    with open(partial, "wb") as f:
        f.write(media.content)
        f.flush()
        os.fsync(f.fileno())
    os.replace(partial, path)
    payload = json.dumps({"outputs": 1, "via": "floor"})
    with conn.transaction():
        done = conn.execute(_COMPLETE, {
            "j": uuid.UUID(job_id), "out": json.dumps({"outputs": [{"key": key, "media_type": media_type}]}),
            "asset": uuid.uuid4(), "key": key, "media_type": media_type,
            "event": str(uuid.uuid4()), "payload": payload}).fetchone()
    if done is None or not done[0]:
        raise RuntimeError("the completion wrote nothing")
