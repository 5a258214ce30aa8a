"""Internal: Install the library into a platform's own Celery app: ``reconcile.install(app)``.

What it does to ``app`` (call it after the app is configured: a later ``config_from_object``
replaces the configuration and with it these changes):

* registers the ``reconcile.*`` tasks on ``app`` and records ``app`` as the one every enqueue
  inside the library goes through (a create, the next poll, the sweep's fan-out) — never
  Celery's thread-local current app, which in a web server's worker thread is Celery's default
  app (``amqp://localhost``, queue ``celery``);
* merges the settings the library needs (:mod:`reconcile.celery_settings`) where the platform
  has not set them, and keeps the platform's value with a warning where it differs;
* routes the library's tasks to its queues beside the platform's own routes (:func:`routes`:
  creates on ``reconcile.create``, polls on ``reconcile.poll``, the sweep on
  ``reconcile.sweep``, the rest on ``reconcile``; ``RECONCILE_QUEUE_LAYOUT=single`` keeps the
  former layout), adds the sweep to the beat schedule, and merges the Redis transport
  options (visibility timeout, unacked restore cadence) the same way;
* connects :func:`fresh_engines` to ``worker_process_init``, and a start-up check to
  ``worker_init`` that refuses a worker whose deliveries could outlive the broker's limits or
  whose Celery settings are unsafe for the library (:mod:`reconcile.worker.broker`; connected
  by ``import reconcile.tasks`` too, so an app configured by hand is checked), and a worker that
  consumes ``reconcile`` but neither ``reconcile.create`` nor ``reconcile.poll`` (the layout
  before the split) consumes those two as well (:func:`consume_split_queues`); applies the
  library's fix for a worker that exits when its Redis goes away (Celery 5.7.0).
* connects :func:`check_settings` to ``worker_init`` / ``beat_init``; adds the retention entry
  (``reconcile-prune``) to the beat schedule when a retention is set.

Platforms that prefer a plain module use ``app.config_from_object("reconcile.celery_settings")``
and ``import reconcile.tasks``; enqueues then go through ``reconcile.celery_app`` (configured
from the same environment) unless ``install`` is called.
"""

from __future__ import annotations

import logging
import warnings
from types import ModuleType
from typing import Any

from celery import Celery
from celery.signals import beat_init, worker_init, worker_process_init, worker_process_shutdown

from .worker import installed
from .worker.installed import (
    check_broker_limits,
    connect_worker_checks,
    installed_app,
    send as send,
)
from .worker.queues import (
    CREATE_QUEUE,
    POLL_QUEUE,
    QUEUE,
    QUEUES,
    SWEEP_QUEUE,
    SWEEP_TASK,
    consume_split_queues,
    routes,
)

__all__ = [
    "BEAT_ENTRY", "CREATE_QUEUE", "POLL_DUE_ENTRY", "POLL_QUEUE", "PRUNE_ENTRY", "QUEUE",
    "QUEUES", "SWEEP_QUEUE", "SWEEP_TASK", "SettingConflict", "check_broker_limits",
    "check_settings", "connect_worker_checks", "consume_split_queues", "fresh_engines", "install",
    "installed_app", "library_settings", "routes",
]

log = logging.getLogger("reconcile.install")

BEAT_ENTRY = "reconcile-sweep"
PRUNE_ENTRY = "reconcile-prune"
POLL_DUE_ENTRY = "reconcile-poll-due"
# the platform's to choose (its broker, its backend, its default queue), or merged key by key
_NOT_MERGED = frozenset({
    "broker_url", "result_backend", "task_default_queue", "task_routes", "beat_schedule",
    "broker_transport_options", "visibility_timeout", "include", "task_ignore_result",
    "broker_connection_retry_on_startup", "beat_max_loop_interval",
})
_TRANSPORT_KEYS = ("visibility_timeout", "unacked_restore_interval", "unacked_restore_throttle")

class SettingConflict(UserWarning):
    """The platform's app sets a value the library would set differently (the platform's wins)."""


def library_settings() -> dict[str, Any]:
    """The settings of :mod:`reconcile.celery_settings` as a dict (data only)."""
    from . import celery_settings

    return {key: value for key, value in vars(celery_settings).items()
            if not key.startswith("_") and key.islower() and not callable(value)
            and not isinstance(value, ModuleType)}


def install(app: Celery, *, beat: bool = True, replace: bool = True) -> Celery:
    """Install the library into ``app`` (see the module's docstring); returns ``app``.

    ``replace=False`` configures ``app`` but keeps enqueuing through an app installed before
    (``reconcile.celery_app`` does this, so importing it never takes over a platform's app).
    """
    from . import tasks  # noqa: F401 - registers the shared tasks with every app, ``app`` included

    wanted = library_settings()
    # reading a key finalizes a pending configuration: only then are the app's own values told
    # apart from Celery's defaults (the last of the configuration's maps)
    app.conf.get("broker_url")
    conf = app.conf
    for key, value in wanted.items():
        if key not in _NOT_MERGED:
            _merge(conf, key, value)
    _merge_transport_options(conf, _transport_options_for(conf.broker_url))
    _add_routes(conf)
    if beat:
        _add_beat_entry(conf, wanted.get("beat_schedule", {}).get(BEAT_ENTRY))
        _add_prune_entry(conf, wanted.get("beat_schedule", {}).get(PRUNE_ENTRY))
        _add_poll_due_entry(conf, wanted.get("beat_schedule", {}).get(POLL_DUE_ENTRY))
    worker_process_init.connect(fresh_engines, weak=False, dispatch_uid="reconcile.fresh_engines")
    worker_process_shutdown.connect(_stop_heartbeat, weak=False,
                                    dispatch_uid="reconcile.stop_heartbeat")
    connect_worker_checks()
    from .worker.broker import reuse_redis_clients, survive_broker_loss

    survive_broker_loss()
    reuse_redis_clients()
    for signal in (worker_init, beat_init):
        signal.connect(check_settings, weak=False, dispatch_uid=f"reconcile.check_settings.{signal.name}")
    installed.record(app, replace=replace)
    return app


def check_settings(**_: object) -> None:
    """``worker_init`` / ``beat_init`` (the platform's kinds are registered by then): an
    ``OBSERVE_ONLY_KINDS`` name that protects nothing, a ``REQUIRED_KINDS`` kind this process
    has not registered, or a database that breaks the table contract (``reconcile db check``)
    stops the process, never a silent no-op."""
    from .db.contract import SchemaMismatch, require
    from .db.session import engine_for
    from .jobstore.adoption import SettingsError, check_observe_only, check_required_kinds
    from .settings import Settings

    settings = Settings()
    try:
        check_observe_only(settings.observe_only_kinds)
        check_required_kinds(settings.required_kinds)
        require(engine_for(settings.database_url))  # the table contract (reconcile db check)
    except (SettingsError, SchemaMismatch) as exc:
        # Celery logs and swallows an Exception raised by a signal receiver: SystemExit is not one
        log.critical("reconcile_refuses_to_start %s", exc)
        raise SystemExit(f"reconcile: refusing to start: {exc}") from exc


def fresh_engines(**_: object) -> None:
    """``worker_process_init``: one engine per worker process, never a pool across fork; then
    the process's heartbeat (:mod:`reconcile.worker.heartbeat`; its first beat is written here,
    before the process takes a task) and batch mode's fallback tick (:mod:`reconcile.worker.ticker`)."""
    from . import tasks
    from .db.session import dispose_engines
    from .worker import heartbeat, ticker

    dispose_engines()
    tasks.reset_runtime()
    heartbeat.start(tasks.get_runtime, ready=tasks.has_runtime)
    ticker.start(tasks.get_runtime, ready=tasks.has_runtime)


def _stop_heartbeat(**_: object) -> None:
    """``worker_process_shutdown``: a clean exit removes the process's liveness row (and stops
    batch mode's fallback tick)."""
    from .worker import heartbeat, ticker

    ticker.stop()
    heartbeat.stop()


# ----------------------------------------------------------------------------- merging


def _explicit(conf: Any, key: str) -> bool:
    """Whether the platform set ``key`` (anywhere but Celery's own defaults, the last map)."""
    maps = getattr(conf, "maps", None)
    if not maps:
        return key in conf
    return any(key in m for m in maps[:-1])


def _merge(conf: Any, key: str, value: Any) -> None:
    if not _explicit(conf, key):
        conf[key] = value
    elif conf.get(key) != value:
        _conflict(key, conf.get(key), value)


def _conflict(key: str, theirs: Any, ours: Any) -> None:
    warnings.warn(f"reconcile.install: the app sets {key}={theirs!r}; the library needs "
                  f"{ours!r} (keeping the app's value)", SettingConflict, stacklevel=3)


def _transport_options_for(broker_url: str | None) -> dict[str, Any]:
    """The transport options the library needs on the app's own broker (Redis: a visibility
    timeout above the longest task + poll countdown, a fast unacked-restore cadence)."""
    from . import celery_settings

    if (broker_url or "").startswith(("redis://", "rediss://")):
        return dict(celery_settings._REDIS_TRANSPORT_OPTIONS)
    if broker_url == celery_settings.broker_url:  # e.g. the embedded filesystem:// broker
        return dict(celery_settings.broker_transport_options)
    return {}


def _merge_transport_options(conf: Any, wanted: dict[str, Any]) -> None:
    if not wanted:
        return
    options = dict(conf.get("broker_transport_options") or {})
    for key, value in wanted.items():
        if key not in options:
            options[key] = value
        elif key == "visibility_timeout" and options[key] < value:
            _conflict("broker_transport_options['visibility_timeout']", options[key], value)
    conf["broker_transport_options"] = options
    if "visibility_timeout" in wanted and not _explicit(conf, "visibility_timeout"):
        conf["visibility_timeout"] = options["visibility_timeout"]


def _add_routes(conf: Any) -> None:
    """The library's routes first, then the platform's (a dict, or a list of routers)."""
    from .settings import Settings

    ours = routes(Settings().queue_layout)
    theirs = conf.get("task_routes")
    if theirs is None:
        conf["task_routes"] = ours
    elif isinstance(theirs, dict):
        conf["task_routes"] = {**ours, **{k: v for k, v in theirs.items() if k not in ours}}
    else:
        routers = list(theirs) if isinstance(theirs, list | tuple) else [theirs]
        conf["task_routes"] = [ours, *[r for r in routers if r != ours]]


def _add_prune_entry(conf: Any, entry: dict[str, Any] | None) -> None:
    """The retention entry, present only when a retention is set (the platform's wins)."""
    if entry is not None:
        conf["beat_schedule"] = {PRUNE_ENTRY: entry, **dict(conf.get("beat_schedule") or {})}


def _add_poll_due_entry(conf: Any, entry: dict[str, Any] | None) -> None:
    """RECONCILE_POLL_MODE=batch: the batch poller's tick (the platform's entry wins); beat
    wakes at least that often."""
    if entry is None:
        return
    conf["beat_schedule"] = {POLL_DUE_ENTRY: entry, **dict(conf.get("beat_schedule") or {})}
    every = conf["beat_schedule"][POLL_DUE_ENTRY]["schedule"]
    every = every.total_seconds() if hasattr(every, "total_seconds") else None
    current = conf.get("beat_max_loop_interval") or 300
    if every is not None and current > every:
        conf["beat_max_loop_interval"] = every


def _add_beat_entry(conf: Any, entry: dict[str, Any] | None) -> None:
    if entry is None:
        return
    schedule = dict(conf.get("beat_schedule") or {})
    if BEAT_ENTRY in schedule and schedule[BEAT_ENTRY] != entry:
        _conflict(f"beat_schedule[{BEAT_ENTRY!r}]", schedule[BEAT_ENTRY], entry)
    schedule.setdefault(BEAT_ENTRY, entry)
    conf["beat_schedule"] = schedule
    interval = entry["schedule"].total_seconds() if hasattr(entry["schedule"], "total_seconds") else None
    current = conf.get("beat_max_loop_interval") or 300
    if interval is not None and current > max(1.0, interval):
        conf["beat_max_loop_interval"] = max(1.0, interval)
