"""Batch mode finishes in batches: the completions read in one round are finalized at once
(``POLL_BATCH_FINALIZE_THREADS``), each job in its own transactions — one job's failure never
rolls back another's completion.

Concurrency is shown without a clock: every upload of the round waits at a barrier that opens
only when all of them are inside it at once (run one after another, the first would wait alone
and the barrier would break).
"""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from reconcile import credits
from reconcile.db.models import JobEvent, UsageLog
from reconcile.lifecycle import batch as batch_poll
from reconcile.testing.simulator import Script, Simulator
from tests.integration._sweep_helpers import INSTANT, World

KIND = "replicate-prediction"
INTERVAL = timedelta(seconds=3)


class BarrierStorage:
    """The runtime's storage, every ``put`` held at a barrier of ``parties`` (a job in ``fail``
    raises instead, after the barrier)."""

    def __init__(self, inner: Any, parties: int, fail: set[str] | None = None) -> None:
        self.inner, self.fail = inner, fail or set()
        self.barrier = threading.Barrier(parties, timeout=60)
        self.threads: set[str] = set()
        self._lock = threading.Lock()

    def put(self, key: str, data: bytes, content_type: str | None = None) -> None:
        with self._lock:
            self.threads.add(threading.current_thread().name)
        self.barrier.wait()
        if any(job in key for job in self.fail):
            raise OSError("the object store refused this one")
        self.inner.put(key, data, content_type)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _completions(w: World, job_id: uuid.UUID) -> int:
    with w.db() as s:
        return s.execute(select(func.count()).select_from(JobEvent).where(
            JobEvent.job_id == job_id, JobEvent.type == "completed")).scalar_one()


def _commits(w: World, job_id: uuid.UUID) -> int:
    """The job's usage log committed (the reservation charged): 1, else 0."""
    with w.db() as s:
        return s.execute(select(func.count()).select_from(UsageLog).where(
            UsageLog.job_id == job_id, UsageLog.status == "committed")).scalar_one()


def test_a_rounds_completions_are_finalized_concurrently(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """Six completions in one claim: all six uploads are in flight at once (six finalize
    threads), and each job is completed and committed once."""
    w = World(db, simulator, tmp_path, poll_mode="batch", poll_batch_threads=8,
              poll_batch_finalize_threads=6)
    ids = [w.accept(KIND, Script(timeline=INSTANT, outputs=1)) for _ in range(6)]
    storage = BarrierStorage(w.rt.storage, parties=6)
    w.rt.storage = storage
    w.clock.now += INTERVAL
    report = batch_poll.poll_due(w.rt)
    assert report.outcomes == {"completed": 6}, report.line()
    assert report.observed == 6 and report.fenced == 0
    assert len(storage.threads) == 6 and all(t.startswith("reconcile-finalize")
                                             for t in storage.threads)
    for job_id in ids:
        assert w.job(job_id).status == "completed"
        assert (_completions(w, job_id), _commits(w, job_id)) == (1, 1)
    with w.db() as s:
        assert credits.audit(s) == []


def test_one_jobs_failure_never_rolls_back_anothers_completion(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """Four completions finalized at once; one job's upload fails: the other three are completed
    and committed, the failed one stays in flight and claimed (due again after its lease), and
    the next round completes it once."""
    w = World(db, simulator, tmp_path, poll_mode="batch", poll_batch_threads=8,
              poll_batch_finalize_threads=4)
    ids = [w.accept(KIND, Script(timeline=INSTANT, outputs=1)) for _ in range(4)]
    broken = ids[2]
    storage = BarrierStorage(w.rt.storage, parties=4, fail={str(broken)})
    w.rt.storage = storage
    w.clock.now += INTERVAL
    report = batch_poll.poll_due(w.rt)
    assert report.outcomes.get("completed") == 3, report.line()
    for job_id in ids:
        expected = ("processing", 0) if job_id == broken else ("completed", 1)
        assert (w.job(job_id).status, _commits(w, job_id)) == expected, job_id
    assert w.job(broken).poll_due_at > w.clock.now  # still claimed: no one reads it early
    w.rt.storage = storage.inner
    w.clock.now += batch_poll.claim_lease(w.rt) + timedelta(seconds=1)
    again = batch_poll.poll_due(w.rt)
    assert again.outcomes == {"completed": 1}, again.line()
    assert (w.job(broken).status, _commits(w, broken), _completions(w, broken)) == \
        ("completed", 1, 1)
    with w.db() as s:
        assert credits.audit(s) == []


def test_a_single_outcome_is_finalized_in_the_calling_thread(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """One completion: no pool thread (the interleaving explorer schedules that one thread)."""
    w = World(db, simulator, tmp_path, poll_mode="batch", poll_batch_threads=8)
    w.accept(KIND, Script(timeline=INSTANT, outputs=1))
    storage = BarrierStorage(w.rt.storage, parties=1)
    w.rt.storage = storage
    w.clock.now += INTERVAL
    assert batch_poll.poll_due(w.rt).outcomes == {"completed": 1}
    assert storage.threads == {threading.current_thread().name}
