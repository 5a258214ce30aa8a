"""Internal: a dead worker is noticed at once, not after a lease.

:func:`reap` takes the worker processes whose heartbeat lapsed (``reconcile_workers`` rows past
their ``expires_at``), ends their claims now (``jobstore.end_claims_of``: each claim's lease
moved to now, nothing else) and hands every row that now needs a decision to the sweep's own
decision and claim (``_plan``, in locked batches of ``BATCH_SIZE`` as a tick takes them, then
``_run``: what :func:`reconcile_job` does one row at a time), which applies the transition an
expired lease gets: an
expired create claim becomes ``uncertain`` (never ``not_started``: the call may have landed), an
expired poll chain resumes under a new generation. An expired batch claim is due again at once
and the next batch tick claims it. Every live worker's heartbeat thread calls it after each beat
(``reconcile.worker.heartbeat``), and so does every sweep tick; the leases stay as the backstop
(a worker with no heartbeat, a reaper that dies after its commit).
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from dataclasses import dataclass, field, replace

from sqlalchemy import select

from .. import jobstore
from ..db.models import Job
from ..runtime import Runtime
from .carry import _run
from .claims import BATCH_SIZE, _plan

log = logging.getLogger("reconcile.liveness")

# dead workers taken per transaction (a burst of deaths loops until none is left)
REAP_BATCH = 20


@dataclass
class ReapReport:
    """What one :func:`reap` did: the dead workers taken, the rows decided and their outcomes."""

    workers: list[str] = field(default_factory=list)
    decided: Counter[str] = field(default_factory=Counter)
    released: int = 0  # batch claims made due at once (nothing to decide)

    def line(self) -> str:
        outcomes = " ".join(f"{k}={v}" for k, v in sorted(self.decided.items()))
        return (f"reap workers={len(self.workers)} rows={sum(self.decided.values())} "
                f"batch_released={self.released} {outcomes}").rstrip()


def reap(rt: Runtime) -> ReapReport:
    """End the claims of every worker whose heartbeat lapsed and decide the rows they held."""
    report = ReapReport()
    while True:
        now = rt.now()
        with rt.sessions.begin() as session:
            dead = jobstore.take_lapsed_workers(session, now, REAP_BATCH)
            rows, released = jobstore.end_claims_of(session, dead, now) if dead else ([], 0)
        if not dead:
            break
        report.workers.extend(dead)
        report.released += released
        log.warning("worker_lapsed workers=%s claims_ended=%d batch_released=%d",
                    ",".join(dead), len(rows), released)
        for start in range(0, len(rows), BATCH_SIZE):
            _decide(rt, rows[start:start + BATCH_SIZE], report)
        if len(dead) < REAP_BATCH:
            break
    if report.workers:
        log.info(report.line())
    return report


def _decide(rt: Runtime, ids: list[uuid.UUID], report: ReapReport) -> None:
    """The sweep's decision and claim for these rows under their row locks (a row another
    sweep or reaper holds is skipped: it decides it), one transaction; then each plan carried
    out. A row whose decision fails is left to its expired lease (the next sweep tick)."""
    now = rt.now()
    plans = []
    try:
        with rt.sessions.begin() as session:
            jobs = session.execute(select(Job).where(Job.id.in_(ids)).order_by(Job.id)
                                   .with_for_update(skip_locked=True)).scalars().all()
            for job in jobs:
                try:
                    plans.append(replace(_plan(rt, session, job, now, dry_run=False),
                                         reaped=True))
                except Exception:
                    log.exception("worker_lapsed_row_failed job_id=%s", job.id)
                    report.decided["error"] += 1
    except Exception:
        log.exception("worker_lapsed_batch_failed rows=%d", len(ids))
        report.decided["error"] += len(ids)
        return
    for plan in plans:
        report.decided[_run(rt, plan, None)] += 1
