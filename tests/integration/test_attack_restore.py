"""Attacks on e8cde7e, the storing mark that remembered what it covered (a failed storing put
the covered mark back when the row's was within a second of its own; the batch round passed the
claim-time mark as the covered one). Fixed since by counting storers: ``jobs.storing_count``
(revision 0032), each storer counted when it marks, its count taken back when its storing
fails, and the failure at the horizon waits while the mark lasts and a storer is counted.

Findings against e8cde7e (they fail there): a failing storer dropped a second storer's mark
within a second; a chain's poller whose storing failed then exhausted a job another storer
was downloading; a batch round's failed storing wrote the claim-time mark back over another
storer's; overlapping failing storers kept a job alive past its horizon.

Money rules: a task that succeeded upstream ends ``completed`` exactly once, no refund; a job
whose outputs can never be stored is failed and refunded by its horizon plus a bounded delay,
never kept alive by marks; a live storer is never uncounted by another's failure.
"""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from reconcile import jobstore, lifecycle
from reconcile.lifecycle import batch as batch_poll, batch_reads
from reconcile.providers import PollResult
from reconcile.testing.simulator import Script, Simulator
from tests.integration._sweep_helpers import FOREVER
from tests.integration.test_attack_mark import (
    KIND,
    THRESHOLD,
    _failing_fetch,
    _last_attempt,
    _poll_once,
    _world,
)


def _hold(w: Any, job_id: uuid.UUID, until: Any, now: Any = None, counted: bool = False) -> Any:
    """A storer marks the row at ``now`` (default: the clock's); ``counted``: counted already."""
    with w.db.begin() as s:
        return jobstore.hold_while_storing(s, job_id, until, now=now or w.clock.now,
                                           counted=counted)


def _end(w: Any, job_id: uuid.UUID, mark: Any = None) -> bool:
    """A storer's storing failed: its count taken back."""
    with w.db.begin() as s:
        return jobstore.end_storing(s, job_id)


def _need(w: Any, outputs: int = 1) -> timedelta:
    return lifecycle.storing_hold(w.rt.settings, outputs)


# ============================================================================ findings


@pytest.mark.parametrize("apart", [0.001, 0.5, 0.999], ids=["1ms", "500ms", "999ms"])
def test_a_failing_storer_does_not_drop_a_second_storers_mark_within_a_second(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path, apart: float) -> None:
    """Store level. Storer A marks ``now + hold``; storer B (another reader of the same success:
    a webhook's chain, the sweep) marks ``apart`` seconds later — raised over A's, it covers A's.
    A's storing fails and ends its mark while B still stores.

    Must hold: B's mark stays (the row is still marked until B's time).
    Happens: ``end_storing`` matches the row's mark (B's) within ±1 s of A's and writes A's
    covered mark (NULL) back: B stores unmarked, so a stale read may exhaust the job."""
    w = _world(db, simulator, tmp_path, "chain")
    job_id = w.accept(KIND, Script(timeline=FOREVER))
    now = w.clock.now
    b_at = now + timedelta(seconds=apart)
    assert _hold(w, job_id, now + _need(w), now) and _hold(w, job_id, b_at + _need(w), b_at)
    _end(w, job_id)
    job = w.job(job_id)
    # B joined A's lasting mark (a new storer never stretches another's), counted
    assert (job.storing_until, job.storing_count) == (now + _need(w), 1), (
        f"B still storing; storing_until={job.storing_until} count={job.storing_count}")
    with w.db() as s:
        from sqlalchemy import select

        from reconcile.db.models import Job
        assert s.execute(select(Job.id).where(Job.id == job_id,
                                              jobstore.not_storing(b_at))).first() is None


@pytest.mark.parametrize("apart", [0.5], ids=["500ms"])
def test_chain_first_storers_failure_within_a_second_does_not_fail_a_job_a_second_storer_stores(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, apart: float) -> None:
    """Chain mode, the job's next attempt its last, its task succeeded. The poller P reads
    "succeeded" and marks the row; ``apart`` (0.5 s) later a second reader (another worker: a
    webhook's confirming chain) marks too and starts downloading. P's download fails: P ends its
    mark, then its no-verdict outcome counts the last attempt and calls ``exhaust``.

    Must hold: the job stays processing (the second storer still stores; it completes it).
    Happens: P's end matched the second's mark (within 1 s) and wrote NULL; ``exhaust`` finds
    no mark: failed and refunded while the second storer downloads the success."""
    w = _world(db, simulator, tmp_path, "chain")
    job_id = w.accept(KIND, Script(timeline=FOREVER))
    w.clock.now += THRESHOLD + timedelta(minutes=1)
    _last_attempt(w, job_id)
    failing = _failing_fetch(monkeypatch)
    import reconcile.lifecycle.poll as poll_mod

    real = poll_mod.finalize_job_with_media
    second: list[Any] = []

    def finalize(rt: Any, jid: uuid.UUID, result: Any, **kw: Any) -> bool:
        if jid == job_id and not second:
            # the second storer marks (its download then runs in its own worker)
            second.append(_hold(w, job_id, w.clock.now + timedelta(seconds=apart) + _need(w)))
            failing.append("P's download")
        return real(rt, jid, result, **kw)

    monkeypatch.setattr(poll_mod, "finalize_job_with_media", finalize)
    outcome = _poll_once(w, "chain", job_id)
    failing.clear()
    job = w.job(job_id)
    assert second and second[0] is True
    assert (job.status, w.refunds(job_id)) == ("processing", 0), (
        f"P={outcome}: second storer counted, row {job.storing_until}/{job.storing_count}; "
        f"status={job.status} code={job.error_code} refunds={w.refunds(job_id)}")


def test_batch_a_mark_set_between_claim_and_grouped_hold_survives_the_rounds_failed_storing(
        pg_and_sqlite: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Batch mode, one finalize thread; the job's next attempt is its last, its task succeeded.
    The round claims the row (no mark then). While the round's status read is in flight, another
    reader of the success (the sweep / a webhook's chain, another worker) marks the row and
    starts downloading. The round's grouped hold raises the mark (``_later``) and passes
    ``marked=(its mark, the claim-time mark = NULL)``. The round's download fails.

    Must hold: the other storer's mark stays; the job stays processing (no refund).
    Happens: ``covered`` is the claim-time row's mark, not what the grouped hold covered: the
    round's ``end_storing`` writes NULL back over the other storer's mark and the round's own
    no-verdict outcome exhausts the job: failed and refunded while the other storer stores.
    PostgreSQL and SQLite."""
    w = _world(pg_and_sqlite, simulator, tmp_path, "batch")
    job_id = w.accept(KIND, Script(timeline=FOREVER))
    w.clock.now += THRESHOLD + timedelta(minutes=1)
    _last_attempt(w, job_id)
    failing = _failing_fetch(monkeypatch)
    task = w.task_id(job_id)
    client = w.rt.client(w.rt.kind(KIND))
    real_poll = client.poll
    other: list[Any] = []

    def poll(task_id: str, model: str | None = None) -> PollResult:
        result = real_poll(task_id, model=model)
        if task_id == task and not other:
            other.append(_hold(w, job_id, w.clock.now + _need(w)))
            w.clock.now += timedelta(seconds=2)  # the round's read returns 2 s later
            failing.append("the round's download")
        return result

    monkeypatch.setattr(client, "poll", poll)
    outcome = _poll_once(w, "batch", job_id)
    failing.clear()
    job = w.job(job_id)
    assert other and other[0] is True, outcome
    assert (job.status, w.refunds(job_id)) == ("processing", 0) and job.storing_count == 1, (
        f"round={outcome}: other storer counted, row {job.storing_until}/{job.storing_count}; "
        f"status={job.status} code={job.error_code} refunds={w.refunds(job_id)}")


def test_overlapping_failing_storers_every_minute_do_not_keep_a_job_alive(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """Store level, the liveness side. A success whose media always fails; every minute two
    readers overlap (the poller and a webhook's chain, say): A marks, B marks 10 s later (covers
    A's), A's storing fails first (its end: the row is B's, nothing), then B's (it restores
    A's — a mark A already ended). Each of them then calls ``exhaust`` (``not_storing``).

    Must hold: the job can be exhausted within its horizon plus a bounded delay (old: B's end
    cleared the row; B's exhaust succeeded at once).
    Happens: each pair leaves its A's ended mark alive (now + hold), so while pairs come more
    often than the hold, ``not_storing`` is never true: measured over 2 hours of simulated time."""
    from sqlalchemy import select

    from reconcile.db.models import Job

    w = _world(db, simulator, tmp_path, "chain")
    job_id = w.accept(KIND, Script(timeline=FOREVER))
    start = w.clock.now
    free_at = None
    for minute in range(120):
        now = start + timedelta(minutes=minute)
        a = _hold(w, job_id, now + _need(w), now)
        b = _hold(w, job_id, now + timedelta(seconds=10) + _need(w), now + timedelta(seconds=10))
        _end(w, job_id, a)
        _end(w, job_id, b)
        after = now + timedelta(seconds=20)
        with w.db() as s:
            ok = s.execute(select(Job.id).where(Job.id == job_id,
                                                jobstore.not_storing(after))).first()
        if ok is not None:
            free_at = minute
            break
    assert free_at is not None, (
        f"2 hours of failing storer pairs: the row never free to exhaust "
        f"(storing_until={w.job(job_id).storing_until}, now {start + timedelta(minutes=120)})")


# ============================================================================ held


@pytest.mark.parametrize("fault", ["hold_raises", "alone_base_exception"])
def test_a_round_that_raises_releases_what_it_reserved(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, fault: str) -> None:
    """A pooled round (4 finalize threads, two successes) whose grouped hold raises (it falls
    back per job) or whose per-job outcome raises a BaseException inside ``pool.map``: what it
    reserved on the process's finalize queue is released (no leak inflating later marks)."""
    import os

    w = _world(db, simulator, tmp_path, "batch", poll_batch_finalize_threads=4,
               poll_batch_threads=2)
    ids = [w.accept(KIND, Script(timeline=FOREVER)) for _ in range(2)]
    w.clock.now += timedelta(minutes=2)
    for j in ids:
        w.sim.set_state(w.task_id(j), "succeeded")
        w.set(j, poll_due_at=w.clock.now - timedelta(seconds=1))
    before = batch_reads._QUEUED.get(os.getpid(), timedelta(0))
    if fault == "hold_raises":
        def boom(*a: Any, **k: Any) -> Any:
            raise RuntimeError("grouped hold")
        monkeypatch.setattr(jobstore, "hold_claims_with_status", boom)
        batch_poll.poll_due(w.rt, budget=60)
    else:
        def alone(*a: Any, **k: Any) -> Any:
            raise KeyboardInterrupt("inside pool.map")
        monkeypatch.setattr(batch_poll, "_alone", alone)
        with pytest.raises(KeyboardInterrupt):
            batch_poll.poll_due(w.rt, budget=60)
    assert batch_reads._QUEUED.get(os.getpid(), timedelta(0)) == before


def test_hold_while_storing_does_not_deadlock_with_a_locked_row(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """PostgreSQL: a transaction holds the job row (the sweep's locked batch, a completion's
    CAS) while a storer marks: the mark waits and goes through once the other commits; it
    never deadlocks (one row lock each, taken first)."""
    from sqlalchemy import select, text

    from reconcile.db.models import Job

    w = _world(db, simulator, tmp_path, "chain")
    job_id = w.accept(KIND, Script(timeline=FOREVER))
    got: list[Any] = []
    with w.db.begin() as s:
        s.execute(select(Job.id).where(Job.id == job_id).with_for_update(skip_locked=True)).all()
        t = threading.Thread(target=lambda: got.append(_hold(w, job_id, w.clock.now + _need(w))))
        t.start()
        t.join(1.0)
        assert t.is_alive()  # waits on the row lock
        s.execute(text("SELECT 1"))
    t.join(10)
    assert not t.is_alive() and got == [True]
