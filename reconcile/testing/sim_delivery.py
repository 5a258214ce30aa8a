"""Internal: the library's own mechanics, not an import path for platforms (may move).

The simulator's webhook deliveries: a ticker thread finds tasks that reached a terminal state
and hands each to its provider's registered callback (:mod:`.sim_registry`), which builds and
signs the delivery; :func:`.sim_signing.deliver` posts it fire-and-forget (a mixin of
:class:`~reconcile.testing.simulator.Simulator`)."""

from __future__ import annotations

import functools
import threading
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import sim_registry
from .sim_core import TERMINAL
from .sim_signing import deliver

if TYPE_CHECKING:
    from .sim_core import Task

_TICK = 0.02  # seconds between webhook due-checks


class Delivering:
    """Webhook deliveries of the simulator's tasks (a mixin)."""

    _lock: threading.RLock
    _tasks: dict[str, Task]
    _deliveries: list[dict[str, Any]]
    _stopping: threading.Event
    now: Callable[[], float]

    @property
    def deliveries(self) -> list[dict[str, Any]]:
        """Webhook deliveries attempted: task, url, body, headers, status or error."""
        with self._lock:
            return list(self._deliveries)

    def _tick_forever(self) -> None:
        while not self._stopping.wait(_TICK):
            try:
                self._tick()
            except Exception:  # never let the ticker die; a bug shows as a missing delivery
                traceback.print_exc()

    def _tick(self) -> None:
        now, due = self.now(), []
        with self._lock:
            for task in self._tasks.values():
                if task.webhook_sent or not task.script.webhook:
                    continue
                reached = task.first_at(TERMINAL, now)
                if reached is not None:
                    task.webhook_sent = True
                    due.append((task, *reached))
        for task, state, since in due:
            hooks = sim_registry.webhooks_for(task.provider)
            if hooks is None:  # a provider without registered webhooks sends none
                continue
            try:
                delivery = hooks.callback(self, task, state, since)
            except Exception:  # one broken callback must not cost the tick's other deliveries
                traceback.print_exc()
                continue
            if delivery is None:
                continue
            record = {"task_id": task.task_id, "job_id": task.job_id, "provider": task.provider,
                      "state": state, "url": delivery.url, "headers": dict(delivery.headers),
                      "body": delivery.body}
            deliver(delivery, functools.partial(self._delivered, record))

    def _delivered(self, record: dict[str, Any], outcome: dict[str, Any]) -> None:
        with self._lock:
            self._deliveries.append({**record, "status": outcome["status"],
                                     "error": outcome["error"]})

    def wait_deliveries(self, count: int, timeout: float = 5.0) -> list[dict[str, Any]]:
        """Block until ``count`` webhook deliveries were attempted (or ``timeout``)."""
        deadline = time.monotonic() + timeout
        while len(self.deliveries) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.deliveries
