"""Issue 18: real ``celery worker`` processes survive their broker.

* Redis: a scratch ``redis-server`` is SIGKILLed while the worker holds unacked countdown polls
  and restarted EMPTY. On Celery 5.7.0 the worker used to exit ("Unrecoverable error:
  AttributeError('NoneType' object has no attribute 'hostname')"); now it stays alive,
  reconnects, consumes again, and the sweep re-creates the lost messages from the database.
* RabbitMQ (vhost ``RECONCILE_TEST_RABBITMQ_VHOST``, default ``i18``): every connection of the
  vhost is closed while polls are held, and again while slow creates are running. With
  cancel-on-connection-loss off, no create is cut off after the provider accepted it: 0 jobs
  uncertain, exactly one create each.

Each asserts: the worker is alive (never restarted), every job completed, ≤ 1 create upstream
per job, nothing uncertain, the ledger audit clean.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from reconcile import Runtime, credits, lifecycle
from reconcile.celery_install import POLL_QUEUE, QUEUES
from reconcile.db.models import Job
from reconcile.sweep import sweep
from reconcile.testing.processes import (
    ROOT,
    CeleryWorker,
    ScratchRedis,
    celery_sender,
    close_rabbitmq_connections,
    enqueuers,
)
from reconcile.testing.simulator import Script, Simulator
from tests.integration.harness import fund, make_runtime
from tests.integration.workers import wait_for

pytestmark = pytest.mark.slow

TIME_SCALE = 0.05  # kie-standard: a poll countdown of 0.25 s, the create claim 6 s
# short HTTP timeouts keep the poll lease (which covers a poll step's total deadline) at ~6 s
TIMEOUTS = {"connect_timeout": 1.0, "read_timeout": 3.0}
VHOST = os.environ.get("RECONCILE_TEST_RABBITMQ_VHOST", "i18")
RUNNING = ((0.0, "queued"), (0.2, "running"), (14.0, "succeeded"))


def _env(pg_url: str, broker: str, sim: Simulator, tmp: Path,
         timeouts: dict[str, float]) -> dict[str, str]:
    return {
        **sim.env(),
        "RECONCILE_POLL_MODE": "chain",  # unacked countdown polls are what the broker loses
        "RECONCILE_DATABASE_URL": pg_url,
        "RECONCILE_BROKER_URL": broker,
        # max countdown + task time limit (20 + 30) stay below the visibility timeout
        "RECONCILE_BROKER_VISIBILITY_TIMEOUT": "60",
        "RECONCILE_MAX_COUNTDOWN": "20",
        "RECONCILE_TASK_TIME_LIMIT": "30",
        "RECONCILE_CONNECT_TIMEOUT": str(timeouts["connect_timeout"]),
        "RECONCILE_READ_TIMEOUT": str(timeouts["read_timeout"]),
        "RECONCILE_STORAGE_URL": f"file://{tmp / 'media'}",
        "RECONCILE_TIME_SCALE": str(TIME_SCALE),
        "RECONCILE_WEBHOOK_BASE_URL": "https://platform.example/hooks",
    }


class Rig:
    """One worker on ``broker``, a sender publishing there, and the test's runtime."""

    def __init__(self, db: sessionmaker[Session], pg_url: str, sim: Simulator, tmp: Path,
                 broker: str, concurrency: int, time_scale: float = TIME_SCALE,
                 timeouts: dict[str, float] = TIMEOUTS) -> None:
        self.db, self.sim = db, sim
        self.rt: Runtime
        self.rt, _ = make_runtime(db, sim, tmp, time_scale=time_scale, **timeouts)
        self.sender = celery_sender(broker)
        self.rt.enqueue_create, self.rt.enqueue_poll = _tolerant(enqueuers(self.sender))
        self.env = {**_env(pg_url, broker, sim, tmp, timeouts),
                    "RECONCILE_TIME_SCALE": str(time_scale)}
        self.worker = CeleryWorker(self.env, tmp / "worker.log",
                                   concurrency=concurrency, name="fault")
        self.worker.wait_ready(timeout=90)
        self.user = uuid.uuid4()
        fund(db, self.user, 10_000)

    def submit(self, n: int, script: Script) -> list[uuid.UUID]:
        ids = []
        for _ in range(n):
            job_id = uuid.uuid4()
            self.sim.script(str(job_id), script)
            lifecycle.submit_job(self.rt, self.user, "kie-standard", "seedream/4.5-edit",
                                 {"prompt": "a cat"}, 10, job_type="image", job_id=job_id)
            ids.append(job_id)
        return ids

    def jobs(self, ids: list[uuid.UUID]) -> list[Job]:
        with self.db() as s:
            return list(s.execute(select(Job).where(Job.id.in_(ids))).scalars())

    def log_offset(self) -> int:
        return self.worker.log_path.stat().st_size

    def received_since(self, offset: int) -> int:
        with open(self.worker.log_path, "rb") as fh:
            fh.seek(offset)
            return fh.read().count(b"] received")

    def finish(self, ids: list[uuid.UUID], timeout: float = 180.0) -> None:
        """Sweep (as beat would) until every job is terminal; then check the invariants."""
        def done() -> bool:
            return all(j.status == "completed" for j in self.jobs(ids))

        def tick() -> None:
            try:
                sweep(self.rt)
            except Exception:  # the broker may still be coming back
                pass

        assert wait_for(done, timeout=timeout, interval=0.5, tick=tick), [
            (j.status, j.submission_state, j.error_code) for j in self.jobs(ids)]
        assert self.worker.alive(), self.worker.tail()
        for job in self.jobs(ids):
            assert self.sim.creates(str(job.id)) == 1, job.id
            assert job.submission_state == "accepted" and job.credits_actual is not None
        with self.db() as s:
            assert credits.audit(s) == []

    def ping(self) -> subprocess.CompletedProcess[str]:
        """The recommended liveness probe (README, Operate workers): ``celery inspect ping``."""
        return subprocess.run(
            [sys.executable, "-m", "celery", "-A", "reconcile.celery_app", "inspect", "ping",
             "--timeout", "10"], env={**os.environ, **self.env}, cwd=ROOT,
            capture_output=True, text=True, timeout=120)

    def stop(self) -> None:
        self.worker.stop()


def _tolerant(pair: tuple[Callable[..., None], Callable[..., None]]) -> tuple[Any, Any]:
    """The test's own publishes may hit the broker while it is down: the sweep recovers."""
    def wrap(fn: Callable[..., None]) -> Callable[..., None]:
        def call(*args: Any, **kwargs: Any) -> None:
            try:
                fn(*args, **kwargs)
            except Exception:
                pass
        return call
    return wrap(pair[0]), wrap(pair[1])


@pytest.fixture
def scratch_redis(tmp_path: Path) -> Iterator[ScratchRedis]:
    server = ScratchRedis(log_path=tmp_path / "redis.log").start()
    yield server
    server.stop()


def _unacked(server: ScratchRedis) -> int:
    import redis

    try:
        return int(redis.Redis.from_url(server.url(0)).hlen("unacked"))
    except redis.RedisError:
        return 0


def test_worker_survives_redis_killed_and_restarted_empty(
        db: sessionmaker[Session], pg_url: str, simulator: Simulator, tmp_path: Path,
        scratch_redis: ScratchRedis) -> None:
    rig = Rig(db, pg_url, simulator, tmp_path, scratch_redis.url(0), concurrency=2)
    try:
        ids = rig.submit(6, Script(timeline=RUNNING))
        assert wait_for(lambda: all(j.provider_task_id for j in rig.jobs(ids)), timeout=60)
        # the worker holds unacked countdown polls at the moment Redis dies
        assert wait_for(lambda: _unacked(scratch_redis) >= 2, timeout=30, interval=0.05)
        scratch_redis.kill()
        time.sleep(2.0)
        scratch_redis.start()  # empty: every queued and unacked message is gone
        offset = rig.log_offset()
        assert wait_for(lambda: rig.received_since(offset) > 0 or not rig.worker.alive(),
                        timeout=90, interval=0.5, tick=lambda: sweep(rig.rt))
        assert rig.worker.alive(), rig.worker.tail()  # alive and consuming again
        probe = rig.ping()
        assert probe.returncode == 0 and "pong" in probe.stdout, (probe.stdout, probe.stderr)
        rig.finish(ids)
        log = rig.worker.log_path.read_text(errors="replace")
        assert "Unrecoverable error" not in log
    finally:
        rig.stop()


@pytest.fixture
def rabbitmq_vhost() -> str:
    try:
        subprocess.run(["rabbitmqctl", "add_vhost", VHOST], capture_output=True, timeout=120)
        subprocess.run(["rabbitmqctl", "set_permissions", "-p", VHOST, "guest", ".*", ".*", ".*"],
                       capture_output=True, timeout=120, check=True)
    except (OSError, subprocess.SubprocessError) as exc:  # a missing broker fails, never skips
        pytest.fail(f"RabbitMQ vhost {VHOST!r} unavailable: {exc}")
    url = f"amqp://guest:guest@127.0.0.1:5672/{VHOST}"
    app = celery_sender(url)
    with app.connection_for_write() as conn:
        for queue in QUEUES:
            try:
                conn.default_channel.queue_purge(queue)
            except Exception:  # not declared yet
                pass
    return url


def test_worker_survives_its_rabbitmq_connections_closed(
        db: sessionmaker[Session], pg_url: str, simulator: Simulator, tmp_path: Path,
        rabbitmq_vhost: str) -> None:
    rig = Rig(db, pg_url, simulator, tmp_path, rabbitmq_vhost, concurrency=2)
    try:
        ids = rig.submit(6, Script(timeline=RUNNING))
        assert wait_for(lambda: all(j.provider_task_id for j in rig.jobs(ids)), timeout=60)
        time.sleep(1.0)  # countdown polls in flight, held unacked
        offset = rig.log_offset()
        assert close_rabbitmq_connections(VHOST) >= 1
        assert wait_for(lambda: rig.received_since(offset) > 0 or not rig.worker.alive(),
                        timeout=90, interval=0.5)
        assert rig.worker.alive(), rig.worker.tail()
        rig.finish(ids)
    finally:
        rig.stop()


def test_rabbitmq_close_during_slow_creates_leaves_nothing_uncertain(
        db: sessionmaker[Session], pg_url: str, simulator: Simulator, tmp_path: Path,
        rabbitmq_vhost: str) -> None:
    """Four creates answer after 12 s; the vhost's connections close while all four run.
    Cancel-on-connection-loss would kill them after the provider accepted (uncertain, credits
    held); off, each finishes, saves its id, and the redelivered copy finds the claim busy."""
    # rabbitmqctl takes seconds to list and close: slow creates (12 s, within the 20 s read
    # timeout) and a time scale of 0.25 so the create claim (30 s) outlives them
    rig = Rig(db, pg_url, simulator, tmp_path, rabbitmq_vhost, concurrency=4, time_scale=0.25,
              timeouts={"connect_timeout": 1.0, "read_timeout": 20.0})
    try:
        ids = rig.submit(4, Script(timeline=((0.0, "queued"), (1.0, "succeeded")), latency=12.0))
        assert wait_for(lambda: all(j.submission_state == "submitting" for j in rig.jobs(ids)),
                        timeout=60, interval=0.05)
        assert close_rabbitmq_connections(VHOST) >= 1
        rig.finish(ids)
        assert [j.id for j in rig.jobs(ids) if j.submission_state == "uncertain"] == []
        log = rig.worker.log_path.read_text(errors="replace")
        # the consumer lost its connection while the creates ran (none had been accepted yet)
        lost = log.index("Connection to broker lost")
        assert lost < log.index("task_created"), log[-3000:]
        assert "cannot be acknowledged after a connection loss" not in log
    finally:
        rig.stop()


def test_soft_shutdown_lets_a_running_poll_finish_then_requeues_held_messages(
        db: sessionmaker[Session], pg_url: str, simulator: Simulator, tmp_path: Path,
        scratch_redis: ScratchRedis) -> None:
    """SIGTERM with ``REMAP_SIGTERM=SIGQUIT`` (the supervisors of README, Operate workers): the poll that is
    running (a 2 s status read) gets ``worker_soft_shutdown_timeout`` to finish, then the
    messages the worker held (countdown polls, unacked) are back on the queue at once — not
    stuck in Redis' ``unacked`` until the visibility timeout. (With no soft timeout, as before,
    the running poll is killed mid-read.)"""
    import signal

    import redis

    rt, _ = make_runtime(db, simulator, tmp_path, time_scale=TIME_SCALE, **TIMEOUTS)
    user = uuid.uuid4()
    fund(db, user)
    job_id = lifecycle.submit_job(rt, user, "kie-standard", "seedream/4.5-edit", {"prompt": "x"},
                                  10, job_type="image", enqueue=False).job_id
    simulator.script(str(job_id), Script(timeline=RUNNING, latency=2.0))
    assert lifecycle.create_step(rt, job_id).action == "accepted"
    with db() as s:
        generation = s.get(Job, job_id).poll_generation  # type: ignore[union-attr]
    env = {**_env(pg_url, scratch_redis.url(0), simulator, tmp_path, TIMEOUTS),
           "REMAP_SIGTERM": "SIGQUIT", "RECONCILE_WORKER_SOFT_SHUTDOWN_TIMEOUT": "10"}
    worker = CeleryWorker(env, tmp_path / "worker.log", concurrency=2, name="soft")
    try:
        worker.wait_ready(timeout=90)
        sender = celery_sender(scratch_redis.url(0))
        for _ in range(3):  # polls of unknown jobs: harmless if they ever ran
            sender.send_task("reconcile.poll", args=[str(uuid.uuid4()), 1, 0], countdown=30)
        client = redis.Redis.from_url(scratch_redis.url(0))
        assert wait_for(lambda: client.hlen("unacked") == 3, timeout=30, interval=0.1)
        running = sender.send_task("reconcile.poll", args=[str(job_id), generation, 0]).id
        assert wait_for(lambda: f"reconcile.poll[{running}] received".encode()
                        in worker.log_path.read_bytes(), timeout=30, interval=0.05)
        time.sleep(0.5)  # mid status read
        worker.proc.send_signal(signal.SIGTERM)
        worker.proc.wait(timeout=90)
        log = worker.log_path.read_text(errors="replace")
        assert f"reconcile.poll[{running}] succeeded" in log, log[-3000:]
        assert client.llen(POLL_QUEUE) >= 3 and client.hlen("unacked") == 0, log[-3000:]
    finally:
        worker.stop()
