"""The sweep recovers async jobs whose poll chain died (the per-provider async recovery).

Each job is accepted upstream (the simulator), its poll messages are lost, and the injected
clock moves past the kind's stale threshold; the sweep then reads the task once and finishes
the job through the lifecycle's CAS paths.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from reconcile.db.models import Asset, JobEvent
from reconcile.providers import PollResult
from reconcile.states import MAX_ATTEMPTS
from reconcile.testing.simulator import Script, Simulator
from tests.integration._sweep_helpers import FOREVER, INSTANT, World, assert_refunded


@pytest.fixture
def world(db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> World:
    return World(db, simulator, tmp_path)


def assert_recovered(w: World, job_id: uuid.UUID, outputs: int = 1, credits_: int = 40) -> None:
    job = w.job(job_id)
    assert job.status == "completed", (job.error_code, job.reconcile_last_error)
    assert job.credits_actual == credits_ and w.log_status(job_id) == "committed"
    with w.db() as s:
        assets = s.execute(select(Asset).where(Asset.job_id == job_id)).scalars().all()
        events = s.execute(select(JobEvent.type).where(JobEvent.job_id == job_id)).scalars().all()
    assert len(assets) == outputs and all(w.rt.storage.exists(a.storage_key) for a in assets)
    assert "completed" in events
    assert w.audit() == [] and w.sim.creates(str(job_id)) == 1


def test_kie_success_is_finalized(world: World) -> None:
    """KIE success: the sweep finds the row, stores the media, completes it, commits credits."""
    job_id = world.accept("kie-standard", Script(timeline=INSTANT, outputs=2))
    world.clock.advance(minutes=9)
    world.tick()
    assert world.job(job_id).status == "processing"  # below the threshold: chain resumed only
    world.lose_messages()
    world.clock.advance(minutes=2)
    report = world.tick()
    assert_recovered(world, job_id, outputs=2)
    assert report.recovered == 1 and report.line().startswith("[reconcile] scanned=1 recovered=1")
    assert not world.q.polls  # a finished job gets no new chain


def test_kie_failure_is_failed_and_refunded(world: World) -> None:
    """KIE fail: failed with UPSTREAM_FAILED (the provider's message kept) and refunded."""
    job_id = world.accept("kie-standard", Script(timeline=((0.0, "failed"),),
                                                 fail_message="content policy"))
    world.clock.advance(minutes=11)
    world.tick()
    job = assert_refunded(world, job_id, "UPSTREAM_FAILED")
    assert job.error_message == "content policy" and job.error_detail["via"] == "sweep"


def test_kie_generating_counts_one_attempt(world: World) -> None:
    """KIE generating: the row stays in flight and reconcile_attempts rises by exactly one."""
    job_id = world.accept("kie-standard", Script(timeline=FOREVER))
    world.clock.advance(minutes=11)
    world.tick()
    job = world.job(job_id)
    assert (job.status, job.reconcile_attempts, job.reconcile_last_error) == ("processing", 1, None)
    assert world.log_status(job_id) == "reserved"


def test_veo_success_flag_is_recovered(world: World) -> None:
    """Veo: record-info successFlag=1 past its 25 min threshold is recovered."""
    job_id = world.accept("kie-veo", Script(timeline=INSTANT), job_type="video")
    world.clock.advance(minutes=24)
    world.tick()
    assert world.job(job_id).status == "processing"
    world.clock.advance(minutes=2)
    world.tick()
    assert_recovered(world, job_id)


def test_replicate_prediction_is_recovered(world: World) -> None:
    """Replicate prediction: a succeeded prediction is recovered past its 20 min threshold."""
    job_id = world.accept("replicate-prediction", Script(timeline=INSTANT))
    world.clock.advance(minutes=21)
    world.tick()
    assert_recovered(world, job_id)


def test_replicate_training_runs_the_completion_hook_once(world: World) -> None:
    """Replicate training: recovery calls the platform's training-completed hook exactly once,
    inside the completion (the LoRA row of the old reconcileOrphanedTrainings cron)."""
    from reconcile import jobstore, lifecycle
    from reconcile.providers import CreateRequest

    calls: list[tuple[uuid.UUID, str | None]] = []

    def trained(session: Session, job: Any, result: PollResult | None) -> None:
        calls.append((job.id, result.raw_status if result else None))

    world.rt.completion_hooks["replicate-training"] = trained
    job_id = world.submit("replicate-training", model="acme/flux-lora:v1", job_type="lora")
    world.sim.script(str(job_id), Script(timeline=INSTANT))
    with world.db.begin() as s:
        jobstore.claim_create(s, job_id, "tok", world.clock.now, timedelta(minutes=2))
    client = world.rt.client(world.rt.kind("replicate-training"))
    created = client.create(CreateRequest(  # trainings need a destination (extra)
        model="acme/flux-lora:v1", input={"steps": 1}, job_id=str(job_id),
        webhook_url=world.rt.webhook_url("replicate", job_id),
        extra={"destination": "acme/my-lora"}))
    assert lifecycle.on_task_created(world.rt, job_id, "tok", created.task_id)
    world.lose_messages()
    world.clock.advance(minutes=31)
    world.tick()
    world.clock.advance(minutes=6)
    world.tick()
    assert calls == [(job_id, "succeeded")]
    assert_recovered(world, job_id)


def test_elevenlabs_dubbing_is_recovered(world: World) -> None:
    """ElevenLabs dubbing (voice clone answers in one request, so dubbing is the async job): a dubbed job is recovered."""
    job_id = world.accept("elevenlabs-async", Script(timeline=INSTANT), job_type="audio")
    world.clock.advance(minutes=16)
    world.tick()
    assert_recovered(world, job_id)


def test_attempt_eighteen_force_fails_with_refund_and_anomaly(world: World) -> None:
    """reconcile_attempts reaching 18: force-fail UPSTREAM_TIMEOUT + refund + anomaly."""
    job_id = world.accept("kie-standard", Script(timeline=FOREVER))
    world.set(job_id, reconcile_attempts=MAX_ATTEMPTS - 1)
    world.clock.advance(minutes=11)
    report = world.tick()
    job = assert_refunded(world, job_id, "UPSTREAM_TIMEOUT")
    assert job.error_detail["attempts"] == MAX_ATTEMPTS
    assert world.anomalies(job_id) == ["reconcile_exhausted"]
    assert report.failed == 1 and not world.q.polls


def test_expired_media_is_never_completed_and_fails_at_eighteen(world: World) -> None:
    """Upstream URL expiry: every attempt's fetch gets 403, attempts rise 5 min apart, and the
    18th fails UPSTREAM_MEDIA_EXPIRED with a refund and an anomaly — never completed."""
    job_id = world.accept("kie-standard", Script(timeline=INSTANT, media_ttl=0.0))
    world.clock.advance(minutes=10)
    for attempt in range(1, MAX_ATTEMPTS):
        world.tick()
        job = world.job(job_id)
        assert (job.status, job.reconcile_attempts) == ("processing", attempt)
        assert job.reconcile_last_error.startswith("UPSTREAM_MEDIA_EXPIRED")
        world.clock.advance(minutes=5)
    world.tick()
    assert_refunded(world, job_id, "UPSTREAM_MEDIA_EXPIRED")
    assert world.anomalies(job_id) == ["reconcile_exhausted"]
    with world.db() as s:
        assert s.execute(select(Asset).where(Asset.job_id == job_id)).first() is None


@pytest.mark.parametrize("chain", ["dead", "alive"])
def test_lip_sync_attempts_are_spaced_whatever_the_sweep_interval(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path, chain: str) -> None:
    """kie-lip-sync with ticks every 30 scaled seconds, its poll chain dead or alive: attempts
    stay ≥ 5 scaled minutes apart; a job that finishes upstream at 80 min completes, one still
    running is failed UPSTREAM_TIMEOUT + refunded only after 75 + 85 min, by 75 + 95 min."""
    from reconcile import lifecycle

    w = World(db, simulator, tmp_path, time_scale=0.01)
    scale = w.rt.settings.scaled
    slow = w.accept("kie-lip-sync", Script(timeline=FOREVER), job_type="video")
    stuck = w.accept("kie-lip-sync", Script(timeline=FOREVER), job_type="video")
    if chain == "alive":
        for job_id in (slow, stuck):
            assert lifecycle.resume_chain(w.rt, job_id)
    start = w.job(slow).provider_call_started_at
    attempts: dict[uuid.UUID, list[Any]] = {slow: [], stuck: []}
    while w.clock.now - start <= scale(timedelta(minutes=75 + 95)):
        if w.clock.now - start >= scale(timedelta(minutes=80)) and \
                w.sim.state_of(w.task_id(slow)) != "succeeded":
            w.sim.set_state(w.task_id(slow), "succeeded")
        w.tick()
        if chain == "dead":
            w.lose_messages()  # no worker runs the resumed chains: only the sweep observes
        else:  # a live chain: each queued poll runs once per tick, and reschedules itself
            for job_id, generation, seq in list(w.q.polls):
                w.q.polls.popleft()
                lifecycle.poll_step(w.rt, job_id, generation, seq)
        for job_id, seen in attempts.items():
            at = w.job(job_id).reconcile_last_attempt_at
            if at is not None and (not seen or seen[-1] != at):
                seen.append(at)
        if w.job(stuck).status == "processing":
            assert w.clock.now - start < scale(timedelta(minutes=75 + 85)) + scale(timedelta(seconds=30))
        w.clock.advance(seconds=30 * 0.01)
    assert_recovered(w, slow)
    done = w.job(slow).completed_at - start
    assert scale(timedelta(minutes=80)) <= done < scale(timedelta(minutes=81))
    failed = assert_refunded(w, stuck, "UPSTREAM_TIMEOUT")
    assert failed.completed_at - start >= scale(timedelta(minutes=75 + 85))
    assert w.anomalies(stuck) == ["reconcile_exhausted"]
    assert len(attempts[stuck]) == MAX_ATTEMPTS
    assert attempts[stuck][0] - start >= scale(timedelta(minutes=75))
    gaps = [b - a for a, b in zip(attempts[stuck], attempts[stuck][1:], strict=False)]
    assert min(gaps) >= scale(timedelta(minutes=5))
