"""Internal: the library's own mechanics, not an import path for platforms (may move).

The app the library enqueues through (:func:`installed_app`, :func:`send`; :func:`record`, which
``reconcile.celery_install.install`` calls), and the ``worker_init`` checks that
``import reconcile.tasks`` connects for an app configured by hand (:func:`connect_worker_checks`).
Public through :mod:`reconcile.celery_install`, which registers the tasks (it imports the tasks
module) and so sits above it; the tasks module enqueues through this one, below it.

With no app installed, :func:`installed_app` loads the standalone app's module,
``reconcile.celery_app``, by its name, as ``celery -A reconcile.celery_app`` does: that module
installs its own app on import, and installing imports the tasks, which send through here; a
static import of it from here would close that loop.
"""

from __future__ import annotations

import importlib
import logging
import threading
from typing import Any

from celery import Celery
from celery.signals import worker_init

from ..settings import Settings
from .broker import UnsafeBrokerLimits, refuse_unsafe_limits
from .queues import QUEUES, consume_split_queues

log = logging.getLogger("reconcile.install")

_lock = threading.Lock()
_app: Celery | None = None


def record(app: Celery, *, replace: bool = True) -> None:
    """Make ``app`` the one every enqueue goes through; ``replace=False`` keeps an app recorded
    before (``reconcile.celery_install.install``)."""
    global _app
    with _lock:
        if _app is not None and _app is not app:
            if not replace:
                return
            log.info("reconcile_reinstalled previous=%s app=%s", _app.main, app.main)
        _app = app


def installed_app() -> Celery:
    """The app the library enqueues through: the one last installed, else
    ``reconcile.celery_app.app`` (configured from ``RECONCILE_*``)."""
    if _app is None:
        # installs its own app on import (module docstring: loaded by its name)
        importlib.import_module("reconcile.celery_app")
    assert _app is not None
    return _app


def send(task_name: str, args: list[Any], countdown: float | None = None, *,
         headers: dict[str, Any] | None = None, expires: float | None = None) -> None:
    """Enqueue one of the library's tasks through the installed app (``headers``: message
    headers beside the arguments, which a worker that does not read them ignores;
    ``expires``: seconds after which a message not yet picked up is dropped)."""
    options: dict[str, Any] = {"headers": headers} if headers else {}
    if expires is not None:
        options["expires"] = expires
    installed_app().tasks[task_name].apply_async(args=args, countdown=countdown or None,
                                                 **options)


def connect_worker_checks() -> None:
    """Connect :func:`check_broker_limits` and :func:`~.queues.consume_split_queues` to
    ``worker_init`` (idempotent): by :func:`reconcile.celery_install.install`, and on
    ``import reconcile.tasks`` for an app configured by hand."""
    worker_init.connect(consume_split_queues, weak=False, dispatch_uid="reconcile.split_queues")
    worker_init.connect(check_broker_limits, weak=False, dispatch_uid="reconcile.broker_limits")


def check_broker_limits(sender: Any = None, **_: object) -> None:
    """``worker_init``: refuse to start a worker that serves the library's queues (or of the
    installed app) whose deliveries could outlive the broker's limits or whose effective Celery
    settings are unsafe for the library, however the app was configured
    (:func:`reconcile.worker.broker.refuse_unsafe_limits`)."""
    app = getattr(sender, "app", None) or _app
    if app is None or (app is not _app and not _serves_library(app)):
        return
    try:
        refuse_unsafe_limits(app.conf, Settings())
    except UnsafeBrokerLimits as exc:
        # Celery logs and swallows an Exception raised by a signal receiver: SystemExit is not one
        log.critical("reconcile_refuses_to_start %s", exc)
        raise SystemExit(f"reconcile: refusing to start the worker: UnsafeBrokerLimits: {exc}") \
            from exc


def _serves_library(app: Celery) -> bool:
    """Whether a worker of ``app`` consumes one of the library's queues (at ``worker_init`` the
    worker's ``-Q`` selection is in place; without one it consumes every declared queue)."""
    queues = app.amqp.queues
    return bool(set(QUEUES) & set(queues.consume_from or queues))
