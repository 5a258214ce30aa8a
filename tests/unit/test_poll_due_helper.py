"""The ``reconcile.poll_due`` task's helper: a run whose first claim is full sends one more
``poll_due`` (on a thread of its own), marked by a header and expiring as a tick does; a run of
such a marked message sends none, and the re-send of a run whose budget ran out is marked too,
so each beat tick sends at most one helper."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest

from reconcile import tasks
from reconcile.lifecycle import batch as batch_poll
from reconcile.settings import Settings

Sent = list[tuple[str, dict[str, Any]]]


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> Sent:
    out: Sent = []
    settings = Settings(poll_mode="batch", poll_batch_interval=2.0)
    monkeypatch.setattr(tasks, "get_runtime", lambda: SimpleNamespace(settings=settings))
    monkeypatch.setattr(tasks, "send", lambda name, args, countdown=None, **kw:
                        out.append((name, kw)))
    return out


def _runs(monkeypatch: pytest.MonkeyPatch, *, more: bool) -> None:
    """``batch.poll_due`` as a run whose first claim is full (it calls the helper), and which
    spends its budget with rows still due when ``more``."""

    def run(rt: Any, *, helper: Any = None) -> batch_poll.BatchReport:
        if helper is not None:
            helper()
            tasks._send_helper.wait(10)
        return batch_poll.BatchReport(claimed=32, batches=1, more=more)

    monkeypatch.setattr(batch_poll, "poll_due", run)


HELPER = ("reconcile.poll_due", {"headers": {tasks._HELPER_HEADER: "1"}, "expires": 2.0})
RESEND = ("reconcile.poll_due", {"headers": {tasks._HELPER_HEADER: "1"}})


def test_a_tick_sends_one_helper_marked_and_expiring(sent: Sent,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    _runs(monkeypatch, more=False)
    tasks.poll_due.apply()
    assert sent == [HELPER]


def test_a_marked_message_sends_no_helper(sent: Sent, monkeypatch: pytest.MonkeyPatch) -> None:
    _runs(monkeypatch, more=False)
    tasks.poll_due.apply(headers={tasks._HELPER_HEADER: "1"})
    assert sent == []


def test_under_overload_a_tick_and_its_chain_of_resends_send_one_helper(
        sent: Sent, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every run's first claim is full and every run spends its budget: the tick's run sends
    its helper and a marked re-send; each re-send's run sends only its own re-send."""
    _runs(monkeypatch, more=True)
    tasks.poll_due.apply()  # the beat tick
    assert sorted(sent, key=str) == sorted([HELPER, RESEND], key=str)
    for _ in range(5):  # the chain of re-sends it started
        sent.remove(RESEND)
        tasks.poll_due.apply(headers=RESEND[1]["headers"])
    assert sent.count(HELPER) == 1 and sent.count(RESEND) == 1


def test_the_send_does_not_hold_the_run_and_a_second_waits_for_none(
        sent: Sent, monkeypatch: pytest.MonkeyPatch) -> None:
    """A broker that never answers: the send blocks on its own thread, the run goes on at once;
    while it is pending, the next run's helper is dropped, not queued behind it."""
    release = threading.Event()
    attempts: list[int] = []

    def hung(name: str, args: list[Any], countdown: float | None = None, **kw: Any) -> None:
        attempts.append(1)
        release.wait(30)

    monkeypatch.setattr(tasks, "send", hung)
    rt = tasks.get_runtime()
    try:
        finished = threading.Event()

        def run() -> None:
            tasks._send_helper(rt)
            finished.set()

        threading.Thread(target=run, daemon=True).start()
        assert finished.wait(5), "the helper's send held the run"
        tasks._send_helper(rt)  # the first is still pending: this one is dropped
    finally:
        release.set()
        tasks._send_helper.wait(10)
    assert attempts == [1]
    tasks._send_helper(rt)  # done now: the next one goes out
    tasks._send_helper.wait(10)
    assert attempts == [1, 1]
