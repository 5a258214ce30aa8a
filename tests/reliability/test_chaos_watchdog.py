"""Issue 18: the chaos run's watchdog turns an unplanned worker exit, or a live worker that
stops consuming while messages wait, into an invariant violation (not a count)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from reconcile.testing import chaos
from reconcile.testing.chaos import control
from reconcile.testing.processes import ScratchRedis


class FakeWorker:
    """Stands in for a ``CeleryWorker``: a log file and a liveness answer."""

    def __init__(self, log_path: Path, *, alive: bool, receiving: bool) -> None:
        self.log_path, self.log_start = log_path, 0
        self._alive, self.receiving = alive, receiving
        log_path.write_bytes(b"")
        self.killed = False

    def alive(self) -> bool:
        if self.receiving:  # a healthy worker keeps logging received tasks
            with open(self.log_path, "ab") as fh:
                fh.write(b"[x: INFO/MainProcess] Task reconcile.poll[1] received\n")
        return self._alive and not self.killed

    def tail(self, size: int = 3000) -> str:
        return "AttributeError(\"'NoneType' object has no attribute 'hostname'\")"

    def kill_group(self) -> None:
        self.killed = True

    def stop(self) -> None:
        self.killed = True


@pytest.fixture
def scratch(tmp_path: Path) -> Any:
    server = ScratchRedis(log_path=tmp_path / "redis.log").start()
    yield server
    server.stop()


def _watch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, scratch: ScratchRedis,
           worker: FakeWorker, until: str) -> list[str]:
    state = control._Run(chaos.ChaosConfig(quiet=True, workers=1), chaos.make_plan(1, 10, workers=1),
                       tmp_path)
    state.workers[0] = worker  # type: ignore[assignment]
    replacements: list[FakeWorker] = []

    def spawn(_state: Any, index: int, _env: Any) -> FakeWorker:
        fresh = FakeWorker(tmp_path / f"w{len(replacements)}.log", alive=True, receiving=True)
        replacements.append(fresh)
        return fresh

    monkeypatch.setattr(control, "_spawn", spawn)
    monkeypatch.setattr(control, "STALL_SECONDS", 1.5)
    redis.Redis(port=scratch.port).rpush("reconcile", b"m1", b"m2", b"m3")
    thread = threading.Thread(target=control._watchdog, args=(state, {}, scratch), daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not any(until in v for v in state.live_violations):
        time.sleep(0.1)
    state.stop.set()
    thread.join(timeout=10)
    assert replacements, "the watchdog replaces the worker so the run can finish"
    return state.live_violations


def test_an_unplanned_exit_is_a_violation(monkeypatch, tmp_path, scratch) -> None:
    dead = FakeWorker(tmp_path / "dead.log", alive=False, receiving=False)
    violations = _watch(monkeypatch, tmp_path, scratch, dead, "unplanned_worker_exit")
    assert any(v.startswith("unplanned_worker_exit worker0") and "hostname" in v
               for v in violations), violations


def test_a_worker_that_stops_consuming_while_messages_wait_is_a_violation(
        monkeypatch, tmp_path, scratch) -> None:
    stalled = FakeWorker(tmp_path / "stalled.log", alive=True, receiving=False)
    violations = _watch(monkeypatch, tmp_path, scratch, stalled, "worker_stalled")
    assert any(v.startswith("worker_stalled worker0") and "3 messages waited" in v
               for v in violations), violations
    assert stalled.killed  # replaced, as a liveness probe would


def test_a_consuming_worker_is_no_violation(monkeypatch, tmp_path, scratch) -> None:
    healthy = FakeWorker(tmp_path / "ok.log", alive=True, receiving=True)
    state = control._Run(chaos.ChaosConfig(quiet=True, workers=1), chaos.make_plan(1, 10, workers=1),
                       tmp_path)
    state.workers[0] = healthy  # type: ignore[assignment]
    monkeypatch.setattr(control, "STALL_SECONDS", 1.0)
    redis.Redis(port=scratch.port).rpush("reconcile", b"m1")
    thread = threading.Thread(target=control._watchdog, args=(state, {}, scratch), daemon=True)
    thread.start()
    time.sleep(3.0)
    state.stop.set()
    thread.join(timeout=10)
    assert state.live_violations == [] and not healthy.killed
