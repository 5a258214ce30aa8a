"""The Celery app: ``celery -A reconcile.celery_app worker -Q reconcile.poll,reconcile.create,reconcile,reconcile.sweep``.

Configured from :mod:`reconcile.celery_settings` (inside the package, so a wheel in any folder
behaves as the checkout) and installed like a platform's app would be. A platform with its own
app calls ``reconcile.install(app)`` instead (:mod:`reconcile.celery_install`).
"""

from __future__ import annotations

import os
import uuid
from time import monotonic
from typing import Any

from celery import Celery

from .celery_install import fresh_engines, install
from .worker import broker

__all__ = [
    "app",
]


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
    filesystem.Channel._put = _put  # type: ignore[method-assign]


_atomic_filesystem_publish()
broker.survive_broker_loss()

app = Celery("reconcile")
app.config_from_object("reconcile.celery_settings", force=True)
app.conf.include = ["reconcile.tasks"]
# a platform's app installed earlier in this process stays the one enqueues go through
install(app, replace=False)
# the library enqueues through the installed app; for code of the standalone process that uses
# the shared tasks' proxies, make this the default app of every thread as well
app.set_default()

# kept for code that imported the hook from here; it lives in reconcile.celery_install
_fresh_engines = fresh_engines
