"""Attacks on 25f505f, the storer count (``jobs.storing_count``): each reader of "succeeded"
counts itself (``hold_while_storing``; the first after the mark ended restarts at one), a failed
storing takes one back (``end_storing``), ``exhaust`` waits while the mark lasts and the count
is positive (``not_storing``).

Money rules: a job whose outputs can never be stored is failed and refunded by its horizon plus
a bounded delay, never kept alive by marks; a live storer is never uncounted by another's
failure (its success must not be failed and refunded under it).
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from reconcile import jobstore, lifecycle
from reconcile.db.models import Job
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
from tests.integration.test_attack_restore import _hold


def _end(w: Any, job_id: uuid.UUID) -> bool:
    with w.db.begin() as s:
        return jobstore.end_storing(s, job_id)


def _need(w: Any) -> timedelta:
    return lifecycle.storing_hold(w.rt.settings, 1)


def _free(w: Any, job_id: uuid.UUID, at: Any) -> bool:
    with w.db() as s:
        return s.execute(select(Job.id).where(Job.id == job_id,
                                              jobstore.not_storing(at))).first() is not None


# ============================================================================ liveness


@pytest.mark.parametrize("leak", [False, True], ids=["control-no-leak", "one-leaked-count"])
def test_one_leaked_count_keeps_a_failing_media_job_alive_forever(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, leak: bool) -> None:
    """Chain mode; the task succeeded upstream but its media always fails to download; the
    job's next attempt is its last. One storer was counted and never took its count back (its
    worker was killed mid-download — a hard time limit, OOM, a deploy; or a batch round whose
    grouped hold counted it and whose per-job step raised before/inside ``_mark_storing``; or a
    grouped hold that committed but raised, so the per-job fallback counted again). Its mark
    alone would end after ``storing_hold`` (255 s). Then the poller reads "succeeded" every
    minute: each read marks (``now + hold``, the count +1 since the mark lasts), its download
    fails, it takes its +1 back and calls ``exhaust``.

    Must hold: the job is failed (refunded) within its horizon plus a bounded delay.
    (The control without the leaked count passes: the job fails at its first read.)
    Happens: every read extends the mark while the leaked 1 never goes away: ``not_storing``
    is never true, the job stays processing for the 3 hours measured (and forever)."""
    w = _world(db, simulator, tmp_path, "chain")
    job_id = w.accept(KIND, Script(timeline=FOREVER))
    w.clock.now += THRESHOLD + timedelta(minutes=1)
    _last_attempt(w, job_id)
    failing = _failing_fetch(monkeypatch)
    failing.append("media gone")
    if leak:  # the dead storer: counted, never ended
        assert _hold(w, job_id, w.clock.now + _need(w), w.clock.now)
    start = w.clock.now
    outcomes = []
    for _ in range(180):
        w.clock.now += timedelta(minutes=1)
        w.q.polls.clear()
        outcomes.append(_poll_once(w, "chain", job_id))
        if w.job(job_id).status != "processing":
            break
    job = w.job(job_id)
    assert job.status == "failed" and w.refunds(job_id) == 1, (
        f"after {w.clock.now - start} of failing reads every minute: status={job.status} "
        f"attempts={job.reconcile_attempts} storing_until={job.storing_until} "
        f"(now {w.clock.now}) count={job.storing_count} last outcomes={outcomes[-3:]}")


# ============================================================================ uncounting


@pytest.mark.xfail(strict=True, reason=(
    "known: a storer whose storing outlasts its own mark (waiting in a round's queue past its bound) is not counted again once another storer restarted the count; needs an epoch on the count"))
def test_grouped_storer_remarked_after_its_mark_ended_is_not_counted(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """Store level, the exact calls of a batch round. The round's grouped hold counts storer A
    (``hold_claims_with_status(storing=…)``) with a mark U sized for its place in the finalize
    queue. The queue takes longer than planned: U ends before A's ``_mark_storing`` runs.
    Meanwhile another reader B (a webhook's chain, the sweep) reads "succeeded" after U ended:
    its count restarts at one (A's count is wiped). A then reaches ``_mark_storing``: its
    grouped mark is too short, so it calls ``hold_while_storing(counted=True)`` — the mark moves,
    A is NOT counted again. Two live storers, count 1. B's download fails: count 0.

    Must hold: A still stores, so the row is not free to exhaust (``not_storing`` false).
    Happens: count 0 with A's mark lasting: any no-verdict read fails and refunds the job whose
    success A is downloading (A's completion then loses)."""
    w = _world(db, simulator, tmp_path, "chain")
    job_id = w.accept(KIND, Script(timeline=FOREVER))
    t0 = w.clock.now
    # A counted by the grouped hold, mark U = t0 + 30 s (a short queue estimate)
    assert _hold(w, job_id, t0 + timedelta(seconds=30), t0)
    # U ended; B reads "succeeded" and marks: count restarts at 1
    b_at = t0 + timedelta(seconds=40)
    assert _hold(w, job_id, b_at + _need(w), b_at)
    # A reaches _mark_storing: grouped mark too short -> counted=True (mark moves only)
    a_at = t0 + timedelta(seconds=45)
    assert _hold(w, job_id, a_at + _need(w), a_at, counted=True)
    # B's storing fails
    _end(w, job_id)
    job = w.job(job_id)
    assert not _free(w, job_id, a_at + timedelta(seconds=5)), (
        f"A still storing, but storing_until={job.storing_until} count={job.storing_count}: "
        f"the job may be exhausted under A")


@pytest.mark.xfail(strict=True, reason=(
    "known: a storing that outlasts its own mark, then fails, takes back the count of the storer that restarted it; needs an epoch on the count"))
def test_a_slow_storers_failure_uncounts_the_storer_that_restarted_the_count(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """Store level. Storer A marks at t0 (count 1, mark t0 + hold). A's storing outlasts its
    hold (finalize's database part waits on a lock, a slow upload). After the mark ended,
    reader B reads "succeeded" and marks: the count restarts at 1 (B's). A's storing then fails:
    ``end_storing`` takes one back — B's.

    Must hold: B is still counted (a live storer is never uncounted by another's failure).
    Happens: count 0 while B's mark lasts: ``not_storing`` true, a no-verdict read exhausts
    the job B is storing."""
    w = _world(db, simulator, tmp_path, "chain")
    job_id = w.accept(KIND, Script(timeline=FOREVER))
    t0 = w.clock.now
    assert _hold(w, job_id, t0 + _need(w), t0)
    b_at = t0 + _need(w) + timedelta(seconds=1)
    assert _hold(w, job_id, b_at + _need(w), b_at)
    _end(w, job_id)  # A, late
    job = w.job(job_id)
    assert not _free(w, job_id, b_at + timedelta(seconds=5)), (
        f"B still storing, but storing_until={job.storing_until} count={job.storing_count}")


@pytest.mark.xfail(strict=True, reason=(
    "known: a grouped hold whose commit's acknowledgement is lost counts its storers twice; the leftover count holds the horizon only until the mark ends"))
def test_batch_grouped_hold_committed_then_raised_counts_the_storer_twice(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Batch mode. The round's grouped hold commits (counting the success's storer) but the
    call raises afterwards (the commit's acknowledgement lost: the connection dropped). The
    round falls back per job (``_HOLD_EACH``): ``marked=None``, so ``_mark_storing`` counts the
    same storer again. Its download fails: one taken back.

    Must hold: no storer left, count 0 (else the leak keeps the job alive: the liveness test).
    Happens: count 1 with nobody storing."""
    from reconcile.lifecycle import batch as batch_poll

    w = _world(db, simulator, tmp_path, "batch")
    job_id = w.accept(KIND, Script(timeline=FOREVER))
    w.clock.now += timedelta(minutes=2)
    w.sim.set_state(w.task_id(job_id), "succeeded")
    failing = _failing_fetch(monkeypatch)
    failing.append("media")
    real = jobstore.hold_claims_with_status

    def committed_then_raised(session: Any, *a: Any, **k: Any) -> Any:
        with w.db.begin() as own:
            real(own, *a, **k)
        raise ConnectionError("commit ack lost")

    monkeypatch.setattr(jobstore, "hold_claims_with_status", committed_then_raised)
    w.set(job_id, poll_due_at=w.clock.now - timedelta(seconds=1))
    line = batch_poll.poll_due(w.rt, budget=60).line()
    job = w.job(job_id)
    assert job.status == "processing", line
    assert (job.storing_count or 0) == 0, (
        f"{line}: nobody storing, count={job.storing_count} storing_until={job.storing_until}")
