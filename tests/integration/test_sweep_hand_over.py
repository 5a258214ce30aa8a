"""A tick past its time budget, in batch mode, hands dead poll chains to the batch poller: each
row with no due time is made due (one statement per page) instead of a fanned-out task that
reads it alone; the poller then reads and finalizes them by the batch. Any other row still
goes to ``fan_out``, and chain mode fans out as before."""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from reconcile.db.models import CreditTransaction, Job
from reconcile.lifecycle import batch
from reconcile.sweep import reconcile_job, sweep
from reconcile.testing.simulator import Script, Simulator
from tests.integration._sweep_helpers import INSTANT, World


def _dead_chains(w: World, n: int) -> list[uuid.UUID]:
    """``n`` accepted jobs whose upstream has succeeded, as chains that died before the
    deployment moved to batch mode: no due time, the poll lease over."""
    jobs = [w.accept("kie-standard", Script(timeline=INSTANT)) for _ in range(n)]
    with w.db.begin() as s:
        s.execute(update(Job).where(Job.id.in_(jobs))
                  .values(poll_due_at=None, poll_lease_expires_at=w.clock.now))
    return jobs


def test_past_the_budget_dead_chains_go_to_the_batch_poller(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    w = World(db, simulator, tmp_path, poll_mode="batch")
    jobs = _dead_chains(w, 30)  # more than one page of the tick
    stale = w.platform_row()  # a legacy row to fail: fanned out as before
    w.clock.advance(minutes=11)  # past kie-standard's 10-minute threshold: POLL, resuming
    before = {j: (w.job(j).poll_generation, w.job(j).reconcile_attempts) for j in jobs}
    fanned: list[uuid.UUID] = []
    report = sweep(w.rt, budget=0.0, fan_out=fanned.append)
    assert fanned == [stale]
    assert (report.fanned_out, report.still_running, report.recovered) == (1, 31, 0)
    assert Counter(a.outcome for a in report.actions) == {"due": 30, "fanned_out": 1}
    for job_id in jobs:
        job = w.job(job_id)
        # not read by the tick (its upstream succeeded: a read would have completed it)
        assert job.status == "processing"
        assert job.poll_due_at is not None and job.poll_due_at.replace(tzinfo=None) \
            == w.clock.now.replace(tzinfo=None)
        # a new generation, due now; the poller's reads count the attempts, not the tick
        assert (job.poll_generation, job.poll_seq) == (before[job_id][0] + 1, 0)
        assert job.reconcile_attempts == before[job_id][1]
    claimed = 0
    while (run := batch.poll_due(w.rt, budget=60.0)).claimed:
        claimed += run.claimed
    assert claimed == 30
    assert all(w.job(j).status == "completed" for j in jobs)
    assert reconcile_job(w.rt, stale) == "failed"
    with db() as s:
        txns = Counter((t.job_id, t.type) for t in s.execute(select(CreditTransaction)).scalars())
    assert all((txns[(j, "COMMIT")], txns[(j, "REFUND")]) == (1, 0) for j in jobs)
    assert w.audit() == []


def test_a_second_tick_past_its_budget_makes_nothing_due_twice(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """A row made due is the poller's: the next tick neither resumes it again (a new
    generation would fence nothing but move the claim) nor fans it out."""
    w = World(db, simulator, tmp_path, poll_mode="batch")
    jobs = _dead_chains(w, 3)
    w.clock.advance(minutes=11)
    assert sweep(w.rt, budget=0.0, fan_out=lambda j: None).still_running == 3
    generations = {j: w.job(j).poll_generation for j in jobs}
    fanned: list[uuid.UUID] = []
    w.clock.advance(minutes=6)
    sweep(w.rt, budget=0.0, fan_out=fanned.append)
    assert fanned == []
    assert {j: w.job(j).poll_generation for j in jobs} == generations


def test_chain_mode_still_fans_dead_chains_out(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    w = World(db, simulator, tmp_path)  # chain mode
    jobs = [w.accept("kie-standard", Script(timeline=INSTANT)) for _ in range(3)]
    w.clock.advance(minutes=11)
    fanned: list[uuid.UUID] = []
    report = sweep(w.rt, budget=0.0, fan_out=fanned.append)
    assert sorted(fanned) == sorted(jobs) and report.fanned_out == 3
    assert all(w.job(j).poll_due_at is None for j in jobs)


def test_a_row_the_pages_statement_cannot_write_fails_alone(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """One statement makes a page due: a row it cannot write (here a generation at the
    column's limit; on a platform, its own trigger or check) sends that page's rows to the
    fan-out, as before the hand-over, and the other pages are still made due, with no error
    counted against the tick."""
    w = World(db, simulator, tmp_path, poll_mode="batch")
    jobs = _dead_chains(w, 60)  # three pages
    poisoned = jobs[30]
    with db.begin() as s:
        s.execute(update(Job).where(Job.id == poisoned).values(poll_generation=2**31 - 1))
    w.clock.advance(minutes=11)
    fanned: list[uuid.UUID] = []
    report = sweep(w.rt, budget=0.0, fan_out=fanned.append)
    assert poisoned in fanned and report.errors == 0
    due = [j for j in jobs if w.job(j).poll_due_at is not None]
    assert sorted(due + fanned) == sorted(jobs)  # every row went one way or the other
    assert len(due) >= 30 and len(fanned) <= 30  # only the poisoned row's page fanned out
