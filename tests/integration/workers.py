"""Real ``celery worker`` subprocesses for crash tests (killed by pid / process group)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from reconcile.celery_install import QUEUE, QUEUES, routes

ROOT = Path(__file__).resolve().parents[2]
CELERY = str(Path(sys.executable).parent / "celery")


class Worker:
    """``celery -A reconcile.celery_app worker`` in its own process group."""

    def __init__(self, env: Mapping[str, str], log_path: Path, *, concurrency: int = 1,
                 queues: str = ",".join(QUEUES)) -> None:
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [CELERY, "-A", "reconcile.celery_app", "worker", "--pool=prefork",
             f"--concurrency={concurrency}", "-Q", queues, "--without-gossip", "--without-mingle",
             "--without-heartbeat", "-l", "info", "-n", f"w{time.time_ns()}@%h"],
            cwd=ROOT, env={**os.environ, **env}, stdout=self._log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if b"ready." in self.log_path.read_bytes():
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited: {self.log_path.read_text()[-2000:]}")
            time.sleep(0.1)
        raise TimeoutError(f"worker not ready: {self.log_path.read_text()[-2000:]}")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill_group(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.kill_group()
        self._log.close()


def wait_for(predicate, timeout: float, interval: float = 0.2, tick=None) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if tick is not None:
            tick()
        if predicate():
            return True
        time.sleep(interval)
    return False


def make_sender(broker: str):  # type: ignore[no-untyped-def]
    """A bare Celery app that publishes to the library's queues (as the platform's web tier)."""
    from celery import Celery

    app = Celery(broker=broker)
    app.conf.task_default_queue = QUEUE
    app.conf.task_routes = routes()
    return app
