"""Real ``celery worker`` subprocesses killed mid-poll, on Redis and on RabbitMQ.

The job must still complete with exactly one upstream create: a killed pool child's message is
requeued (acks_late + reject_on_worker_lost) but its duplicate run is fenced; a whole-worker kill
loses the in-memory messages; either way the sweep resumes the chain once the poll lease expires.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from celery import Celery
from sqlalchemy.orm import Session, sessionmaker

from reconcile import credits, lifecycle
from reconcile.celery_install import QUEUES
from reconcile.db.models import Job
from reconcile.testing.simulator import Script, Simulator
from tests.integration.harness import fund, make_runtime
from tests.integration.workers import Worker, make_sender, wait_for

# Redis db 13 and RabbitMQ's default vhost are fixed: `make test` runs pytest-xdist with
# --dist loadfile, so this file's tests run on one worker, one at a time.
pytestmark = pytest.mark.slow

TIME_SCALE = 0.05  # kie-standard: poll every 0.25 s, poll lease 2 s, threshold 30 s
BROKERS = {
    "redis": "redis://127.0.0.1:6379/13",
    "rabbitmq": "amqp://guest:guest@127.0.0.1:5672//",
}


def _purge(url: str) -> None:
    app = Celery(broker=url)
    with app.connection_for_write() as conn:
        for queue in QUEUES:
            try:
                conn.default_channel.queue_purge(queue)
            except Exception:  # queue not declared yet
                pass
    if url.startswith("redis"):
        import redis

        redis.Redis.from_url(url).flushdb()


@pytest.fixture(params=sorted(BROKERS))
def broker(request: pytest.FixtureRequest, redis_url: str) -> str:
    url = BROKERS[request.param]
    try:
        _purge(url)
    except Exception as exc:  # a missing broker fails, never skips
        pytest.fail(f"broker {request.param} unreachable at {url}: {exc}")
    return url


def _env(pg_url: str, broker: str, sim: Simulator, tmp: Path, **extra: str) -> dict[str, str]:
    return {
        **sim.env(),
        "RECONCILE_POLL_MODE": "chain",  # mid_poll is the chain's (batch: test_worker_heartbeat_kill)
        "RECONCILE_DATABASE_URL": pg_url,
        "RECONCILE_BROKER_URL": broker,
        "RECONCILE_BROKER_VISIBILITY_TIMEOUT": "60",
        "RECONCILE_MAX_COUNTDOWN": "20", "RECONCILE_TASK_TIME_LIMIT": "30",
        "RECONCILE_STORAGE_URL": f"file://{tmp / 'media'}",
        "RECONCILE_TIME_SCALE": str(TIME_SCALE),
        "RECONCILE_WEBHOOK_BASE_URL": "https://platform.example/hooks",
        **extra,
    }


@pytest.mark.parametrize("kill", ["pool_child", "whole_worker"])
def test_worker_killed_mid_poll_completes_with_one_create(
    db: sessionmaker[Session], pg_url: str, simulator: Simulator, tmp_path: Path, broker: str,
    kill: str,
) -> None:
    """SIGKILL mid-poll (the pool child, or the whole worker then a new one): the job completes,
    created once upstream, through the sweep's lease recovery."""
    from reconcile.sweep import sweep

    sender = make_sender(broker)
    rt, _ = make_runtime(db, simulator, tmp_path, time_scale=TIME_SCALE)
    rt.storage.root = tmp_path / "media"  # type: ignore[attr-defined]
    rt.enqueue_create = lambda jid, countdown=0.0: sender.send_task(
        "reconcile.create", args=[str(jid)], countdown=countdown or None)
    rt.enqueue_poll = lambda jid, g, s, countdown: sender.send_task(
        "reconcile.poll", args=[str(jid), g, s], countdown=countdown or None)

    marker = tmp_path / "crashed"
    crash_env = {"RECONCILE_TEST_CRASH_AT": "mid_poll",
                 "RECONCILE_TEST_CRASH_MODE": "self" if kill == "pool_child" else "group",
                 "RECONCILE_TEST_CRASH_ONCE": str(marker)}
    first = Worker(_env(pg_url, broker, simulator, tmp_path, **crash_env), tmp_path / "w1.log")
    second: Worker | None = None
    try:
        first.wait_ready()
        user = uuid.uuid4()
        fund(db, user)
        job_id = uuid.uuid4()
        simulator.script(str(job_id), Script(timeline=((0.0, "queued"), (0.5, "running"),
                                                       (3.0, "succeeded")), outputs=2))
        lifecycle.submit_job(rt, user, "kie-standard", "m", {"prompt": "x"}, 30, job_type="image",
                             job_id=job_id)
        assert wait_for(marker.exists, 30), first.log_path.read_text()[-3000:]
        if kill == "whole_worker":
            assert wait_for(lambda: not first.alive(), 10)
            second = Worker(_env(pg_url, broker, simulator, tmp_path), tmp_path / "w2.log")
            second.wait_ready()
        else:
            time.sleep(1.0)
            assert first.alive()  # only the child died; the main process forks a new one

        def done() -> bool:
            with db() as s:
                return s.get(Job, job_id).status == "completed"  # type: ignore[union-attr]

        assert wait_for(done, 60, interval=0.5, tick=lambda: sweep(rt)), (
            first.log_path.read_text()[-3000:])
        with db() as s:
            job = s.get(Job, job_id)
            assert job is not None and job.poll_generation >= 2  # the chain was resumed
            assert credits.audit(s) == []
        assert simulator.creates(str(job_id)) == 1
    finally:
        first.stop()
        if second is not None:
            second.stop()
