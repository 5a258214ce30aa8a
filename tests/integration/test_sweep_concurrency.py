"""Overlapping sweeps, the time budget's fan-out, and the per-job entry point."""

from __future__ import annotations

import itertools
import logging
import threading
import uuid
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from reconcile.db.models import Asset, CreditTransaction, Job, JobEvent
from reconcile.sweep import SweepReport, reconcile_job, sweep
from reconcile.testing.simulator import Script, Simulator
from tests.integration._sweep_helpers import (
    FOREVER,
    INSTANT,
    SEED_PHASE_2,
    World,
    assert_refunded,
    snapshot,
)


@pytest.fixture
def world(db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> World:
    return World(db, simulator, tmp_path)


def test_two_overlapping_sweeps_handle_every_job_exactly_once(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """Two sweeps started together (two threads, two runtimes, their own sessions) over 500
    stale jobs: each job is finalized or refunded once — one COMMIT or one REFUND per job,
    one asset and one completion event per recovered job, a clean ledger audit."""
    w = World(db, simulator, tmp_path)
    users = [uuid.uuid4() for _ in range(5)]
    from tests.integration.harness import fund, make_runtime

    for user in users:
        fund(db, user, 100_000)
    succeed = [w.accept("kie-standard", Script(timeline=INSTANT), user=users[n % len(users)])
               for n in range(150)]
    fail_upstream = [w.accept("kie-standard", Script(timeline=((0.0, "failed"),)),
                              user=users[n % len(users)]) for n in range(50)]
    sync = [w.submit("anthropic-sync", user=users[n % len(users)]) for n in range(150)]
    for user in users:
        sync += w.platform_rows(30, user=user)  # legacy rows (enforced: fail + refund)
    w.clock.advance(minutes=11)
    other, _ = make_runtime(db, simulator, tmp_path, clock=w.clock, **SEED_PHASE_2)
    start = threading.Barrier(2)
    reports: list[SweepReport] = []

    def run(rt: object) -> None:
        start.wait()
        reports.append(sweep(rt))  # type: ignore[arg-type]

    threads = [threading.Thread(target=run, args=(rt,)) for rt in (w.rt, other)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(reports) == 2
    assert len(succeed) + len(fail_upstream) + len(sync) == 500
    assert sum(r.recovered for r in reports) == 150
    assert sum(r.failed for r in reports) == 350
    assert sum(r.errors for r in reports) == 0
    assert all(r.recovered + r.failed > 0 for r in reports)  # they really overlapped
    with db() as s:
        statuses = Counter(s.execute(select(Job.status)).scalars())
        txns = Counter((t.job_id, t.type) for t in s.execute(select(CreditTransaction)).scalars())
        assets = Counter(s.execute(select(Asset.job_id)).scalars())
        completions = Counter(s.execute(
            select(JobEvent.job_id).where(JobEvent.type == "completed")).scalars())
    assert statuses == {"completed": 150, "failed": 350}
    for job_id in succeed:
        assert (txns[(job_id, "COMMIT")], txns[(job_id, "REFUND")]) == (1, 0)
        assert assets[job_id] == 1 and completions[job_id] == 1
    for job_id in fail_upstream + sync:
        assert (txns[(job_id, "REFUND")], txns[(job_id, "COMMIT")]) == (1, 0)
    assert w.audit() == []
    assert all(simulator.creates(str(j)) == 1 for j in succeed + fail_upstream)


def test_past_the_budget_rows_are_fanned_out_and_counted_still_running(world: World) -> None:
    """Past the time budget the rest of the actionable rows go to ``fan_out`` untouched (no
    fixed row cap: the first batch was handled inline); the per-job task then handles them."""
    stale = [world.platform_row() for _ in range(30)]
    world.clock.advance(minutes=6)
    healthy = world.accept("kie-standard", Script(timeline=FOREVER))
    ticks = itertools.chain([0.0, 0.0], itertools.repeat(10.0))  # over budget after one batch
    fanned: list[uuid.UUID] = []
    report = sweep(world.rt, budget=1.0, fan_out=fanned.append, timer=lambda: next(ticks))
    assert len(fanned) == 5 and healthy not in fanned
    assert (report.failed, report.fanned_out) == (25, 5)
    assert report.still_running == 5 + 1  # the fanned-out rows and the healthy job
    assert all(world.job(j).status == "processing" for j in fanned)
    assert sorted(fanned + [j for j in stale if world.job(j).status == "failed"]) == sorted(stale)
    assert [reconcile_job(world.rt, j) for j in fanned] == ["failed"] * 5
    for job_id in stale:
        assert_refunded(world, job_id)


def test_without_fan_out_a_tick_keeps_going_inline(world: World) -> None:
    """With no ``fan_out``, an exhausted budget does not stop the tick: every row is handled."""
    for _ in range(30):
        world.platform_row()
    world.clock.advance(minutes=6)
    report = sweep(world.rt, budget=0.0)
    assert (report.failed, report.fanned_out, report.still_running) == (30, 0, 0)


def test_reconcile_job_applies_the_table_and_logs_its_outcome(
        world: World, caplog: pytest.LogCaptureFixture) -> None:
    """The per-job entry point handles one row, logs ``reconcile_job_outcome`` with its id, and
    leaves a row another sweep holds (``busy``) instead of waiting for it."""
    job_id = world.accept("kie-standard", Script(timeline=INSTANT))
    world.clock.advance(minutes=11)
    with world.db.begin() as s:  # another sweep holds the row lock
        s.execute(select(Job).where(Job.id == job_id).with_for_update()).scalar_one()
        assert reconcile_job(world.rt, job_id) == "busy"
    with caplog.at_level(logging.INFO, logger="reconcile.sweep"):
        assert reconcile_job(world.rt, job_id) == "completed"
    assert f"reconcile_job_outcome job_id={job_id} action=poll outcome=completed" in caplog.text
    assert reconcile_job(world.rt, job_id) == "left"
    assert reconcile_job(world.rt, uuid.uuid4()) == "missing"


def test_reconcile_job_dry_run_changes_nothing(world: World) -> None:
    """``reconcile_job(dry_run=True)`` reports what it would do and writes nothing."""
    job_id = world.platform_row()
    world.clock.advance(minutes=6)
    before = snapshot(world.db)
    assert reconcile_job(world.rt, job_id, dry_run=True) == "dry_run"
    assert snapshot(world.db) == before


def test_sqlite_overlapping_sweeps_serialise_on_begin_immediate(
        simulator: Simulator, tmp_path: Path) -> None:
    """On the embedded SQLite default (plain select, ``BEGIN IMMEDIATE`` serialises the deciding
    transactions) two overlapping sweeps still settle every job once."""
    from reconcile.db.migrate import upgrade
    from reconcile.db.session import make_engine, make_sessionmaker
    from tests.integration.harness import make_runtime

    url = f"sqlite:///{tmp_path}/reconcile.db"
    upgrade(url)
    db = make_sessionmaker(make_engine(url))
    w = World(db, simulator, tmp_path)
    stale = [w.platform_row() for _ in range(40)] + [w.submit("anthropic-sync") for _ in range(20)]
    recovered = [w.accept("kie-standard", Script(timeline=INSTANT)) for _ in range(10)]
    w.clock.advance(minutes=11)
    other, _ = make_runtime(db, simulator, tmp_path, clock=w.clock, **SEED_PHASE_2)
    start = threading.Barrier(2)
    reports: list[SweepReport] = []

    def run(rt: object) -> None:
        start.wait()
        reports.append(sweep(rt))  # type: ignore[arg-type]

    threads = [threading.Thread(target=run, args=(rt,)) for rt in (w.rt, other)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert (sum(r.failed for r in reports), sum(r.recovered for r in reports)) == (60, 10)
    assert sum(r.errors for r in reports) == 0
    for job_id in stale:
        assert_refunded(w, job_id)
    assert all(w.job(j).status == "completed" for j in recovered)
