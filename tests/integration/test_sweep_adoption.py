"""Safe adoption (README, Design notes: Legacy rows): legacy rows bounded by the cutoff, age and job
types; observe by default; observe-only names; a truthful dry run; late outside completions."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, text, update
from sqlalchemy.orm import Session, sessionmaker

from reconcile import lifecycle
from reconcile.db.models import Job, ReconcileMeta
from reconcile.jobstore.adoption import SettingsError, default_legacy_age, legacy_cutoff
from reconcile.ledger import audit as library_audit
from reconcile.testing.simulator import Simulator
from tests.integration._sweep_helpers import World, assert_refunded, snapshot
from tests.integration.harness import ledger_backend as use_backend
from tests.integration.ledgers import Backend

DEFAULTS: dict[str, Any] = {"legacy_sweep": "observe", "legacy_cutoff": None, "legacy_age": None}


def defaults(db: sessionmaker[Session], sim: Simulator, tmp: Path, **settings: Any) -> World:
    """A world with the library's own defaults for the legacy sweep (observe, not enforce)."""
    return World(db, sim, tmp, **{**DEFAULTS, **settings})


def before_adoption(w: World, hours: float = 4, **columns: Any) -> uuid.UUID:
    """A kind-less platform row created ``hours`` ago (before this database's adoption time)."""
    at = w.clock.now - timedelta(hours=hours)
    return w.platform_row(created_at=at, started_at=at, **columns)


def test_the_default_legacy_age_is_the_longest_exhaustion_horizon() -> None:
    """kie-lip-sync: 75 min threshold + 18 attempts 5 minutes apart = 165 minutes."""
    assert default_legacy_age() == timedelta(minutes=165)


def test_the_migration_records_the_adoption_time(db: sessionmaker[Session], simulator: Simulator,
                                                 tmp_path: Path) -> None:
    """reconcile_meta holds one adoption time; the cutoff defaults to it."""
    w = defaults(db, simulator, tmp_path)
    with db() as s:
        recorded = s.execute(select(ReconcileMeta.adopted_at)).scalars().all()
    assert len(recorded) == 1 and recorded[0] <= datetime.now(UTC)
    assert legacy_cutoff(w.rt) == recorded[0]
    override = datetime(2026, 1, 1, tzinfo=UTC)
    assert legacy_cutoff(World(db, simulator, tmp_path, legacy_cutoff=override).rt) == override


def test_defaults_observe_a_stale_legacy_row_and_count_it(db: sessionmaker[Session],
                                                          simulator: Simulator,
                                                          tmp_path: Path) -> None:
    """LEGACY_SWEEP=observe (default): a stale pre-adoption row is counted as would-fail in
    the tick line; nothing is written."""
    w = defaults(db, simulator, tmp_path)
    stale = before_adoption(w, hours=4)
    before = snapshot(db)
    report = w.tick()
    assert snapshot(db) == before
    assert w.job(stale).status == "processing" and w.log_status(stale) == "reserved"
    assert (report.observed, report.observed_would_fail) == (1, 1)
    assert re.fullmatch(r"\[reconcile\] scanned=1 recovered=0 failed=0 stillRunning=1 errors=0 "
                        r"observed=1 would_fail=1 \(\d+ms\)", report.line()), report.line()


def test_rows_created_after_the_cutoff_are_never_touched(db: sessionmaker[Session],
                                                         simulator: Simulator,
                                                         tmp_path: Path) -> None:
    """A kind-less row inserted after adoption (a pipeline wrapper) is left in every mode,
    however old it gets."""
    for mode in ("observe", "enforce"):
        w = defaults(db, simulator, tmp_path, legacy_sweep=mode)
        wrapper = w.platform_row(job_type="pipeline")
        w.clock.advance(hours=30)
        report = w.tick()
        assert w.job(wrapper).status == "processing" and w.log_status(wrapper) == "reserved"
        assert report.actions == () and report.observed == 0


def test_enforce_fails_only_past_legacy_age(db: sessionmaker[Session], simulator: Simulator,
                                            tmp_path: Path) -> None:
    """Enforced with the default age: 160 minutes is left, 166 minutes fails + refunds."""
    w = defaults(db, simulator, tmp_path, legacy_sweep="enforce",
                 legacy_cutoff=datetime.now(UTC) + timedelta(minutes=1))
    row = w.platform_row(started_at=w.clock.now)
    w.clock.advance(minutes=160)
    w.tick()
    assert w.job(row).status == "processing"
    w.clock.advance(minutes=6)
    w.tick()
    assert_refunded(w, row)


def test_legacy_job_types_is_an_allow_list(db: sessionmaker[Session], simulator: Simulator,
                                           tmp_path: Path) -> None:
    """LEGACY_JOB_TYPES: only the listed job types are candidates; the exclude list still wins."""
    w = World(db, simulator, tmp_path, legacy_job_types=["image", "video"],
              legacy_exclude_job_types=["video"])
    image = w.platform_row(job_type="image")
    video = w.platform_row(job_type="video")
    wrapper = w.platform_row(job_type="pipeline")
    w.clock.advance(minutes=10)
    w.tick()
    assert_refunded(w, image)
    for left in (video, wrapper):
        assert w.job(left).status == "processing" and w.log_status(left) == "reserved"


def test_platform_plumbed_rows_are_swept_by_default(db: sessionmaker[Session],
                                                    simulator: Simulator, tmp_path: Path) -> None:
    """A known provider_kind with NULL submission_state (the platform's own plumbing) is no legacy
    row: with the defaults it is failed + refunded past its kind's threshold."""
    w = defaults(db, simulator, tmp_path)
    plumbed = w.platform_row(provider_kind="anthropic-sync", provider_call_started_at=w.clock.now)
    w.clock.advance(minutes=6)
    w.tick()
    assert_refunded(w, plumbed)


@pytest.mark.parametrize("names,kept", [(["legacy"], {"legacy"}),
                                         (["anthropic-sync"], {"plumbed"}),
                                         (["*"], {"legacy", "plumbed", "own"})])
def test_observe_only_names(db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
                            names: list[str], kept: set[str]) -> None:
    """OBSERVE_ONLY_KINDS: 'legacy' covers the kind-less rows, a kind its rows, '*' every row —
    even with the legacy sweep enforced."""
    w = World(db, simulator, tmp_path, observe_only_kinds=names)
    rows = {"legacy": w.platform_row(),
            "plumbed": w.platform_row(provider_kind="anthropic-sync",
                                      provider_call_started_at=w.clock.now),
            "own": w.submit("elevenlabs-sync")}
    w.clock.advance(minutes=10)
    w.tick()
    for name, job_id in rows.items():
        if name in kept:
            assert w.job(job_id).status in ("pending", "processing"), name
            assert w.log_status(job_id) == "reserved", name
        else:
            assert_refunded(w, job_id)


@pytest.mark.parametrize("bad", [[""], ["legacy-rows"], ["kie-standrad"]])
def test_an_unknown_observe_only_name_is_a_start_up_error(db: sessionmaker[Session],
                                                          simulator: Simulator, tmp_path: Path,
                                                          bad: list[str]) -> None:
    """A name that would protect nothing stops the runtime from being built."""
    with pytest.raises(SettingsError, match="unknown provider kinds"):
        World(db, simulator, tmp_path, observe_only_kinds=bad)


def test_dry_run_tells_what_the_tick_would_do(db: sessionmaker[Session], simulator: Simulator,
                                              tmp_path: Path) -> None:
    """DRY RUN counts the fails an enforcing tick would do; observed rows apart; nothing moves."""
    w = World(db, simulator, tmp_path, observe_only_kinds=["anthropic-sync"])
    legacy = [w.platform_row() for _ in range(3)]
    w.platform_row(provider_kind="anthropic-sync", provider_call_started_at=w.clock.now)
    w.clock.advance(minutes=10)
    before = snapshot(db)
    report = w.tick(dry_run=True)
    assert snapshot(db) == before
    assert re.fullmatch(r"\[reconcile\] DRY RUN scanned=4 would_recover=0 would_fail=3 "
                        r"would_settle=0 would_other=0 observed=1 observed_would_fail=1 "
                        r"errors=0 \(\d+ms\)", report.line()), report.line()
    assert {a.job_id for a in report.actions if a.outcome == "dry_run"} == set(legacy)
    real = w.tick()
    assert real.failed == 3


def _complete_outside(db: sessionmaker[Session], job_id: uuid.UUID) -> None:
    """The platform's old worker finishing the job: its own UPDATE, not the library's."""
    with db.begin() as s:
        s.execute(update(Job).where(Job.id == job_id).values(
            status="completed", output_data={"url": "https://cdn.example/v.mp4"},
            completed_at=datetime.now(UTC), progress=100))


def test_outside_completion_after_the_refund_is_an_anomaly(ledger_backend: Backend,
                                                           simulator: Simulator,
                                                           tmp_path: Path) -> None:
    """Enforced legacy fail + refund, then the old worker completes the job: one
    completed_after_refund anomaly (once), and the audit flags it, on either ledger backend."""
    with use_backend(ledger_backend):
        w = World(ledger_backend.db, simulator, tmp_path)
        job_id = w.platform_row()
        w.clock.advance(minutes=10)
        w.tick()
        assert w.job(job_id).status == "failed" and w.job(job_id).credits_actual == 0
        with ledger_backend.db() as s:
            assert library_audit(w.rt.ledger, s) == []
        _complete_outside(ledger_backend.db, job_id)
        first, second = w.tick(), w.tick()
        assert (first.late_completions, second.late_completions) == (1, 0)
        assert w.anomalies(job_id, "completed_after_refund") == ["completed_after_refund"]
        with ledger_backend.db() as s:
            flagged = [d for d in library_audit(w.rt.ledger, s) if d.job_id == job_id]
        assert [d.kind for d in flagged] == ["completed_after_refund"]


def test_the_library_still_refuses_its_own_completion_after_a_failure(world: World) -> None:
    """A result reaching the library after it failed the job is refused: no commit, no output."""
    job_id = world.platform_row()
    world.clock.advance(minutes=10)
    world.tick()
    assert lifecycle.finalize_job_with_media(world.rt, job_id, None, source="poll") is False
    assert world.job(job_id).status == "failed" and world.log_status(job_id) == "refunded"
    assert world.anomalies(job_id, "completed_after_refund") == []


def test_the_late_completion_query_uses_its_partial_index(world: World) -> None:
    """The late-completion phase reads only jobs_completed_after_failure_idx."""
    from reconcile.db.models import COMPLETED_AFTER_FAILURE

    stmt = select(Job).where(text(COMPLETED_AFTER_FAILURE)).order_by(Job.id).limit(100)
    # a history of ordinary completions beside a few late ones, as on a live platform: the
    # operator lists' jobs_completed_at_idx (every completion) must not be the cheaper plan
    with world.db.begin() as s:
        s.execute(text(
            "INSERT INTO jobs (id, user_id, job_type, status, created_at, completed_at, error_code) "
            "SELECT gen_random_uuid(), :u, 'image', 'completed', now(), now(), "
            "CASE WHEN n % 500 = 0 THEN 'UPSTREAM_FAILED' END FROM generate_series(1, 3000) n"),
            {"u": world.user})
        s.execute(text("ANALYZE jobs"))
    with world.db() as s:
        conn = s.connection()
        conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
        compiled = stmt.compile(dialect=conn.dialect)
        plan = conn.exec_driver_sql("EXPLAIN " + str(compiled), compiled.params).all()
    assert "jobs_completed_after_failure_idx" in "\n".join(r[0] for r in plan)


@pytest.fixture
def world(db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> World:
    return World(db, simulator, tmp_path)

