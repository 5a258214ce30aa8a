"""DBOS Transact: a durable workflow per job, as DBOS's docs lay out a queue worker (the "Queue
Worker" example: workers launch DBOS and register a queue; the web tier enqueues through
``DBOSClient``), with the minimal money-safe ledger of :mod:`.ledger`.

* web tier: insert the job + reserve its credits + enqueue its workflow, one transaction
  (``DBOSClient.enqueue_in_transaction``; the workflow id is the job id);
* workflow ``run_job``: a step to create the upstream task (and store its id), then
  ``DBOS.sleep(5)`` between poll steps until the task is done, then a step to finalize
  (download the output, write the result and commit the credits in one transaction; refund if
  the task or its create failed). The create and finalize steps use DBOS's step retries.

Each worker process is ``python -m bench.peers.dbos_app <executor id>``: its own executor id, so
a restarted process recovers its own pending workflows (DBOS's self-hosting guide). The DBOS
system tables live in the system's database (schema ``dbos``), beside the ledger.
"""

from __future__ import annotations

import os
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

from dbos import DBOS, DBOSClient, DBOSConfig, EnqueueOptions
from sqlalchemy import create_engine

from . import ledger, upstream
from .harness import CREDITS, INTERVAL_S, PYTHON, Proc, Setup, System

QUEUE = "bench_peers_jobs"
APP_VERSION = "bench-peers-1"  # fixed: a restarted worker recovers what the killed one left

_engine: list[Any] = []


def db() -> Any:
    if not _engine:
        # steps run in DBOS's executor threads, one per workflow: a small shared pool (DBOS's
        # own system-database pool is 20 per process; the server allows 100 connections)
        _engine.append(create_engine(os.environ["BENCH_DB_URL"], pool_size=5, max_overflow=5))
    return _engine[0]


# transient failures (a reset connection, an upstream 5xx) are retried by DBOS (its step
# retries: 1 s, 2 s, 4 s); a create still failing after them fails the job and refunds it
@DBOS.step(retries_allowed=True, max_attempts=4)
def create_task(job_id: str) -> str:
    task_id = upstream.create(job_id)
    with db().begin() as conn:
        ledger.record_task(conn, job_id, task_id)
    return task_id


@DBOS.step()
def check_task(task_id: str) -> tuple[str, list[str]]:
    try:
        return upstream.status(task_id)
    except Exception:  # a failed read: read again next interval
        return "running", []


@DBOS.step(retries_allowed=True, max_attempts=4)
def finalize(job_id: str, state: str, urls: list[str]) -> str:
    if state != "succeeded" or not urls:
        with db().begin() as conn:
            ledger.fail(conn, job_id, f"upstream {state}")
        return "failed"
    path = upstream.download(urls[0], Path(os.environ["BENCH_MEDIA_DIR"]) / f"{job_id}.png")
    with db().begin() as conn:
        ledger.complete(conn, job_id, str(path))
    return "completed"


@DBOS.workflow()
def run_job(job_id: str) -> str:
    try:
        task_id = create_task(job_id)
    except Exception:
        return finalize(job_id, "create failed", [])
    while True:
        DBOS.sleep(INTERVAL_S)
        state, urls = check_task(task_id)
        if state != "running":
            return finalize(job_id, state, urls)


def web_submitter() -> Any:
    """The web tier's submit: insert + reserve + enqueue its workflow, one transaction."""
    url = os.environ["BENCH_DB_URL"]
    engine = create_engine(url, pool_size=1)
    engine.connect().close()
    client = DBOSClient(system_database_url=url)

    def submit(user_id: uuid.UUID) -> None:
        job_id = uuid.uuid4()
        options: EnqueueOptions = {"queue_name": QUEUE, "workflow_name": "run_job",
                                   "workflow_id": str(job_id), "app_version": APP_VERSION}
        with engine.begin() as conn:
            ledger.submit(conn, job_id, user_id, CREDITS)
            client.enqueue_in_transaction(conn, options, str(job_id))

    return submit


class Dbos(System):
    name = "dbos"
    module = "dbos_app"

    def start_workers(self, s: Setup, tag: str) -> list[Proc]:
        """Two processes, executors ``worker-0`` and ``worker-1`` (the same ids after a
        restart). The first launches alone: it creates the system tables."""
        procs = []
        for i in range(2):
            procs.append(Proc([PYTHON, "-m", "bench.peers.dbos_app", f"worker-{i}"], self.env(s),
                              s.logs / f"{tag}-worker-{i}.log"))
            procs[-1].wait_for(f"worker-{i} ready")
        return procs


def main(executor_id: str) -> None:
    config: DBOSConfig = {"name": "bench-peers", "system_database_url": os.environ["BENCH_DB_URL"],
                          "executor_id": executor_id, "application_version": APP_VERSION}
    DBOS(config=config)
    DBOS.launch()
    DBOS.register_queue(QUEUE)
    print(f"dbos worker {executor_id} ready", flush=True)
    threading.Event().wait()  # dequeue and run workflows until killed


if __name__ == "__main__":
    main(sys.argv[1])
