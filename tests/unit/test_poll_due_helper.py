"""The ``reconcile.poll_due`` task's helper: a run whose first claim is full sends one more
``poll_due``, marked by a header and expiring as a tick does; a run of such a helper message
sends none (at most one helper per tick, so the messages never multiply)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from reconcile import tasks
from reconcile.lifecycle import batch as batch_poll
from reconcile.settings import Settings


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    settings = Settings(poll_mode="batch", poll_batch_interval=2.0)
    monkeypatch.setattr(tasks, "get_runtime", lambda: SimpleNamespace(settings=settings))
    monkeypatch.setattr(tasks, "send", lambda name, args, countdown=None, **kw:
                        out.append((name, kw)))

    def run(rt: Any, *, helper: Any = None) -> batch_poll.BatchReport:
        if helper is not None:  # as the loop does on a full first claim
            helper()
        return batch_poll.BatchReport(claimed=32, batches=1)

    monkeypatch.setattr(batch_poll, "poll_due", run)
    return out


def test_a_tick_sends_one_helper_marked_and_expiring(sent: list[tuple[str, dict[str, Any]]]
                                                     ) -> None:
    tasks.poll_due.apply()
    assert sent == [("reconcile.poll_due",
                     {"headers": {tasks._HELPER_HEADER: "1"}, "expires": 2.0})]


def test_a_helper_message_sends_no_helper(sent: list[tuple[str, dict[str, Any]]]) -> None:
    tasks.poll_due.apply(headers={tasks._HELPER_HEADER: "1"})
    assert sent == []
