"""Internal: batch mode's fallback tick — each worker process sends ``reconcile.poll_due`` when
due rows wait unclaimed, so batch polling never depends on beat alone.

Beat's ``reconcile-poll-due`` entry (``Settings.poll_due_tick``) drives the batch poller. A
deployment whose beat is down, late or missing would otherwise stop every in-flight read
(chain mode loses only its recovery then). So each worker process (started beside its
heartbeat, ``worker_process_init``) checks every tick whether a row it could claim has been due
for more than two ticks (:func:`reconcile.lifecycle.batch.stalled`) and, if so, sends one
``reconcile.poll_due`` that expires like beat's. While beat keeps up nothing is overdue, and the
check is one indexed ``SELECT … LIMIT 1``; a process has at most one such message outstanding
(it sends again only after the previous one's expiry). Chain mode: the thread ends at its first
tick.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("reconcile.ticker")

_lock = threading.Lock()
_tickers: dict[int, Ticker] = {}  # pid → this process's ticker


class Ticker:
    """One process's fallback tick (see the module docstring)."""

    def __init__(self, runtime: Callable[[], Any], ready: Callable[[], bool],
                 send: Callable[..., None]) -> None:
        self.runtime = runtime  # the process's Runtime (its settings say the mode and the tick)
        self.ready = ready  # whether that Runtime is in place (the platform may set its own)
        self.send = send
        self.sent = 0  # nudges sent by this process (tests and logs)
        self._next_send = 0.0  # monotonic time before which this process does not send again
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def tick(self) -> bool | None:
        """One check: True when a ``reconcile.poll_due`` was sent, False when none was needed
        (or one of ours is still outstanding), None when the process is not in batch mode."""
        from ..lifecycle import batch

        rt = self.runtime()
        if not batch.enabled(rt):
            return None
        if time.monotonic() < self._next_send or not batch.stalled(rt):
            return False
        every, expires = rt.settings.poll_due_tick
        self.send("reconcile.poll_due", [], expires=expires)
        self._next_send = time.monotonic() + expires
        self.sent += 1
        log.info("poll_due_nudged pid=%s (rows due for more than two ticks: no poll_due tick "
                 "is arriving)", os.getpid())
        return True

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="reconcile-ticker", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        waited = False
        every = 1.0
        while not self._stop.wait(every):
            if not self.ready() and not waited:
                waited = True  # the platform's own runtime may still be on its way: one tick
                continue
            try:
                if self.tick() is None:
                    return  # chain mode
                every = max(0.1, self.runtime().settings.poll_due_tick[0])
            except Exception:
                log.exception("poll_due_tick_failed")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)


def start(runtime: Callable[[], Any], ready: Callable[[], bool]) -> Ticker:
    """Start this process's ticker (idempotent per process)."""
    from .installed import send

    with _lock:
        ticker = _tickers.get(os.getpid())
        if ticker is None:
            ticker = _tickers[os.getpid()] = Ticker(runtime, ready, send)
            ticker.start()
    return ticker


def stop() -> None:
    """Stop this process's ticker (``worker_process_shutdown``)."""
    with _lock:
        ticker = _tickers.pop(os.getpid(), None)
    if ticker is not None:
        ticker.stop()
