"""Batch polling's helper ``poll_due`` on a real prefork worker with Redis: the header reaches
the task (a marked run sends no helper, an unmarked one with a full first claim exactly one), a
helper not picked up within its expiry is dropped unrun, and a helper's run claims beside its
sender's on PostgreSQL and on the embedded SQLite default without losing or doubling a row."""

from __future__ import annotations

import re
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select, text, update
from sqlalchemy.orm import Session, sessionmaker

from reconcile import tasks
from reconcile.db.models import Job
from reconcile.testing.simulator import Script, Simulator
from reconcile.worker import installed
from tests.integration._sweep_helpers import World
from tests.integration.test_worker_crash import _env, _purge
from tests.integration.workers import Worker, make_sender, wait_for

KIND = "replicate-prediction"
FAILS = ((0.0, "queued"), (0.0, "failed"))
# a tick interval long enough that the worker's fallback ticker never nudges during a test
# (10 s at the time scale of 0.05: rows due for 20 s), yet shorter than a claim's lease
# (12.25 s), so that no run finds a claimed row falling due before its next tick and sends a
# wake; and a budget long enough that no run ends with ``more`` (no plain re-send to confuse
# counts)
QUIET = {"RECONCILE_POLL_MODE": "batch", "RECONCILE_POLL_BATCH_SIZE": "2",
         "RECONCILE_POLL_BATCH_INTERVAL": "200", "RECONCILE_POLL_BATCH_TIME_BUDGET": "1000"}


def _due_rows(w: World, n: int) -> list[uuid.UUID]:
    """``n`` accepted rows whose status read fails them at once, due now on the real clock."""
    ids = [w.accept(KIND, Script(timeline=FAILS)) for _ in range(n)]
    with w.db.begin() as s:
        s.execute(update(Job).where(Job.id.in_(ids))
                  .values(poll_due_at=text("now() - interval '1 second'")))
    return ids


def _unfinished(w: World, ids: list[uuid.UUID]) -> list[str]:
    with w.db() as s:
        return [st for st in s.execute(select(Job.status).where(Job.id.in_(ids))).scalars()
                if st not in ("failed", "completed")]


def _received(worker: Worker) -> int:
    return len(re.findall(r"Task reconcile\.poll_due\[[^\]]+\] received",
                          worker.log_path.read_text()))


@pytest.fixture
def world(db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> World:
    return World(db, simulator, tmp_path, poll_mode="batch")


@pytest.fixture
def sender(redis_url: str, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """The library's own ``send`` publishes to the test's Redis database."""
    _purge(redis_url)
    app = make_sender(redis_url)
    app.finalize()
    monkeypatch.setattr(installed, "_app", app)
    return app


def test_real_worker_a_helper_message_sends_no_helper_and_a_tick_sends_one(
        world: World, pg_url: str, simulator: Simulator, tmp_path: Path, redis_url: str,
        sender: object) -> None:
    """The header reaches a prefork worker's task: a marked message whose first claim is
    full sends nothing; an unmarked one with a full first claim sends exactly one helper."""
    w = world
    env = _env(pg_url, redis_url, simulator, tmp_path, **QUIET)
    worker = Worker(env, tmp_path / "w.log", concurrency=2)
    try:
        worker.wait_ready()
        ids = _due_rows(w, 6)
        tasks._send_helper(w.rt)  # marked, expiring in 1 s (the test's own tick settings)
        assert wait_for(lambda: not _unfinished(w, ids), 30), worker.log_path.read_text()[-3000:]
        time.sleep(1.5)
        assert _received(worker) == 1, worker.log_path.read_text()[-3000:]

        ids = _due_rows(w, 6)
        installed.send("reconcile.poll_due", [])  # a plain tick
        assert wait_for(lambda: not _unfinished(w, ids), 30), worker.log_path.read_text()[-3000:]
        time.sleep(1.5)
        assert _received(worker) == 3, worker.log_path.read_text()[-3000:]
    finally:
        worker.stop()


def test_real_worker_drops_a_helper_not_picked_up_within_its_expiry(
        world: World, pg_url: str, simulator: Simulator, tmp_path: Path, redis_url: str,
        sender: object) -> None:
    """A helper that waited past its expiry (1 s) is dropped unrun, not run late."""
    w = world
    ids = _due_rows(w, 4)
    tasks._send_helper(w.rt)
    time.sleep(2.5)
    env = _env(pg_url, redis_url, simulator, tmp_path, **QUIET)
    worker = Worker(env, tmp_path / "w.log", concurrency=2)
    try:
        worker.wait_ready()
        assert wait_for(lambda: _received(worker) >= 1, 15), worker.log_path.read_text()[-3000:]
        time.sleep(2.0)
        assert len(_unfinished(w, ids)) == 4, worker.log_path.read_text()[-3000:]
        with w.db() as s:
            assert all(seq == 0 for seq in s.execute(
                select(Job.poll_seq).where(Job.id.in_(ids))).scalars())
    finally:
        worker.stop()


def test_helper_run_beside_its_sender_shares_rows_on_postgresql_and_sqlite(
        pg_and_sqlite: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """On PostgreSQL and the embedded SQLite default: the helper's run (here: a second poll_due started in a
    thread the moment the helper is called) claims beside its sender; every row is read once
    per claim, none twice at once, none lost, and no 'database is locked' on SQLite."""
    import threading

    from reconcile.lifecycle import batch as batch_poll

    w = World(pg_and_sqlite, simulator, tmp_path, poll_mode="batch", poll_batch_threads=2)
    ids = [w.accept(KIND, Script(timeline=FAILS)) for _ in range(12)]
    w.clock.now += timedelta(seconds=3)
    reports: list[object] = []
    errors: list[BaseException] = []

    def second() -> None:
        try:
            reports.append(batch_poll.poll_due(w.rt, budget=60, limit=3))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads: list[threading.Thread] = []

    def helper() -> None:
        t = threading.Thread(target=second)
        threads.append(t)
        t.start()

    first = batch_poll.poll_due(w.rt, budget=60, limit=3, helper=helper)
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert len(threads) == 1
    total = first.claimed + sum(r.claimed for r in reports)  # type: ignore[attr-defined]
    assert total == 12 and not _unfinished(w, ids)
