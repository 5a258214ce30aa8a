"""What every sweep tick guarantees, and its switches (PostgreSQL, an injected clock):
settled terminal jobs are never touched; a second tick changes nothing; refunds return to the
pools they came from; a dry run writes nothing; observe-only kinds are only logged; the tick logs
its exact line; one raising row never blocks the others; the candidate queries use the partial
indexes; a platform's old failed row is never refunded.
"""

from __future__ import annotations

import logging
import re
import uuid
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from reconcile.db.models import CreditTransaction, UsageLog
from reconcile.testing.simulator import Script, Simulator
from tests.integration._sweep_helpers import (
    FOREVER,
    INSTANT,
    World,
    assert_refunded,
    on_platform_ledger,
    snapshot,
    uncertain_kie,
    world as world,
)
from tests.integration.harness import fund

# ----------------------------------------------------------------------------- Phase 2 plan, switches


def test_completed_and_cancelled_jobs_are_left_alone(world: World) -> None:
    """Terminal, settled jobs are not touched by any tick, however old."""
    done = world.platform_row(status="completed", credits_actual=40)
    gone = world.platform_row(status="cancelled", credits_actual=0)
    with world.db.begin() as s:
        world.rt.ledger.commit(s, done, now=world.clock.now)
        world.rt.ledger.refund(s, gone, now=world.clock.now)
    world.clock.advance(hours=5)
    before = snapshot(world.db)
    report = world.tick()
    assert snapshot(world.db) == before and report.scanned == 0


def test_two_ticks_give_the_same_final_state(world: World) -> None:
    """Idempotency: a second tick at the same time changes nothing the first one settled."""
    world.platform_row()
    world.platform_row(provider_kind="anthropic-sync", provider_call_started_at=world.clock.now)
    world.submit("kie-llm")
    world.clock.advance(minutes=10)
    first = world.tick()
    after_first = snapshot(world.db)
    second = world.tick()
    assert snapshot(world.db) == after_first
    assert (first.failed, second.failed, second.scanned) == (3, 0, 0)
    assert world.audit() == []


def test_refunds_return_to_the_pools_they_came_from(world: World) -> None:
    """A refund lands in sub/topup as the reservation's from_sub/from_topup recorded."""
    user = uuid.uuid4()
    fund(world.db, user, 30, "sub")
    fund(world.db, user, 100, "topup")
    job_id = world.platform_row(50, user=user)
    with world.db() as s:
        meta = s.execute(select(UsageLog.metadata_).where(UsageLog.job_id == job_id)).scalar_one()
    assert meta == {"from_sub": 30, "from_topup": 20} and world.pools(user) == (0, 80)
    world.clock.advance(minutes=6)
    world.tick()
    assert_refunded(world, job_id)
    assert world.pools(user) == (30, 100)
    if not on_platform_ledger():  # the built-in ledger also records the split on its REFUND row
        with world.db() as s:
            txn = s.get(CreditTransaction, f"job-refund:{job_id}")
            assert (txn.from_sub, txn.from_topup) == (30, 20)


def _stale_mix(w: World) -> list[uuid.UUID]:
    ids = [w.platform_row(), w.submit("anthropic-sync"), w.submit("kie-standard"),
           w.accept("kie-standard", Script(timeline=INSTANT)), uncertain_kie(w)]
    w.clock.advance(minutes=30)
    return ids


def test_dry_run_changes_nothing(world: World) -> None:
    """dry_run: every decision is logged and reported, nothing is written or enqueued."""
    _stale_mix(world)
    before, calls = snapshot(world.db), (world.q.create_calls, world.q.poll_calls)
    report = world.tick(dry_run=True)
    assert snapshot(world.db) == before
    assert (world.q.create_calls, world.q.poll_calls) == calls
    assert sorted(a.action for a in report.actions) == [
        "evidence", "fail", "fail", "poll", "reenqueue"]
    assert {a.outcome for a in report.actions} == {"dry_run"}
    assert (report.recovered, report.failed) == (0, 0)


def test_observe_only_kinds_are_left_untouched(db: sessionmaker[Session], simulator: Simulator,
                                               tmp_path: Path) -> None:
    """observe_only_kinds: rows of that kind are only logged; other kinds are still handled."""
    w = World(db, simulator, tmp_path, observe_only_kinds=["anthropic-sync"])
    watched = w.submit("anthropic-sync")
    handled = w.submit("elevenlabs-sync")
    w.clock.advance(minutes=10)
    before = w.job(watched)
    report = w.tick()
    after = w.job(watched)
    assert (after.status, after.error_code) == (before.status, None)
    assert w.log_status(watched) == "reserved"
    assert_refunded(w, handled)
    assert {(a.job_id, a.outcome) for a in report.actions} == {
        (watched, "observe_only"), (handled, "failed")}


def test_tick_logs_the_exact_line(world: World, caplog: pytest.LogCaptureFixture) -> None:
    """The tick logs exactly ``[reconcile] scanned=N recovered=M failed=K stillRunning=J
    errors=E (Xms)`` on the reconcile.sweep logger."""
    world.platform_row()
    world.accept("kie-standard", Script(timeline=INSTANT))
    world.accept("kie-standard", Script(timeline=FOREVER))
    world.clock.advance(minutes=11)
    with caplog.at_level(logging.INFO, logger="reconcile.sweep"):
        report = world.tick()
    assert (report.scanned, report.recovered, report.failed, report.still_running,
            report.errors) == (3, 1, 1, 1, 0)
    line = report.line()
    assert re.fullmatch(r"\[reconcile\] scanned=3 recovered=1 failed=1 stillRunning=1 "
                        r"errors=0 \(\d+ms\)", line), line
    assert line == f"[reconcile] scanned=3 recovered=1 failed=1 stillRunning=1 errors=0 ({report.elapsed_ms}ms)"
    assert [r.getMessage() for r in caplog.records
            if r.name == "reconcile.sweep" and r.getMessage().startswith("[reconcile]")] == [line]


def test_one_bad_row_never_blocks_the_others(world: World) -> None:
    """A row whose action raises is counted as an error with its id; the rest are handled."""
    bad = world.submit("kie-standard")
    good = world.submit("anthropic-sync")
    odd = world.platform_row(provider_kind="", started_at=None)

    def enqueue_create(job_id: uuid.UUID, countdown: float = 0.0) -> None:
        raise RuntimeError("broker down")

    world.rt.enqueue_create = enqueue_create
    world.clock.advance(minutes=10)
    report = world.tick()
    assert report.errors == 1
    assert [a.job_id for a in report.actions if a.outcome == "error"] == [bad]
    assert_refunded(world, good)
    assert world.job(odd).status == "failed"  # an empty kind string is an unknown kind (row 2)


@pytest.mark.parametrize(("phase", "indexes"), [
    ("started", ("jobs_inflight_keyset_idx",)),  # the only in-flight index since 0022
    ("unsettled", ("jobs_unsettled_idx",))])
def test_candidate_queries_use_the_partial_indexes(world: World, phase: str,
                                                   indexes: tuple[str, ...]) -> None:
    """The candidate queries can use the partial indexes (their cost never grows with history;
    since 0022 the keyset index is the started phase's only in-flight index)."""
    from reconcile.sweep import _phases

    query = dict(_phases(world.clock.now))[phase]
    stmt = query(None).limit(25).with_for_update(skip_locked=True)
    with world.db() as s:
        conn = s.connection()
        conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
        compiled = stmt.compile(dialect=conn.dialect)
        plan = conn.exec_driver_sql("EXPLAIN " + str(compiled), compiled.params).all()
    text = "\n".join(r[0] for r in plan)
    assert any(index in text for index in indexes), text


def test_historical_failures_without_evidence_are_not_refunded(world: World) -> None:
    """A platform's old failed row still holding a reservation (no next_poll_at: the library
    never failed it) is not refunded by the sweep — no evidence, no automatic refund."""
    job_id = world.platform_row(status="failed")
    world.clock.advance(days=3)
    report = world.tick()
    assert world.log_status(job_id) == "reserved" and world.job(job_id).credits_actual is None
    assert report.scanned == 0
