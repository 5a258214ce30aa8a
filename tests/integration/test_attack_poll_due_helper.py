"""What the attack on batch polling's helper ``poll_due`` found: the helper was sent on the
run's own thread, between its first claim and the reads of the rows it claimed, so a broker
that accepts connections and never answers held those rows unread (the test failed on that
version). The send now runs on a thread of its own (``tasks._HelperSender``)."""

from __future__ import annotations

import socket
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from reconcile import tasks
from reconcile.db.models import Job
from reconcile.testing.simulator import Script, Simulator
from reconcile.worker import installed
from tests.integration._sweep_helpers import World
from tests.integration.workers import make_sender

KIND = "replicate-prediction"
INTERVAL = timedelta(seconds=3)  # replicate's poll interval
FAILS = ((0.0, "queued"), (0.0, "failed"))


@pytest.fixture
def world(db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> World:
    return World(db, simulator, tmp_path, poll_mode="batch", poll_batch_size=2,
                 poll_batch_threads=4)


def test_an_unresponsive_broker_holds_a_full_first_claim_unread(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """A broker that accepts connections but does not answer (a stalled Redis, a partition
    that drops packets): the helper's publish blocks, and it is made between the run's first
    claim and the reads of the rows claimed, so those rows wait unread for as long as the
    publish blocks (measured: > 200 s against a silent listener; nothing in the library bounds
    it short of the task's soft time limit, whose exception the helper's ``except Exception``
    then swallows). Before the change such a run read and wrote its rows (3 rows, batches of 2:
    full, short) and sent nothing at all."""
    w = world
    ids = [w.accept(KIND, Script(timeline=FAILS)) for _ in range(3)]
    w.clock.now += INTERVAL
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)  # the kernel completes the handshake; nobody ever answers
    app = make_sender(f"redis://127.0.0.1:{silent.getsockname()[1]}/11")
    app.finalize()
    monkeypatch.setattr(installed, "_app", app)
    tasks.set_runtime(w.rt)
    done = threading.Event()

    def run() -> None:
        try:
            tasks.poll_due.apply()
        finally:
            done.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def statuses() -> list[str]:
        with w.db() as s:
            return list(s.execute(select(Job.status).where(Job.id.in_(ids))).scalars())

    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and "processing" in statuses():
            time.sleep(0.2)
        unread = statuses().count("processing")
    finally:
        silent.close()  # the queued connections are reset: the publish fails, the run goes on
        done.wait(30)
        tasks.reset_runtime()
    assert unread == 0, f"{unread} claimed rows still unread after 10 s: the run is blocked " \
                        f"in the helper's publish"
