"""The reconcile sweep, row by row of its decision table, on PostgreSQL with an injected clock.

Also the sync sweep, legacy rows, idempotency and refund pools, and the
sweep's switches (legacy on/off and exclusions, observe-only, dry run, the tick line). The
helpers here are shared by the other ``test_sweep_*`` files.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select, text, update
from sqlalchemy.orm import Session, sessionmaker

from reconcile import jobstore, lifecycle, states
from reconcile.db.models import (
    CreditAnomaly,
    CreditBalance,
    CreditTransaction,
    Job,
    JobEvent,
    UsageLog,
    WebhookDelivery,
)
from reconcile.sweep import SweepReport, sweep
from reconcile.testing.simulator import Script, Simulator
from tests.integration import harness
from tests.integration.harness import Clock, fund, make_runtime
from tests.integration.ledgers import BACKENDS, assert_builtin_ledger_untouched, make_backend

INSTANT = ((0.0, "queued"), (0.0, "succeeded"))
FOREVER = ((0.0, "queued"), (1.0, "running"), (10.0**6, "succeeded"))
MODELS = {
    "kie-standard": "seedream/4.5-edit", "kie-veo": "veo3_fast", "kie-lip-sync": "kling/lip-sync",
    "replicate-prediction": "acme/upscaler:v1", "elevenlabs-async": "dubbing",
    "anthropic-sync": "claude-sonnet-4-5", "kie-llm": "gpt-5", "elevenlabs-sync": "tts:voice",
}
# the legacy sweep as first specified: legacy rows enforced, every row here created before the
# cutoff, 5 minutes of age (the library's defaults are observe / adoption time / 165 min)
SEED_PHASE_2: dict[str, Any] = {
    "legacy_sweep": "enforce", "legacy_cutoff": datetime(2999, 1, 1, tzinfo=UTC),
    "legacy_age": timedelta(minutes=5),
}
INPUTS: dict[str, dict[str, Any]] = {
    "elevenlabs-async": {"source_url": "https://example.com/a.mp4", "target_lang": "es"},
}


class World:
    """A runtime on the test database, the simulator, a settable clock and a funded user."""

    def __init__(self, db: sessionmaker[Session], sim: Simulator, tmp: Path, **settings: Any):
        self.db, self.sim, self.clock = db, sim, Clock()
        self.rt, self.q = make_runtime(db, sim, tmp, clock=self.clock,
                                       **{**SEED_PHASE_2, **settings})
        self.user = uuid.uuid4()
        fund(db, self.user, 100_000)

    def submit(self, kind: str, credits_: int = 40, *, job_type: str = "image",
               user: uuid.UUID | None = None, **kw: Any) -> uuid.UUID:
        model = kw.pop("model", MODELS.get(kind, "m/x"))
        return lifecycle.submit_job(self.rt, user or self.user, kind, model,
                                    kw.pop("input", INPUTS.get(kind, {"prompt": "cat"})),
                                    credits_, job_type=job_type, enqueue=False, **kw).job_id

    def accept(self, kind: str, script: Script | None = None, **kw: Any) -> uuid.UUID:
        """Submit and create upstream (the id saved, accepted); the poll chain is then lost."""
        job_id = self.submit(kind, **kw)
        if script is not None:
            self.sim.script(str(job_id), script)
        outcome = lifecycle.create_step(self.rt, job_id)
        assert outcome.action == "accepted", outcome
        self.lose_messages()
        return job_id

    def lose_messages(self) -> None:
        self.q.creates.clear()
        self.q.polls.clear()

    def platform_row(self, credits_: int = 40, *, user: uuid.UUID | None = None,
                     **columns: Any) -> uuid.UUID:
        """A row the library never submitted (``submission_state`` NULL) with a reservation."""
        return self.platform_rows(1, credits_, user=user, **columns)[0]

    def platform_rows(self, count: int, credits_: int = 40, *, user: uuid.UUID | None = None,
                      **columns: Any) -> list[uuid.UUID]:
        ids: list[uuid.UUID] = []
        with self.db.begin() as s:
            for _ in range(count):
                values: dict[str, Any] = dict(id=uuid.uuid4(), user_id=user or self.user,
                                              job_type="image", status="processing",
                                              created_at=self.clock.now)
                values.update(columns)
                s.add(Job(**values))
                s.flush()
                self.rt.ledger.reserve(s, values["user_id"], values["id"], credits_,
                                       now=self.clock.now)
                ids.append(values["id"])
        return ids

    def tick(self, **kw: Any) -> SweepReport:
        return sweep(self.rt, **kw)

    def job(self, job_id: uuid.UUID) -> Job:
        with self.db() as s:
            job = s.get(Job, job_id)
            assert job is not None
            return job

    def set(self, job_id: uuid.UUID, **values: Any) -> None:
        with self.db.begin() as s:
            s.execute(update(Job).where(Job.id == job_id).values(**values))

    def log_status(self, job_id: uuid.UUID) -> str:
        with self.db() as s:
            return s.execute(select(UsageLog.status).where(UsageLog.job_id == job_id)).scalar_one()

    def refunds(self, job_id: uuid.UUID) -> int:
        current = harness.backend()
        if current is not None:
            return current.refund_count(job_id)
        with self.db() as s:
            return s.execute(select(func.count()).select_from(CreditTransaction).where(
                CreditTransaction.job_id == job_id, CreditTransaction.type == "REFUND")).scalar_one()

    def anomalies(self, job_id: uuid.UUID, kind: str | None = None) -> list[str]:
        with self.db() as s:
            stmt = select(CreditAnomaly.kind).where(CreditAnomaly.job_id == job_id)
            if kind is not None:
                stmt = stmt.where(CreditAnomaly.kind == kind)
            return list(s.execute(stmt).scalars())

    def audit(self) -> list[Any]:
        with self.db() as s:
            return harness.audit(s, now=self.clock.now)

    def pools(self, user: uuid.UUID) -> tuple[int, int]:
        """(sub, topup) of the user's balance in whichever ledger backend runs."""
        current = harness.backend()
        if current is not None:
            return current.balance(user)
        with self.db() as s:
            row = s.get(CreditBalance, user)
            return (0, 0) if row is None else (row.sub, row.topup)

    def task_id(self, job_id: uuid.UUID) -> str:
        task_id = self.job(job_id).provider_task_id
        assert task_id
        return task_id


@pytest.fixture(params=BACKENDS)
def world(request: pytest.FixtureRequest, db: sessionmaker[Session], simulator: Simulator,
          tmp_path: Path) -> Iterator[World]:
    """A world on each ledger backend in turn (built-in; platform user_credits)."""
    with harness.ledger_backend(make_backend(request.param, db)):
        yield World(db, simulator, tmp_path)
    if request.param == "platform":  # the sweep reached credits only through the seam
        assert_builtin_ledger_untouched(db)


def assert_refunded(w: World, job_id: uuid.UUID, code: str = "RECONCILE_NO_RECOVERY") -> Job:
    job = w.job(job_id)
    assert (job.status, job.error_code) == ("failed", code), (job.error_code, job.error_message)
    assert job.credits_actual == 0 and job.next_poll_at is None
    assert w.log_status(job_id) == "refunded" and w.refunds(job_id) == 1
    assert w.audit() == []
    return job


def _platform() -> bool:
    current = harness.backend()
    return current is not None and current.name == "platform"


def snapshot(db: sessionmaker[Session]) -> dict[str, Any]:
    """Every row the sweep could touch, as plain values."""
    def rows(s: Session, model: Any, key: Any) -> list[tuple[Any, ...]]:
        cols = [c for c in model.__table__.columns]
        return [tuple(r) for r in s.execute(select(*cols).order_by(key))]

    with db() as s:
        return {
            "jobs": rows(s, Job, Job.id), "logs": rows(s, UsageLog, UsageLog.id),
            "txns": rows(s, CreditTransaction, CreditTransaction.id),
            "balances": rows(s, CreditBalance, CreditBalance.user_id),
            "user_credits": [tuple(r) for r in s.execute(
                text("SELECT * FROM user_credits ORDER BY user_id"))] if _platform() else [],
            "anomalies": rows(s, CreditAnomaly, CreditAnomaly.id),
            "events": rows(s, JobEvent, JobEvent.id),
        }


# ----------------------------------------------------------------------------- row 1: legacy


def test_legacy_row_past_five_minutes_is_failed_and_refunded(world: World) -> None:
    """Row 1: a row with neither submission state nor kind, started 6 min ago, fails + refunds."""
    old = world.platform_row(started_at=world.clock.now - timedelta(minutes=6))
    young = world.platform_row(status="pending")
    report = world.tick()
    job = assert_refunded(world, old)
    assert job.error_message == "reconcile_no_recovery"
    assert world.job(young).status == "pending" and world.log_status(young) == "reserved"
    assert (report.failed, report.still_running) == (1, 1)


def test_legacy_row_ages_by_created_at_without_started_at(world: World) -> None:
    """Row 1 ages a row with no started_at by created_at (not by provider columns, which a legacy row lacks)."""
    job_id = world.platform_row(status="pending")
    world.clock.advance(minutes=4)
    world.tick()
    assert world.job(job_id).status == "pending"
    world.clock.advance(minutes=2)
    world.tick()
    assert_refunded(world, job_id)


def test_excluded_job_types_are_not_swept(db: sessionmaker[Session], simulator: Simulator,
                                          tmp_path: Path) -> None:
    """LEGACY_EXCLUDE_JOB_TYPES: a stale legacy pipeline wrapper is left, others are swept."""
    w = World(db, simulator, tmp_path, legacy_exclude_job_types=["pipeline"])
    wrapper = w.platform_row(job_type="pipeline")
    plain = w.platform_row(job_type="image")
    w.clock.advance(minutes=10)
    w.tick()
    assert w.job(wrapper).status == "processing" and w.log_status(wrapper) == "reserved"
    assert_refunded(w, plain)


def test_legacy_sweep_off_leaves_legacy_rows(db: sessionmaker[Session], simulator: Simulator,
                                             tmp_path: Path) -> None:
    """LEGACY_SWEEP off: stale legacy rows stay in flight; the library's own rows are swept."""
    w = World(db, simulator, tmp_path, legacy_sweep=False)
    legacy = w.platform_row()
    own = w.submit("anthropic-sync")
    w.clock.advance(minutes=10)
    w.tick()
    assert w.job(legacy).status == "processing" and w.log_status(legacy) == "reserved"
    assert_refunded(w, own)


# ----------------------------------------------------------------------------- rows 1-3: unknown kinds


def test_unknown_kind_platform_row_follows_the_legacy_rules(world: World) -> None:
    """Rows 1-2: a platform row of an unregistered kind without a task id is decided as a legacy
    row (enforce here, with a 5-minute legacy age): one anomaly while it is too young, then failed
    + refunded (tests/integration/test_unknown_kind_rows.py: the other bounds)."""
    job_id = world.platform_row(provider_kind="acme-video",
                                provider_call_started_at=world.clock.now)
    world.clock.advance(minutes=4)
    world.tick()
    assert world.job(job_id).status == "processing"
    assert world.anomalies(job_id) == ["unknown_provider_kind"]
    world.clock.advance(minutes=2)
    world.tick()
    assert_refunded(world, job_id)


@pytest.mark.parametrize("columns", [{"provider_task_id": "t-1"},
                                     {"submission_state": "accepted", "provider_task_id": "t-1"},
                                     {"submission_state": "accepted"}])
def test_unknown_kind_with_upstream_state_gets_one_anomaly(world: World,
                                                           columns: dict[str, Any]) -> None:
    """Row 3: an unknown kind with a task id or a submission state: one anomaly, row untouched
    (even enforced and 3 hours old)."""
    job_id = world.platform_row(provider_kind="acme-video", **columns)
    world.clock.advance(hours=3)
    first = world.tick()
    world.clock.advance(minutes=10)
    world.tick()
    job = world.job(job_id)
    assert job.status == "processing" and world.log_status(job_id) == "reserved"
    assert world.anomalies(job_id) == ["unknown_provider_kind"]
    assert [(a.row, a.outcome) for a in first.actions] == [("unknown_kind", "anomaly")]


# ----------------------------------------------------------------------------- rows 4-5: platform rows


def test_anthropic_sync_processing_past_five_minutes_fails_after_one_tick(world: World) -> None:
    """Row 4 (a platform-plumbed sync row): anthropic-sync, processing, no task id, > 5 min: failed + refunded."""
    job_id = world.platform_row(provider_kind="anthropic-sync",
                                provider_call_started_at=world.clock.now)
    world.clock.advance(minutes=5, seconds=1)
    report = world.tick()
    assert_refunded(world, job_id)
    assert (report.scanned, report.failed, report.errors) == (1, 1, 0)


def test_platform_row_of_async_kind_without_task_id_uses_its_threshold(world: World) -> None:
    """Row 4: a platform kie-standard row with no task id is swept only past its 10 min."""
    job_id = world.platform_row(provider_kind="kie-standard",
                                provider_call_started_at=world.clock.now)
    world.clock.advance(minutes=9)
    world.tick()
    assert world.job(job_id).status == "processing"
    world.clock.advance(minutes=2)
    world.tick()
    assert_refunded(world, job_id)


def test_kie_llm_pending_already_refunded_fails_without_a_second_refund(world: World) -> None:
    """A platform-plumbed kie-llm row pending > 5 min whose credits were already refunded: failed, once."""
    job_id = world.platform_row(status="pending", provider_kind="kie-llm",
                                provider_call_started_at=world.clock.now)
    with world.db.begin() as s:
        world.rt.ledger.refund(s, job_id, now=world.clock.now)
    balance = world.pools(world.user)
    world.clock.advance(minutes=6)
    world.tick()
    assert_refunded(world, job_id)
    assert world.pools(world.user) == balance


def test_platform_row_with_task_id_is_polled_only_past_its_threshold(world: World) -> None:
    """Row 5: a platform row with a task id and a NULL lease is left before the threshold (no
    chain started), then treated as accepted: polled, finalized, credits committed."""
    world.sim.script_default(Script(timeline=INSTANT))
    client = world.rt.client(world.rt.kind("kie-standard"))
    from reconcile.providers import CreateRequest

    job_id = uuid.uuid4()
    created = client.create(CreateRequest(model="m/x", input={"prompt": "p"}, job_id=str(job_id),
                                          webhook_url=world.rt.webhook_url("kie", job_id)))
    world.platform_row(id=job_id, provider_kind="kie-standard", provider_task_id=created.task_id,
                       provider_call_started_at=world.clock.now)
    world.clock.advance(minutes=9)
    world.tick()
    job = world.job(job_id)
    assert job.status == "processing" and job.poll_generation == 0 and not world.q.polls
    world.clock.advance(minutes=2)
    report = world.tick()
    job = world.job(job_id)
    assert job.status == "completed" and job.credits_actual == 40
    assert report.recovered == 1 and world.audit() == []


# ----------------------------------------------------------------------------- rows 6-7: not started


def test_not_started_async_is_reenqueued_then_failed_after_five(world: World) -> None:
    """Row 6: a lost create message is re-enqueued every 2 min (not sooner); after 5 re-enqueues
    the job fails + refunds through a CAS from not_started."""
    job_id = world.submit("kie-standard")
    world.clock.advance(minutes=1)
    world.tick()
    assert world.q.create_calls == 0
    for n in range(1, 6):
        world.clock.advance(minutes=2)
        world.tick()
        world.tick()  # a second tick at the same time does not re-enqueue again
        job = world.job(job_id)
        assert (world.q.create_calls, job.create_enqueue_count) == (n, n)
        assert job.create_enqueued_at == world.clock.now
    world.clock.advance(minutes=2)
    world.tick()
    job = assert_refunded(world, job_id)
    assert job.submission_state == "not_started" and world.q.create_calls == 5
    assert world.sim.creates(str(job_id)) == 0


def test_not_started_async_waits_for_its_not_before_time(world: World) -> None:
    """Row 6: a rate-limited create waiting for its not-before time is not re-enqueued early."""
    job_id = world.submit("kie-standard")
    world.set(job_id, create_not_before=world.clock.now + timedelta(minutes=10))
    world.clock.advance(minutes=5)
    world.tick()
    assert world.q.create_calls == 0
    world.clock.advance(minutes=6)
    world.tick()
    assert list(world.q.creates) == [job_id]


def test_reenqueued_create_runs_once_upstream(world: World) -> None:
    """Row 6: the re-enqueued create claims, creates once and is accepted."""
    world.sim.script_default(Script(timeline=FOREVER))
    job_id = world.submit("kie-standard")
    world.clock.advance(minutes=3)
    world.tick()
    assert lifecycle.create_step(world.rt, world.q.creates.popleft()).action == "accepted"
    assert world.sim.creates(str(job_id)) == 1 and world.job(job_id).status == "processing"


def test_not_started_sync_past_threshold_fails(world: World) -> None:
    """Row 7: a sync-kind job whose request died before calling fails + refunds past 5 min."""
    job_id = world.submit("elevenlabs-sync")
    world.clock.advance(minutes=4)
    world.tick()
    assert world.job(job_id).status == "pending" and world.q.create_calls == 0
    world.clock.advance(minutes=2)
    world.tick()
    assert_refunded(world, job_id)


def test_a_failing_row_stores_the_code_its_decision_carries(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """The executor writes the decision's ``code`` (default ``RECONCILE_NO_RECOVERY``): a new
    failing row of the table names its own code in the table only, nothing in the executor."""
    from dataclasses import replace

    from reconcile.errors import ErrorCode
    from reconcile.sweep import claims, table

    real = table.decide

    def with_code(*args: Any, **kwargs: Any) -> table.Decision:
        decision = real(*args, **kwargs)
        if decision.action is table.Action.FAIL:
            return replace(decision, code=ErrorCode.UPSTREAM_TIMEOUT)
        return decision

    monkeypatch.setattr(claims.table, "decide", with_code)
    job_id = world.submit("elevenlabs-sync")
    world.clock.advance(minutes=6)
    world.tick()
    job = assert_refunded(world, job_id, code="UPSTREAM_TIMEOUT")
    assert job.error_message == "upstream_timeout"
    from reconcile.db.models import JobEvent

    with world.db() as s:
        failed = s.execute(select(JobEvent.payload).where(JobEvent.job_id == job_id,
                                                       JobEvent.type == "failed")).scalars().all()
    assert [d.get("code") for d in failed] == ["UPSTREAM_TIMEOUT"]


# ----------------------------------------------------------------------------- rows 8-9: submitting


def _claim(w: World, job_id: uuid.UUID, lease: timedelta) -> None:
    with w.db.begin() as s:
        assert jobstore.claim_create(s, job_id, "tok", w.clock.now, lease) is not None


def test_submitting_with_a_live_claim_is_left(world: World) -> None:
    """Row 8: a create in progress (claim lease alive) is not touched, however old the job."""
    job_id = world.submit("kie-standard")
    world.clock.advance(hours=2)
    _claim(world, job_id, timedelta(minutes=2))
    world.clock.advance(minutes=1)
    report = world.tick()
    assert world.job(job_id).submission_state == "submitting" and report.actions == ()


def test_submitting_async_with_expired_claim_becomes_uncertain(world: World) -> None:
    """Row 9: an async create whose lease expired becomes uncertain, reservation kept."""
    job_id = world.submit("kie-standard")
    _claim(world, job_id, timedelta(minutes=2))
    world.clock.advance(minutes=3)
    world.tick()
    job = world.job(job_id)
    assert (job.status, job.submission_state) == ("pending", "uncertain")
    assert job.error_code == "UPSTREAM_SUBMISSION_UNCERTAIN"
    assert world.log_status(job_id) == "reserved" and world.refunds(job_id) == 0


def test_submitting_sync_with_expired_claim_fails_past_threshold(world: World) -> None:
    """Row 9 (no recovery possible for a sync call): a sync call's dead process fails + refunds past its threshold only."""
    job_id = world.submit("anthropic-sync")
    _claim(world, job_id, timedelta(minutes=1))
    world.clock.advance(minutes=3)
    world.tick()
    assert world.job(job_id).submission_state == "submitting"
    world.clock.advance(minutes=3)
    world.tick()
    assert_refunded(world, job_id)


# ----------------------------------------------------------------------------- rows 10-11: accepted


def test_accepted_past_threshold_counts_one_attempt_and_resumes_the_chain(world: World) -> None:
    """Row 10: past its threshold a running job is polled once (attempt +1) and its dead chain
    resumed — here a chain whose first message was lost, so its first turn is sent again
    (same generation: no step of it ever ran); an immediate second tick neither counts nor
    resumes again."""
    job_id = world.accept("kie-standard", Script(timeline=FOREVER))
    generation = world.job(job_id).poll_generation
    world.clock.advance(minutes=10)
    report = world.tick()
    job = world.job(job_id)
    assert (job.reconcile_attempts, job.poll_generation) == (1, generation)
    assert list(world.q.polls) == [(job_id, generation, 0)]
    assert [(a.row, a.action, a.outcome) for a in report.actions] == [("accepted", "poll", "in_flight")]
    world.tick()
    assert world.job(job_id).reconcile_attempts == 1 and len(world.q.polls) == 1


def _one_turn(world: World, job_id: uuid.UUID) -> int:
    """The chain's first turn runs (the task still running) and its next message is lost:
    a chain that polled, then died. Returns its generation."""
    generation = world.job(job_id).poll_generation
    assert lifecycle.poll_step(world.rt, job_id, generation, 0) == "in_flight"
    assert world.job(job_id).poll_seq == 1
    world.lose_messages()
    return generation


def test_accepted_with_expired_lease_is_resumed_before_threshold(world: World) -> None:
    """Row 11: a dead poll chain (it polled, then died) is resumed at once under a new
    generation, no attempt counted; the old chain's next turn is fenced."""
    job_id = world.accept("kie-standard", Script(timeline=FOREVER))
    generation = _one_turn(world, job_id)
    world.clock.advance(minutes=5)  # past the lease (2 × 5 s + 15 s)
    world.tick()
    job = world.job(job_id)
    assert (job.reconcile_attempts, job.poll_generation) == (0, generation + 1)
    assert list(world.q.polls) == [(job_id, generation + 1, 0)]
    assert lifecycle.poll_step(world.rt, job_id, generation, 1) == "fenced"  # the old chain


def test_a_chain_that_never_took_a_turn_gets_its_first_turn_sent_again(world: World) -> None:
    """Row 11 on a generation whose first message is late or lost (no step of it ran): the
    resume keeps the generation, renews the lease and sends the first turn again. Whichever copy
    runs first takes the turn and the other is fenced — a late original is not thrown away
    (a new generation fenced it, and on a queue slower than the lease every resumed chain's
    message arrived fenced: the chaos run's livelock)."""
    job_id = world.accept("kie-standard", Script(timeline=FOREVER))
    generation = world.job(job_id).poll_generation
    world.clock.advance(minutes=5)
    world.tick()
    job = world.job(job_id)
    assert (job.reconcile_attempts, job.poll_generation, job.poll_seq) == (0, generation, 0)
    assert job.poll_lease_expires_at > world.clock.now  # renewed
    assert list(world.q.polls) == [(job_id, generation, 0)]
    world.clock.advance(minutes=5)  # the re-sent copy is late too: sent once more
    world.tick()
    assert list(world.q.polls) == [(job_id, generation, 0)] * 2
    assert world.job(job_id).poll_generation == generation
    # the original, arriving last of all, still takes the first turn; every copy after it loses
    assert lifecycle.poll_step(world.rt, job_id, generation, 0) == "in_flight"
    assert lifecycle.poll_step(world.rt, job_id, generation, 0) == "fenced"
    assert lifecycle.poll_step(world.rt, job_id, generation, 0) == "fenced"
    assert world.job(job_id).poll_seq == 1


def test_poll_lease_is_two_intervals_plus_slack_not_the_read_deadline(world: World) -> None:
    """Issue 16 (replaces issue 18's "the lease outlasts the slowest poll step", whose 255-s
    lease made a dead chain wait ≈ 4.5 min at a 30 s sweep): the lease is 2 × interval +
    POLL_LEASE_SLACK. Inside it the sweep leaves the chain; one second past it the chain is
    resumed under a new generation, even though a status read could still be running within its
    total deadline — and that slow chain is fenced at its next turn."""
    job_id = world.accept("kie-standard", Script(timeline=FOREVER))
    generation = _one_turn(world, job_id)
    kind = world.rt.kind("kie-standard")
    assert kind is not None
    lease = lifecycle.poll_lease(world.rt, kind)
    assert lease == world.rt.settings.scaled(2 * timedelta(seconds=5) + states.POLL_LEASE_SLACK)
    assert lease < lifecycle.poll_step_deadline(world.rt.settings)  # the trade, stated
    world.clock.advance(seconds=lease.total_seconds() - 1)
    report = world.tick()
    assert world.job(job_id).poll_generation == generation
    assert report.actions == () and report.still_running == 1
    world.clock.advance(seconds=2)
    world.tick()
    assert world.job(job_id).poll_generation == generation + 1
    assert list(world.q.polls)[-1] == (job_id, generation + 1, 0)
    assert lifecycle.poll_step(world.rt, job_id, generation, 1) == "fenced"  # the slow chain


def test_accepted_with_live_lease_before_threshold_is_left(world: World) -> None:
    """Rows 10-11: a healthy job (chain alive, below threshold) is only looked at."""
    job_id = world.accept("kie-standard", Script(timeline=FOREVER))
    before = world.job(job_id)
    report = world.tick()
    after = world.job(job_id)
    assert (after.poll_generation, after.reconcile_attempts) == (before.poll_generation, 0)
    assert report.actions == () and report.still_running == 1


# ----------------------------------------------------------------------------- row 12: uncertain


def test_uncertain_replicate_is_adopted_from_the_listing(world: World) -> None:
    """Row 12: a create accepted upstream but dropped is found in Replicate's listing by its
    planted job id after 5 min, adopted and resumed — never created twice."""
    job_id = world.submit("replicate-prediction")
    world.sim.script(str(job_id), Script(timeline=FOREVER, create="drop_after_accept"))
    assert lifecycle.create_step(world.rt, job_id).action == "uncertain"
    world.tick()
    assert world.job(job_id).submission_state == "uncertain"  # evidence check not due yet
    world.clock.advance(minutes=5)
    report = world.tick()
    job = world.job(job_id)
    assert (job.status, job.submission_state) == ("processing", "accepted")
    assert job.provider_task_id == world.sim.tasks_for(str(job_id))[0].task_id
    assert job.reconcile_attempts == 0 and world.q.polls[-1][0] == job_id
    assert [a.outcome for a in report.actions] == ["adopted"]
    assert world.sim.creates(str(job_id)) == 1


def _uncertain_kie(w: World) -> uuid.UUID:
    job_id = w.submit("kie-standard")
    w.sim.script(str(job_id), Script(timeline=FOREVER, create="drop_after_accept"))
    assert lifecycle.create_step(w.rt, job_id).action == "uncertain"
    return job_id


def _delivery(w: World, job_id: uuid.UUID, upstream_id: str) -> None:
    with w.db.begin() as s:
        s.add(WebhookDelivery(provider="kie", delivery_id=uuid.uuid4().hex, upstream_id=upstream_id,
                              job_id=job_id, received_at=w.clock.now, payload_digest="d"))


def test_uncertain_kie_adopts_a_webhook_id_only_when_record_info_echoes_the_job(world: World) -> None:
    """Row 12 (KIE, unsigned body): a delivery naming another job's task is not adopted; one
    whose recordInfo echoes this job's planted id is."""
    job_id = _uncertain_kie(world)
    other = world.accept("kie-standard", Script(timeline=FOREVER))
    _delivery(world, job_id, world.task_id(other))
    world.clock.advance(minutes=5)
    world.tick()
    job = world.job(job_id)
    assert job.submission_state == "uncertain" and job.reconcile_attempts == 1
    _delivery(world, job_id, world.sim.tasks_for(str(job_id))[0].task_id)
    world.clock.advance(minutes=5)
    world.tick()
    job = world.job(job_id)
    assert job.submission_state == "accepted"
    assert job.provider_task_id == world.sim.tasks_for(str(job_id))[0].task_id


def test_uncertain_without_evidence_gets_one_anomaly_and_keeps_its_reservation(world: World) -> None:
    """Row 12: no evidence after 18 checks (5 min apart): one uncertain_unresolved anomaly; the
    job stays uncertain and reserved — never refunded, never resubmitted."""
    job_id = _uncertain_kie(world)
    for _ in range(17):
        world.clock.advance(minutes=5)
        world.tick()
        world.tick()  # not due again at the same time
    assert world.job(job_id).reconcile_attempts == 17 and world.anomalies(job_id) == []
    for _ in range(3):
        world.clock.advance(minutes=5)
        world.tick()
    job = world.job(job_id)
    assert (job.status, job.submission_state, job.reconcile_attempts) == ("pending", "uncertain", 20)
    assert world.anomalies(job_id) == ["uncertain_unresolved"]
    assert world.log_status(job_id) == "reserved" and world.refunds(job_id) == 0
    assert world.sim.creates(str(job_id)) == 1 and world.q.create_calls == 0


# ----------------------------------------------------------------------------- rows 13-14


def test_unsettled_failure_is_settled_when_due(world: World) -> None:
    """Row 13: a failure persisted without its refund (a crash) is refunded once, when due —
    after a 30 s grace that leaves a live settler (its writer) to finish first."""
    job_id = world.submit("kie-standard")
    with world.db.begin() as s:
        jobstore.mark_failed(s, job_id, now=world.clock.now, code="UPSTREAM_FAILED",
                             message="boom", detail=None)
    world.clock.advance(seconds=20)
    world.tick()
    assert world.job(job_id).credits_actual is None
    world.clock.advance(seconds=11)
    report = world.tick()
    assert_refunded(world, job_id, "UPSTREAM_FAILED")
    assert [(a.row, a.outcome) for a in report.actions] == [("unsettled", "settled")]
    world.tick()
    assert world.refunds(job_id) == 1


def test_backed_off_settlement_waits_for_its_retry_time(world: World) -> None:
    """Row 13: a settlement backed off to a later ``next_poll_at`` is not retried before it."""
    job_id = world.submit("kie-standard")
    with world.db.begin() as s:
        jobstore.mark_failed(s, job_id, now=world.clock.now, code="UPSTREAM_FAILED",
                             message="boom", detail=None)
        jobstore.settle_failed(s, job_id, world.clock.now + timedelta(minutes=10))
    world.clock.advance(minutes=5)
    world.tick()
    assert world.job(job_id).credits_actual is None and world.log_status(job_id) == "reserved"
    world.clock.advance(minutes=6)
    world.tick()
    assert_refunded(world, job_id, "UPSTREAM_FAILED")


def test_events_unpublished_for_30_seconds_are_published_again(world: World) -> None:
    """Row 14: an outbox event left unpublished > 30 s is republished; a fresh one is not."""
    job_id = world.submit("kie-standard")
    with world.db.begin() as s:  # as if the publisher was down after the commit
        s.execute(update(JobEvent).values(published_at=None))
        stale = s.execute(select(JobEvent.event_id)).scalar_one()
    seen: list[str] = []
    world.rt.event_hooks.append(lambda message: seen.append(message["event_id"]))
    world.clock.advance(seconds=20)
    world.tick()
    assert seen == []
    world.clock.advance(seconds=11)
    world.tick()
    assert seen == [stale]
    with world.db() as s:
        assert s.execute(select(JobEvent.published_at)).scalar_one() is not None
    assert world.job(job_id).status == "pending"


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
    if not _platform():  # the built-in ledger also records the split on its REFUND row
        with world.db() as s:
            txn = s.get(CreditTransaction, f"job-refund:{job_id}")
            assert (txn.from_sub, txn.from_topup) == (30, 20)


def _stale_mix(w: World) -> list[uuid.UUID]:
    ids = [w.platform_row(), w.submit("anthropic-sync"), w.submit("kie-standard"),
           w.accept("kie-standard", Script(timeline=INSTANT)), _uncertain_kie(w)]
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
