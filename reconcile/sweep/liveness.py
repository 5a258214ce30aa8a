"""Internal: a dead worker is noticed at once, not after a lease.

:func:`reap` takes the worker processes whose heartbeat lapsed (``reconcile_workers`` rows past
their ``expires_at``), ends their claims now (``jobstore.end_claims_of``: each claim's lease
moved to now, nothing else) and hands every row that now needs a decision to the sweep's own
per-job step (:func:`reconcile_job`), which applies the transition an expired lease gets: an
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
from dataclasses import dataclass, field

from .. import jobstore
from ..runtime import Runtime
from .tick import reconcile_job

log = logging.getLogger("reconcile.liveness")

# dead workers taken per transaction (a burst of deaths loops until none is left)
REAP_BATCH = 20


@dataclass
class ReapReport:
    """What one :func:`reap` did: the dead workers taken, the rows decided and their outcomes."""

    workers: list[str] = field(default_factory=list)
    decided: Counter[str] = field(default_factory=Counter)

    def line(self) -> str:
        outcomes = " ".join(f"{k}={v}" for k, v in sorted(self.decided.items()))
        return f"reap workers={len(self.workers)} rows={sum(self.decided.values())} {outcomes}"


def reap(rt: Runtime) -> ReapReport:
    """End the claims of every worker whose heartbeat lapsed and decide the rows they held."""
    report = ReapReport()
    while True:
        now = rt.now()
        with rt.sessions.begin() as session:
            dead = jobstore.take_lapsed_workers(session, now, REAP_BATCH)
            rows: list[uuid.UUID] = jobstore.end_claims_of(session, dead, now) if dead else []
        if not dead:
            break
        report.workers.extend(dead)
        log.warning("worker_lapsed workers=%s claims_ended=%d", ",".join(dead), len(rows))
        for job_id in rows:
            try:
                report.decided[reconcile_job(rt, job_id)] += 1
            except Exception:  # one row's failure leaves it to its (expired) lease: the sweep
                log.exception("worker_lapsed_row_failed job_id=%s", job_id)
                report.decided["error"] += 1
        if len(dead) < REAP_BATCH:
            break
    if report.workers:
        log.info(report.line())
    return report
