"""Plain Celery: what a team writes without ``reconcile`` (Celery's own docs: ``bind=True``,
``self.retry(countdown=…)``, ``acks_late``), with the minimal money-safe ledger of
:mod:`.ledger`.

* web tier: insert the job + reserve its credits (one transaction), then ``create_job.delay``;
* ``create_job``: create the upstream task, store its id, send ``poll_job`` in 5 s;
* ``poll_job``: read the task's state; running (or the read failed) →
  ``self.retry(countdown=5)``; succeeded → download the output, then write the result and
  commit the credits (one transaction; a failure there retries too); failed → refund. A create
  failing 4 times refunds.

Celery's defaults otherwise (Redis broker, its default visibility timeout, prefetch ×4):
``celery -A bench.peers.plain_celery worker -Q bench.peers.plain --concurrency=2``.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

from celery import Celery
from sqlalchemy import create_engine

from . import ledger, upstream
from .harness import BROKER_URL, CREDITS, INTERVAL_S, Proc, Setup, System, celery_worker

QUEUE = "bench.peers.plain"
MAX_POLLS = 720  # one hour of 5-s polls, then the job fails and is refunded

app = Celery("bench_peers_plain", broker=os.environ.get("BENCH_BROKER_URL", BROKER_URL))
app.conf.task_default_queue = QUEUE
app.conf.task_ignore_result = True
app.conf.broker_connection_retry_on_startup = True

_engines: dict[int, Any] = {}


def db() -> Any:
    """This process's engine (one per pool process: an engine must not cross a fork)."""
    engine = _engines.get(os.getpid())
    if engine is None:
        engine = _engines[os.getpid()] = create_engine(os.environ["BENCH_DB_URL"], pool_size=2)
    return engine


def _fail(job_id: str, error: str) -> None:
    with db().begin() as conn:
        ledger.fail(conn, job_id, error)


@app.task(bind=True, acks_late=True, max_retries=3, default_retry_delay=INTERVAL_S)
def create_job(self: Any, job_id: str) -> None:
    try:
        task_id = upstream.create(job_id)
    except Exception as exc:
        if self.request.retries < self.max_retries:
            raise self.retry(exc=exc) from exc
        _fail(job_id, f"create failed: {exc}")
        return
    with db().begin() as conn:
        ledger.record_task(conn, job_id, task_id)
    poll_job.apply_async((job_id, task_id), countdown=INTERVAL_S)


@app.task(bind=True, acks_late=True, max_retries=MAX_POLLS)
def poll_job(self: Any, job_id: str, task_id: str) -> None:
    try:
        state, urls = upstream.status(task_id)
    except Exception:  # a failed read: read again next interval
        state, urls = "running", []
    if state == "running":
        if self.request.retries >= self.max_retries:
            _fail(job_id, "timed out")
            return
        raise self.retry(countdown=INTERVAL_S)
    if state == "failed" or not urls:
        _fail(job_id, "upstream failed")
        return
    try:
        path = upstream.download(urls[0], Path(os.environ["BENCH_MEDIA_DIR"]) / f"{job_id}.png")
        with db().begin() as conn:
            ledger.complete(conn, job_id, str(path))
    except Exception as exc:  # a failed download or write: the next run reads and tries again
        raise self.retry(exc=exc, countdown=INTERVAL_S) from exc


def web_submitter() -> Any:
    """The web tier's submit: insert + reserve in one transaction, then enqueue."""
    engine = create_engine(os.environ["BENCH_DB_URL"], pool_size=1)
    engine.connect().close()

    def submit(user_id: uuid.UUID) -> None:
        job_id = uuid.uuid4()
        with engine.begin() as conn:
            ledger.submit(conn, job_id, user_id, CREDITS)
        create_job.delay(str(job_id))

    return submit


class PlainCelery(System):
    name = "plain-celery"
    module = "plain_celery"
    celery_app, family = "bench.peers.plain_celery", "plain"

    def start_workers(self, s: Setup, tag: str) -> list[Proc]:
        worker = celery_worker(self.celery_app, QUEUE, self.env(s),
                               s.logs / f"{tag}-worker.log")
        worker.wait_for("ready.")
        return [worker]
