"""The machine's task-dispatch limit for figures 2 and 3: a Celery app with the library's own
settings (``celeryconfig``) and one task that does nothing but count itself in Redis. Run as
``celery -A bench.noop_app worker -Q bench.noop``; never imported by the library or its tests."""

from __future__ import annotations

import os

import redis
from celery import Celery

app = Celery("bench_noop")
app.config_from_object("celeryconfig", force=True)
app.conf.task_default_queue = "bench.noop"
app.conf.task_routes = {}

_COUNTER = os.environ.get("BENCH_NOOP_COUNTER", "bench:noop:done")
_redis: redis.Redis | None = None


@app.task(name="bench.noop", ignore_result=True, acks_late=True)
def noop() -> None:
    global _redis
    if _redis is None:
        _redis = redis.Redis.from_url(app.conf.broker_url)
    _redis.incr(_COUNTER)
