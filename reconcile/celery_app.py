"""The Celery app: ``celery -A reconcile.celery_app worker -Q reconcile,reconcile.sweep``.

A platform with its own app can instead ``app.config_from_object("celeryconfig")`` (or merge the
settings it needs) and import ``reconcile.tasks``: the tasks are ``shared_task``s named
``reconcile.*``.
"""

from __future__ import annotations

import os
import uuid
from time import monotonic
from typing import Any

from celery import Celery
from celery.signals import worker_process_init


def _atomic_filesystem_publish() -> None:
    """Make kombu's ``filesystem://`` publish atomic (the embedded default broker).

    kombu 5.7 creates ``<ms>_<uuid>.<queue>.msg`` and only then writes it; a consumer listing the
    folder in between moves the still-empty file away and fails to parse it: ``JSONDecodeError``,
    logged as an "Unrecoverable error" that stops the worker, and the message is lost (kombu
    #1551; 22 of 6,000 messages with two publishers and one consumer here). A worker races
    itself: its pool child publishes the next poll while its main process consumes. So: write
    under a dot-free temp name, which every reader of the folder ignores, then rename.
    """
    from kombu.exceptions import ChannelError
    from kombu.transport import filesystem
    from kombu.utils.encoding import str_to_bytes
    from kombu.utils.json import dumps

    if getattr(filesystem.Channel._put, "reconcile_atomic", False):
        return

    def _put(self: Any, queue: str, payload: Any, **kwargs: Any) -> None:
        name = f"{int(round(monotonic() * 1000))}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = os.path.join(self.data_folder_out, f"partial-{uuid.uuid4().hex}")
        try:
            with open(partial, "wb") as f:
                f.write(str_to_bytes(dumps(payload)))
            os.replace(partial, final)
        except OSError as exc:
            try:
                os.unlink(partial)
            except OSError:
                pass
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc

    _put.reconcile_atomic = True  # type: ignore[attr-defined]
    filesystem.Channel._put = _put


_atomic_filesystem_publish()

app = Celery("reconcile")
try:
    app.config_from_object("celeryconfig", force=True)
except ImportError:  # installed without the repo's top-level celeryconfig.py
    app.config_from_object("reconcile.celery_defaults", force=True)
app.conf.include = ["reconcile.tasks"]
# Celery's current app is per thread: without this, a task enqueued from another thread (a
# threaded web server calling submit_job) resolves to Celery's default app and publishes to
# amqp://localhost instead of the configured broker.
app.set_default()


@worker_process_init.connect
def _fresh_engines(**_: object) -> None:
    """One engine per worker process: never reuse a connection pool across fork."""
    from . import tasks
    from .db.session import dispose_engines

    dispose_engines()
    tasks.reset_runtime()
