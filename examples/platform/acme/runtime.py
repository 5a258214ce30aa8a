"""The library's runtime for acme's processes (gateway and workers), with acme's hooks."""

from __future__ import annotations

from typing import Any

from reconcile import Runtime, Settings, tasks

from .settings import database_url


def _on_event(message: dict[str, Any]) -> None:
    """An outbox event hook: tell acme's own task about each completed job."""
    if message["type"] == "completed":
        from .celery_app import notify

        notify.delay(message["job_id"], "completed")


def build() -> Runtime:
    rt = Runtime.from_settings(Settings(database_url=database_url()), event_hooks=[_on_event])
    tasks.set_runtime(rt)  # the library's tasks in this process use it (and its enqueue)
    return rt
