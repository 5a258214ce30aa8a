"""Internal: the worker process's heartbeat — a liveness row renewed every few seconds, and the
reaper of the workers whose row lapsed.

Started in each worker process (``worker_process_init``: every prefork child, or the solo
pool's process) by :func:`start`; stopped, its row removed, at ``worker_process_shutdown``. The
first beat is written before the process takes a task, and every claim the process writes
carries its id (``Runtime.worker_id``, set by ``reconcile.tasks.get_runtime``). A daemon thread
then renews the row every ``HEARTBEAT_INTERVAL`` seconds and, after each beat, reaps the
workers whose row lapsed (``HEARTBEAT_TIMEOUT`` without a beat: ``reconcile.sweep.liveness``).
A row that was reaped meanwhile (this process was thought dead: a stall, a database outage)
is registered again under a new id: its old claims were ended, as an expired lease ends them.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from ..settings import Settings

log = logging.getLogger("reconcile.heartbeat")

_lock = threading.Lock()
_beats: dict[int, Heartbeat] = {}  # pid → this process's heartbeat


class Heartbeat:
    """One process's liveness row and the thread that renews it and reaps the dead."""

    def __init__(self, settings: Settings, sessions: sessionmaker[Session],
                 runtime: Callable[[], Any], ready: Callable[[], bool] | None = None) -> None:
        self.interval = float(settings.heartbeat_interval)
        self.timeout = timedelta(seconds=float(settings.heartbeat_timeout))
        self.sessions = sessions
        self.runtime = runtime  # the process's Runtime, looked up when reaping
        # whether that Runtime is in place (a platform sets its own in its worker_process_init
        # receiver, which runs after the library's): until then the first reap waits one beat
        self.ready = ready or (lambda: True)
        self.worker_id: str | None = None
        self.hostname = socket.gethostname()
        self.pid = os.getpid()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._reaping = threading.Lock()  # one reap at a time, beside the beats

    def beat(self) -> str | None:
        """Renew this process's row (register it first, or again under a new id when it was
        reaped); returns the live id, None when the database could not be reached."""
        from ..jobstore import register_worker, renew_worker
        from ..runtime import utcnow

        try:
            now = utcnow()
            with self.sessions.begin() as session:
                if self.worker_id is not None and renew_worker(session, self.worker_id, now,
                                                               self.timeout):
                    return self.worker_id
                fresh = f"{self.hostname}:{self.pid}:{uuid.uuid4().hex[:12]}"
                register_worker(session, fresh, self.hostname, self.pid, now, self.timeout)
            if self.worker_id is not None:
                log.warning("heartbeat_reregistered old=%s new=%s (this process was taken for "
                            "dead: its claims were ended)", self.worker_id, fresh)
            self.worker_id = fresh
            return fresh
        except Exception:
            log.exception("heartbeat_failed worker_id=%s", self.worker_id)
            return None

    def reap(self) -> None:
        from ..sweep.liveness import reap

        if not self._reaping.acquire(blocking=False):
            return  # the previous reap still runs
        try:
            reap(self.runtime())
        except Exception:
            log.exception("heartbeat_reap_failed")
        finally:
            self._reaping.release()

    def _reap_beside(self) -> None:
        """Reap in a thread of its own: a long reap (hundreds of rows to decide) must never
        hold up this process's own beats, or its row would lapse and be reaped in turn."""
        if self._reaping.locked():
            return
        threading.Thread(target=self.reap, name="reconcile-reaper", daemon=True).start()

    def start(self) -> None:
        self.beat()
        self._thread = threading.Thread(target=self._run, name="reconcile-heartbeat",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        # a process that starts (a worker restarted after a crash) reaps at once when its runtime
        # is in place (else after one beat): the dead predecessor's rows may have lapsed already
        if self.ready():
            self._reap_beside()
        while not self._stop.wait(self.interval):
            if self.beat() is not None:
                self._reap_beside()

    def stop(self) -> None:
        """Stop beating and remove the row (a clean exit: nothing to reap)."""
        from ..jobstore import remove_worker

        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.interval + 5)
        if self.worker_id is not None:
            try:
                with self.sessions.begin() as session:
                    remove_worker(session, self.worker_id)
            except Exception:
                log.exception("heartbeat_remove_failed worker_id=%s", self.worker_id)
            self.worker_id = None


def start(runtime: Callable[[], Any], settings: Settings | None = None, *,
          ready: Callable[[], bool] | None = None) -> Heartbeat | None:
    """Start this process's heartbeat (idempotent per process); None when disabled
    (``HEARTBEAT_INTERVAL=0``). ``runtime`` returns the process's Runtime when the reaper needs
    it; ``ready`` says whether it is in place already."""
    from ..db.session import engine_for, make_sessionmaker

    settings = settings or Settings()
    if not settings.heartbeat_interval:
        return None
    with _lock:
        beat = _beats.get(os.getpid())
        if beat is not None:
            return beat
        beat = Heartbeat(settings, make_sessionmaker(engine_for(settings.database_url)), runtime,
                         ready)
        _beats[os.getpid()] = beat
    beat.start()
    log.info("heartbeat_started worker_id=%s interval=%ss timeout=%ss", beat.worker_id,
             beat.interval, beat.timeout.total_seconds())
    return beat


def current_id() -> str | None:
    """This process's live worker id (None: no heartbeat here, or not registered yet)."""
    beat = _beats.get(os.getpid())
    return beat.worker_id if beat is not None else None


def stop() -> None:
    """Stop this process's heartbeat and remove its row (``worker_process_shutdown``)."""
    with _lock:
        beat = _beats.pop(os.getpid(), None)
    if beat is not None:
        beat.stop()
