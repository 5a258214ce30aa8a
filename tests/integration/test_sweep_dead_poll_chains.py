"""The sweep on accepted jobs whose poll chain is late or dead (PostgreSQL, an injected
clock): past the threshold one attempt is counted and the chain resumed; a chain whose lease
expired is resumed under a new generation (the old one fenced), one that never took a turn gets
its first turn sent again; the lease is two intervals plus slack; a healthy chain is left.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

from reconcile import lifecycle, states
from reconcile.testing.simulator import Script
from tests.integration._sweep_helpers import FOREVER, World, world as world

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
