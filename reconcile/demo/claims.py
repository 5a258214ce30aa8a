"""The batch story's evidence (``RECONCILE_POLL_MODE=batch``, see :mod:`reconcile.demo`): which
liveness rows are worker A's, which rows A held claimed when it died (and until when), when
its liveness rows were reaped and by whom, and which rows worker B's processes claimed.

Read from the database (``reconcile_workers``; ``jobs.claimed_by``, ``poll_due_at``,
``poll_lease_expires_at``) and worker B's log, never from inside the workers: what an operator
could see."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import uuid
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any


def workers_of(rt: Any, group: int) -> set[str]:
    """The live worker ids (``reconcile_workers``) of the processes in process group ``group``
    on this host: one per pool process of that Celery worker."""
    from sqlalchemy import select

    from ..db.models import WorkerHeartbeat

    host = socket.gethostname()
    with rt.sessions() as session:
        rows = session.execute(select(WorkerHeartbeat.worker_id, WorkerHeartbeat.pid)
                               .where(WorkerHeartbeat.hostname == host)).all()
    mine: set[str] = set()
    for worker_id, pid in rows:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(pid) == group:
                mine.add(worker_id)
    return mine


def held_claims(rt: Any, ids: Iterable[uuid.UUID], workers: set[str]
                ) -> dict[uuid.UUID, tuple[str, datetime]]:
    """The rows of ``ids`` whose batch claim ``workers`` hold now, each with its claimer and its
    lease's end: ``jobstore.live_batch_claims``, the claims a reaper ends
    (``jobstore.end_claims_of``)."""
    from sqlalchemy import select

    from ..db.models import Job
    from ..jobstore import live_batch_claims

    if not workers:
        return {}
    with rt.sessions() as session:
        jobs = session.execute(select(Job).where(
            Job.id.in_(list(ids)), *live_batch_claims(sorted(workers), rt.now()))).scalars()
        return {job.id: (job.claimed_by, job.poll_due_at) for job in jobs}


class ReapWatch:
    """A thread noting when each liveness row of ``workers`` is gone: a reaper
    (``reconcile.sweep.liveness.reap``) deletes a lapsed row in the transaction that ends its
    claims. Nothing else deletes a SIGKILLed worker's row. Each pool process beats on its own
    schedule, so the rows of one dead worker lapse up to a heartbeat interval apart."""

    def __init__(self, rt: Any, workers: set[str], interval: float = 0.1) -> None:
        self.rt = rt
        self.workers = set(workers)
        self.interval = interval
        self.gone_at: dict[str, datetime] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="demo-reap-watch", daemon=True)

    def start(self) -> ReapWatch:
        self._thread.start()
        return self

    def _loop(self) -> None:
        from sqlalchemy import select

        from ..db.models import WorkerHeartbeat

        while not self._stop.is_set() and len(self.gone_at) < len(self.workers):
            try:
                with self.rt.sessions() as session:
                    left = set(session.execute(select(WorkerHeartbeat.worker_id).where(
                        WorkerHeartbeat.worker_id.in_(list(self.workers)))).scalars())
            except Exception:  # a busy SQLite file: look again
                left = self.workers
            now = self.rt.now()
            for worker in self.workers - left:
                self.gone_at.setdefault(worker, now)
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def reaped_by(log_path: Path, workers: set[str]) -> dict[str, str]:
    """Who reaped each of ``workers``: worker B's heartbeat thread logs ``worker_lapsed
    workers=…`` in B's log; the only other reaper is the sweep tick of this process (whose
    log is not kept)."""
    try:
        text = log_path.read_text("utf-8", "replace")
    except OSError:
        text = ""
    lapsed = [line for line in text.splitlines() if "worker_lapsed workers=" in line]
    return {worker: "worker B's heartbeat" if any(worker in line for line in lapsed)
            else "the sweep tick" for worker in workers}


def discarded_ticks(log_path: Path) -> int:
    """The ``reconcile.poll_due`` messages a worker dropped unrun (ticks, helpers, wakes):
    expired before it took them."""
    try:
        text = log_path.read_text("utf-8", "replace")
    except OSError:
        return 0
    return text.count("Discarding revoked task: reconcile.poll_due[")


def release(claim: tuple[str, datetime], gone_at: dict[str, datetime]) -> str:
    """How a row A held came back: ``released`` when its claimer's liveness row was reaped
    before the claim's lease ended (the reaper ended the claim), else ``due-again`` (the lease
    ran out first)."""
    worker, until = claim
    reaped = gone_at.get(worker)
    return "released" if reaped is not None and reaped < until else "due-again"


def finished_by(story: Any, jobs: dict[uuid.UUID, Any]) -> tuple[list[uuid.UUID], list[str]]:
    """The rows A held claimed at its death that ended completed or failed, last claimed by one
    of worker B's processes; and what is wrong with the others."""
    done: list[uuid.UUID] = []
    wrong: list[str] = []
    for job_id in story.held_at_crash:
        job = jobs.get(job_id)
        if job is None or job.status not in ("completed", "failed"):
            wrong.append(f"{str(job_id)[:8]} {job.status if job is not None else 'missing'}")
        elif job.claimed_by not in story.b_workers:
            wrong.append(f"{str(job_id)[:8]} last claimed by {job.claimed_by}, not worker B")
        else:
            done.append(job_id)
    return done, wrong
