"""The Celery app's own wiring: atomic filesystem publishes and the default app."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from kombu.transport import filesystem

import reconcile.celery_app as celery_app


def test_filesystem_publish_is_atomic_and_complete(tmp_path: Path) -> None:
    """A published message appears only under its final name, whole; no temp file is left."""
    channel = filesystem.Channel.__new__(filesystem.Channel)
    channel.data_folder_out = str(tmp_path)
    payload = {"body": "x" * 100_000, "headers": {"id": "1"}}
    filesystem.Channel._put(channel, "reconcile", payload)
    files = list(tmp_path.iterdir())
    assert len(files) == 1 and files[0].name.endswith(".reconcile.msg")
    assert json.loads(files[0].read_text()) == payload
    assert getattr(filesystem.Channel._put, "reconcile_atomic", False)


def test_tasks_enqueued_from_another_thread_use_the_reconcile_app() -> None:
    """current_app in a fresh thread is the reconcile app, not Celery's default."""
    from celery import current_app

    seen: list[object] = []
    t = threading.Thread(target=lambda: seen.append(current_app._get_current_object()))
    t.start()
    t.join()
    assert seen == [celery_app.app]
