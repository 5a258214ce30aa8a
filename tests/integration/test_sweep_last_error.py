"""Issue 11 hole 11: the sweep's attempt claim keeps ``reconcile_last_error``, and an error that
is no verdict (a failed read) never erases an upstream one, so exhaustion fails the job with the
last upstream error's code (not found, expired media…), not ``UPSTREAM_TIMEOUT``."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from reconcile.states import MAX_ATTEMPTS
from reconcile.testing.simulator import Script, Simulator
from tests.integration._sweep_helpers import World, assert_refunded
from tests.integration.harness import drain

VANISHED = Script(timeline=((0.0, "queued"), (0.0, "vanished")))
EXPIRED = Script(timeline=((0.0, "queued"), (0.0, "succeeded")), media_ttl=0.0)


@pytest.fixture
def world(db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> World:
    return World(db, simulator, tmp_path)


def run_to_exhaustion(w: World, job_id: uuid.UUID, chain: str, *,
                      flaky_last_read: bool = False) -> None:
    """From the kind's threshold, one sweep tick every 5 minutes (the poll chain alive or
    dead) until the job leaves flight; ``flaky_last_read``: the reads of the final attempt
    fail (HTTP 500)."""
    w.clock.advance(minutes=20)  # replicate-prediction's threshold
    for _ in range(MAX_ATTEMPTS + 2):
        if flaky_last_read and w.job(job_id).reconcile_attempts == MAX_ATTEMPTS - 1:
            w.sim.configure(read_fail_rate=1.0)
        if chain == "alive":
            drain(w.rt, w.q, max_steps=1)
        else:
            w.lose_messages()
        w.tick()
        if w.job(job_id).status != "processing":
            return
        w.clock.advance(minutes=5)


@pytest.mark.parametrize("chain", ["dead", "alive"])
def test_not_found_then_a_failed_read_at_the_last_attempt_fails_task_not_found(
        world: World, chain: str) -> None:
    """The task is gone upstream; the last attempt's read fails (a 500, no verdict). The
    sweep's claim must not wipe the not-found verdict, nor the failed read replace it."""
    w = world
    job_id = w.accept("replicate-prediction", VANISHED)
    run_to_exhaustion(w, job_id, chain, flaky_last_read=True)
    job = assert_refunded(w, job_id, "UPSTREAM_TASK_NOT_FOUND")
    assert job.error_detail["attempts"] == MAX_ATTEMPTS
    assert "read failed" not in (job.error_detail["last_error"] or "")


@pytest.mark.parametrize("chain", ["dead", "alive"])
def test_a_task_not_found_until_exhaustion_fails_task_not_found(world: World, chain: str) -> None:
    """Every observation says not found, through the sweep alone or with a live chain."""
    w = world
    job_id = w.accept("replicate-prediction", VANISHED)
    run_to_exhaustion(w, job_id, chain)
    assert assert_refunded(w, job_id, "UPSTREAM_TASK_NOT_FOUND").error_detail["attempts"] == MAX_ATTEMPTS


@pytest.mark.parametrize("chain", ["dead", "alive"])
def test_media_expired_until_exhaustion_fails_media_expired(world: World, chain: str) -> None:
    """The result URLs answer 403 on every fetch until exhaustion: UPSTREAM_MEDIA_EXPIRED."""
    w = world
    job_id = w.accept("replicate-prediction", EXPIRED)
    run_to_exhaustion(w, job_id, chain)
    assert_refunded(w, job_id, "UPSTREAM_MEDIA_EXPIRED")
