"""Internal: batch mode's fallback tick — a worker process that polls sends ``reconcile.poll_due``
when due rows wait unclaimed, so batch polling never depends on beat alone.

Beat's ``reconcile-poll-due`` entry (``Settings.poll_due_tick``) drives the batch poller. A
deployment whose beat is down, late or missing would otherwise stop every in-flight read
(chain mode loses only its recovery then). So each worker process that consumes the queue
``reconcile.poll_due`` is routed to (started beside its heartbeat, ``worker_process_init``)
checks every tick whether a row it could claim has been due for more than two ticks
unclaimed (:func:`reconcile.lifecycle.batch.stalled`, one row from the partial index) and, if
so, sends one ``reconcile.poll_due`` that expires like beat's. While beat keeps up nothing is
overdue and nothing is sent.

A process waits one tick's expiry after each message it sends. An expired message is dropped
by the worker that receives it, but on Redis it stays queued until then: when the row a nudge
was for still waits at the next check (nobody took the message: every poller is busy, or
none is running), the wait doubles, up to :data:`BACKOFF_MAX`, and it is back to one expiry
once the oldest waiting row is a newer one (rows are claimed again). A create-only worker, or
a platform's own worker that does not consume the poll queue, never sends one. Chain mode:
the thread ends at its first tick. Only the prefork and solo pools start it (Celery sends
``worker_process_init`` for those); a threads / gevent / eventlet worker relies on beat.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

log = logging.getLogger("reconcile.ticker")

BACKOFF_MAX = 60.0  # s: the longest a process waits between nudges nobody takes

_lock = threading.Lock()
_tickers: dict[int, Ticker] = {}  # pid → this process's ticker


class Ticker:
    """One process's fallback tick (see the module docstring)."""

    def __init__(self, runtime: Callable[[], Any], ready: Callable[[], bool],
                 send: Callable[..., None], serves_polls: bool = True) -> None:
        self.runtime = runtime  # the process's Runtime (its settings say the mode and the tick)
        self.ready = ready  # whether that Runtime is in place (the platform may set its own)
        self.send = send
        self.serves_polls = serves_polls  # this worker consumes poll_due's queue
        self.sent = 0  # nudges sent by this process (tests and logs)
        self.wait = 0.0  # s until the next nudge may go (one expiry, doubled while not taken)
        self._next_send = 0.0  # monotonic time before which this process does not send again
        self._nudged_for: datetime | None = None  # the oldest waiting due time at the last nudge
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def tick(self) -> bool | None:
        """One check: True when a ``reconcile.poll_due`` was sent, False when none was needed
        (or allowed yet), None when the process is not in batch mode."""
        from ..lifecycle import batch

        rt = self.runtime()
        if not batch.enabled(rt):
            return None
        if not self.serves_polls or time.monotonic() < self._next_send:
            return False
        oldest = batch.stalled(rt)
        if oldest is None:
            self.wait, self._nudged_for = 0.0, None
            return False
        _, expires = rt.settings.poll_due_tick
        if self._nudged_for is not None and oldest <= self._nudged_for:
            # the row the last nudge was for still waits: nobody took that message
            self.wait = min(max(2 * self.wait, 2 * expires), BACKOFF_MAX)
        else:
            self.wait = expires
        self.send("reconcile.poll_due", [], expires=expires)
        self._nudged_for = oldest
        self._next_send = time.monotonic() + self.wait
        self.sent += 1
        log.info("poll_due_nudged pid=%s next_in=%.1fs (rows due for more than two ticks: no "
                 "poll_due tick is arriving)", os.getpid(), self.wait)
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


def serves_polls() -> bool:
    """Whether this worker consumes the queue ``reconcile.poll_due`` is routed to (its ``-Q``
    selection, as the worker set it before forking its pool); True when that cannot be told."""
    from .installed import installed_app

    try:
        app = installed_app()
        queue = app.amqp.router.route({}, "reconcile.poll_due", args=(), kwargs={})["queue"]
        consumed = app.amqp.queues.consume_from or app.amqp.queues
        return getattr(queue, "name", queue) in consumed
    except Exception:
        log.exception("poll_queue_unknown (the fallback tick runs)")
        return True


def start(runtime: Callable[[], Any], ready: Callable[[], bool]) -> Ticker:
    """Start this process's ticker (idempotent per process)."""
    from .installed import send

    with _lock:
        ticker = _tickers.get(os.getpid())
        if ticker is None:
            ticker = _tickers[os.getpid()] = Ticker(runtime, ready, send, serves_polls())
            ticker.start()
    return ticker


def stop() -> None:
    """Stop this process's ticker (``worker_process_shutdown``)."""
    with _lock:
        ticker = _tickers.pop(os.getpid(), None)
    if ticker is not None:
        ticker.stop()
