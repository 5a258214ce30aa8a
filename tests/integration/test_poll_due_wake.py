"""Batch polling's wake: a ``poll_due`` run finds when the next row it could claim falls due
before the next beat tick (``lifecycle.batch.wake_in``), on PostgreSQL and the embedded SQLite
default; and on a real prefork worker with Redis, the wake a tick sends reads a row that fell
due after the tick, with no other tick and no fallback nudge."""

from __future__ import annotations

import re
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from reconcile.lifecycle import batch as batch_poll
from reconcile.testing.simulator import Script, Simulator
from reconcile.worker import installed
from tests.integration._sweep_helpers import World
from tests.integration.test_worker_crash import _env
from tests.integration.test_worker_poll_due_helper import (  # noqa: F401 - fixtures
    FAILS,
    KIND,
    _received,
    sender,
    world,
)
from tests.integration.workers import Worker, wait_for

RUNNING = ((0.0, "queued"), (3600.0, "succeeded"))


def _due_in(w: World, job_id: uuid.UUID, seconds: float) -> None:
    w.set(job_id, poll_due_at=w.clock.now + timedelta(seconds=seconds))


def test_wake_in_is_the_next_due_time_before_the_tick_or_none(
        pg_and_sqlite: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """Every = 2 s (the gap 0.5 s): a row due 1.2 s ahead wakes in 1.2 s; one due 0.1 s ahead
    (or already due) wakes one gap ahead; nothing before the tick, a claimed row (its due time
    moved one lease ahead) and a finished row wake nothing; a gap that reaches the tick
    neither."""
    w = World(pg_and_sqlite, simulator, tmp_path, poll_mode="batch", poll_batch_interval=2.0)
    job = w.accept(KIND, Script(timeline=RUNNING))
    until = w.clock.now + timedelta(seconds=2)

    _due_in(w, job, 1.2)
    assert batch_poll.wake_in(w.rt, until) == pytest.approx(1.2)
    _due_in(w, job, 0.1)
    assert batch_poll.wake_in(w.rt, until) == pytest.approx(0.5)
    _due_in(w, job, -3.0)  # due already: it fell due while the run read its batch
    assert batch_poll.wake_in(w.rt, until) == pytest.approx(0.5)
    _due_in(w, job, 2.5)  # the next tick claims it
    assert batch_poll.wake_in(w.rt, until) is None
    _due_in(w, job, 0.1)
    assert batch_poll.wake_in(w.rt, w.clock.now + timedelta(seconds=0.4)) is None

    _due_in(w, job, -1.0)
    assert [c.job.id for c in batch_poll.claim(w.rt)] == [job]  # due one lease ahead now
    assert batch_poll.wake_in(w.rt, until) is None

    other = w.accept(KIND, Script(timeline=FAILS))
    _due_in(w, other, 1.0)
    w.set(other, status="failed")
    assert batch_poll.wake_in(w.rt, until) is None


def test_wake_in_skips_kinds_this_process_cannot_read(
        pg_and_sqlite: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """A row of a kind no registry here knows never wakes this process (it could not claim
    it: the claim takes only its own kinds)."""
    w = World(pg_and_sqlite, simulator, tmp_path, poll_mode="batch", poll_batch_interval=2.0)
    job = w.accept(KIND, Script(timeline=RUNNING))
    _due_in(w, job, 1.0)
    w.set(job, provider_kind="nobody-knows-this")
    assert batch_poll.wake_in(w.rt, w.clock.now + timedelta(seconds=2)) is None


def _nudges(worker: Worker) -> int:
    return len(re.findall(r"poll_due_nudged", worker.log_path.read_text()))


def test_real_worker_a_tick_wakes_for_a_row_due_after_it(
        world: World, pg_url: str, simulator: Simulator, tmp_path: Path, redis_url: str,  # noqa: F811 - the fixtures
        sender: object) -> None:  # noqa: F811
    """Ticks every 8 s (160 s at the tests' time scale of 0.05; no beat runs: one tick sent by
    hand), so the fallback ticker nudges only for a row due for more than 16 s, and a wake
    comes at least 2 s after its run. A row due 1.5 s after the tick is read by the wake the
    tick's run sent: two ``poll_due`` received (the tick, its wake), no nudge, the row read."""
    w = world
    env = _env(pg_url, redis_url, simulator, tmp_path, RECONCILE_POLL_MODE="batch",
               RECONCILE_POLL_BATCH_INTERVAL="160", RECONCILE_POLL_BATCH_TIME_BUDGET="1000")
    worker = Worker(env, tmp_path / "w.log", concurrency=2)
    try:
        worker.wait_ready()
        job = w.accept(KIND, Script(timeline=FAILS))
        w.set(job, poll_due_at=text("now() + interval '1.5 seconds'"))
        installed.send("reconcile.poll_due", [])  # the tick
        log = worker.log_path
        assert wait_for(lambda: w.job(job).status == "failed", 12), log.read_text()[-3000:]
        assert _received(worker) == 2, log.read_text()[-3000:]
        assert _nudges(worker) == 0, log.read_text()[-3000:]
        time.sleep(2.5)  # the wake's run found nothing more due: it sent no wake of its own
        assert _received(worker) == 2, log.read_text()[-3000:]
    finally:
        worker.stop()
