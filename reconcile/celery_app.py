"""The Celery app: ``celery -A reconcile.celery_app worker -Q reconcile,reconcile.sweep``.

A platform with its own app can instead ``app.config_from_object("celeryconfig")`` (or merge the
settings it needs) and import ``reconcile.tasks``: the tasks are ``shared_task``s named
``reconcile.*``.
"""

from __future__ import annotations

from celery import Celery
from celery.signals import worker_process_init

app = Celery("reconcile")
try:
    app.config_from_object("celeryconfig", force=True)
except ImportError:  # installed without the repo's top-level celeryconfig.py
    app.config_from_object("reconcile.celery_defaults", force=True)
app.conf.include = ["reconcile.tasks"]


@worker_process_init.connect
def _fresh_engines(**_: object) -> None:
    """One engine per worker process: never reuse a connection pool across fork."""
    from . import tasks
    from .db.session import dispose_engines

    dispose_engines()
    tasks.reset_runtime()
