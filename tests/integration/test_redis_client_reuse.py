"""Publishing through the Redis broker reuses one ``redis.Redis`` client per kombu channel
(``reconcile.worker.broker.reuse_redis_clients``, applied by ``reconcile.install``): kombu built
a new client for every publish. Counted, never timed; the messages still arrive, in order."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import redis
from celery import Celery

from reconcile.celery_install import install


def _app(redis_url: str) -> Celery:
    app = Celery(f"reuse-{uuid.uuid4().hex[:6]}", broker=redis_url)
    install(app, replace=False)
    return app


def test_a_channel_publishes_through_one_client(redis_url: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    app = _app(redis_url)
    queue = f"reuse-test-{uuid.uuid4().hex[:8]}"
    made: list[Any] = []
    real_init = redis.Redis.__init__

    def counting(self: Any, *args: Any, **kwargs: Any) -> None:
        made.append(self)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(redis.Redis, "__init__", counting)
    with app.connection_for_write() as conn, conn.Producer() as producer:
        producer.publish({"n": 0}, routing_key=queue, serializer="json", retry=False)
        made.clear()  # the channel is set up (its own clients, the first publish's)
        for n in range(1, 25):
            producer.publish({"n": n}, routing_key=queue, serializer="json", retry=False)
        assert made == [], f"{len(made)} Redis clients made for 24 publishes (kombu: one each)"
        producer.channel._pool = None  # the channel's pool rebuilt (as after a close)
        producer.publish({"n": 25}, routing_key=queue, serializer="json", retry=False)
        assert len(made) == 1  # a client of the new pool
    client = redis.Redis.from_url(redis_url)
    try:
        bodies = client.lrange(queue, 0, -1)
        assert len(bodies) == 26  # every message arrived (LPUSH: newest first)
    finally:
        client.delete(queue)
