"""Celery settings for reconcile workers and beat (``celery -A reconcile.celery_app …``).

Each setting that matters has its reason (measured in ../shared/CELERY.md). The broker comes
from ``RECONCILE_BROKER_URL``: a Redis or RabbitMQ URL in production; the default
``filesystem://`` needs no server (the embedded default). Correctness never depends on the
broker redelivering: the sweep recovers lost creates and dead poll chains from the database.
"""

from __future__ import annotations

import os
from datetime import timedelta

from reconcile.settings import Settings
from reconcile.worker.queues import routes as _routes

__all__ = [
    "accept_content", "beat_max_loop_interval", "beat_schedule",
    "broker_connection_retry_on_startup", "broker_transport_options", "broker_url",
    "result_backend", "task_acks_late", "task_default_queue", "task_ignore_result",
    "task_reject_on_worker_lost", "task_routes", "task_send_sent_event", "task_serializer",
    "task_soft_time_limit", "task_time_limit",
    "worker_cancel_long_running_tasks_on_connection_loss",
    "worker_enable_soft_shutdown_on_idle", "worker_eta_task_limit",
    "worker_prefetch_multiplier", "worker_send_task_events", "worker_soft_shutdown_timeout",
]

_settings = Settings()

broker_url = _settings.broker_url
# job state lives in the database; results are never read
result_backend = None
task_ignore_result = True

# a task is acked only after it ran, and requeued if its pool child dies (E1/E2)
task_acks_late = True
task_reject_on_worker_lost = True
# one message per process: a long task never holds prefetched messages hostage
worker_prefetch_multiplier = 1
# every task is fenced in the database (create claim, poll generation + sequence, CAS
# settlements), so a second copy after a broker blip costs nothing; cancelling instead kills a
# create after the provider accepted it and makes the job uncertain (E17). Off for all tasks.
worker_cancel_long_running_tasks_on_connection_loss = False
# ids only in arguments (Flower shows them); JSON only
task_serializer = "json"
accept_content = ["json"]
# one step per task run; every I/O call has its own timeout, this is the backstop. With the
# longest countdown (RECONCILE_MAX_COUNTDOWN) it bounds how long a delivery stays unacked:
# workers refuse to start if that reaches the visibility timeout / consumer_timeout.
task_time_limit = int(_settings.task_time_limit)
task_soft_time_limit = max(1, int(task_time_limit * 0.9))
# bound ETA (poll countdown) messages held in memory
worker_eta_task_limit = 1000
# soft shutdown (cold-shutdown signal: SIGQUIT, or SIGTERM with REMAP_SIGTERM=SIGQUIT): running
# tasks get this long to finish, then every held message (ETA polls included, even when idle)
# is requeued at once instead of waiting for the broker's own restore
worker_soft_shutdown_timeout = float(_settings.worker_soft_shutdown_timeout)
worker_enable_soft_shutdown_on_idle = worker_soft_shutdown_timeout > 0
# Task events off, as Celery's own default: each is one more broker publish per task state
# (sent, received, started, succeeded), about a third of a chain poll's Celery cost and a
# quarter of a submit's. Flower turns them on in the workers it watches (its ``enable_events``,
# through remote control); ``celery -A … control enable_events`` does the same by hand
worker_send_task_events = False
task_send_sent_event = False

# The visibility timeout (RECONCILE_BROKER_VISIBILITY_TIMEOUT, default 3600 s) exceeds the
# longest task (600 s) plus the longest countdown (300 s; checked at worker start), so a healthy
# task is never redelivered; a fast restore cadence brings a dead
# worker's messages back within about the timeout instead of +100 s (E3/E4).
_VISIBILITY = int(_settings.broker_visibility_timeout)
# (reconcile.install merges these into a platform's app whose broker is Redis)
_REDIS_TRANSPORT_OPTIONS: dict[str, object] = {
    "visibility_timeout": _VISIBILITY,
    "unacked_restore_interval": 10,
    "unacked_restore_throttle": 1,
}
broker_transport_options: dict[str, object] = {}
if broker_url.startswith(("redis://", "rediss://")):
    broker_transport_options = dict(_REDIS_TRANSPORT_OPTIONS)
    visibility_timeout = _VISIBILITY
elif broker_url.startswith("filesystem://"):
    _folder = os.path.abspath(_settings.broker_folder)
    for _sub in ("queue", "control"):
        os.makedirs(os.path.join(_folder, _sub), exist_ok=True)
    broker_transport_options = {
        "data_folder_in": os.path.join(_folder, "queue"),
        "data_folder_out": os.path.join(_folder, "queue"),
        "control_folder": os.path.join(_folder, "control"),
        "store_processed": False,
        "polling_interval": 0.1,
    }
broker_connection_retry_on_startup = True

# creates, polls and the sweep on queues of their own (RECONCILE_QUEUE_LAYOUT=split, the
# default): a burst of creates never delays the reads of the jobs in flight, and a backlog of
# polls never delays the sweep; settlements and the sweep's fan-out on reconcile. `single`: every
# task but the sweep on reconcile (the layout before the split)
task_default_queue = "reconcile"
task_routes = {name: dict(route) for name, route in _routes(_settings.queue_layout).items()
               if name != "reconcile.*"}

# exactly one beat process (never `worker -B` in production); the sweep is idempotent, so a
# duplicated or missed tick costs only load
beat_schedule = {
    "reconcile-sweep": {
        "task": "reconcile.sweep",
        "schedule": timedelta(seconds=_settings.sweep_interval * _settings.time_scale),
        "options": {"queue": "reconcile.sweep", "expires": _settings.sweep_interval * _settings.time_scale},
    },
}
# retention (`reconcile prune`) hourly, only when a retention is set (the default keeps all)
if _settings.job_events_retention_days is not None \
        or _settings.webhook_deliveries_retention_days is not None:
    beat_schedule["reconcile-prune"] = {
        "task": "reconcile.prune", "schedule": timedelta(hours=1),
        "options": {"queue": "reconcile.sweep", "expires": 3600},
    }
beat_max_loop_interval = min(300.0, max(1.0, _settings.sweep_interval * _settings.time_scale))
# RECONCILE_POLL_MODE=batch: the batch poller's tick (reconcile.lifecycle.batch); a tick not picked
# up within its interval expires (a busy worker is polling already: ticks must not pile up)
if _settings.poll_mode == "batch":
    _POLL_DUE_EVERY, _POLL_DUE_EXPIRES = _settings.poll_due_tick
    beat_schedule["reconcile-poll-due"] = {
        "task": "reconcile.poll_due", "schedule": timedelta(seconds=_POLL_DUE_EVERY),
        "options": {"expires": _POLL_DUE_EXPIRES},
    }
    beat_max_loop_interval = min(beat_max_loop_interval, _POLL_DUE_EVERY)
