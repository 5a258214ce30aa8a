"""The ``reconcile.poll_due`` task's helper: a run whose first claim is full sends one more
``poll_due`` (on a thread of its own), marked by a header and expiring as a tick does; a run of
such a marked message sends none, and the re-send of a run whose budget ran out is marked too,
so each beat tick sends at most one helper. The wake: a run that finds a row falling due
before the next tick sends one more ``poll_due`` due then, marked with that tick's time, which
its own run keeps; a helper or a re-send sends none."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from reconcile import tasks
from reconcile.lifecycle import batch as batch_poll
from reconcile.settings import Settings

Sent = list[tuple[str, dict[str, Any]]]


START = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> Sent:
    """What the task sends: (name, options), ``countdown`` among them when one is given. No
    row falls due before the next tick unless a test says so (``batch.wake_in``)."""
    out: Sent = []
    settings = Settings(poll_mode="batch", poll_batch_interval=2.0)
    monkeypatch.setattr(tasks, "get_runtime",
                        lambda: SimpleNamespace(settings=settings, now=lambda: START))
    monkeypatch.setattr(tasks, "send", lambda name, args, countdown=None, **kw:
                        out.append((name, kw if countdown is None else {**kw,
                                                                     "countdown": countdown})))
    monkeypatch.setattr(batch_poll, "wake_in", lambda rt, until: None)
    return out


def _runs(monkeypatch: pytest.MonkeyPatch, *, more: bool, full: bool = True) -> None:
    """``batch.poll_due`` as a run whose first claim is full (it calls the helper; not when
    ``full`` is False), and which spends its budget with rows still due when ``more``."""

    def run(rt: Any, *, helper: Any = None) -> batch_poll.BatchReport:
        if helper is not None and full:
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


# ----------------------------------------------------------------------------- the wake


def _wakes_at(monkeypatch: pytest.MonkeyPatch, seconds: float | None) -> list[Any]:
    """``batch.wake_in`` answering ``seconds`` (None: nothing due before the tick); returns
    the ``until`` of each call."""
    asked: list[Any] = []

    def wake_in(rt: Any, until: Any) -> float | None:
        asked.append(until)
        return seconds

    monkeypatch.setattr(batch_poll, "wake_in", wake_in)
    return asked


def _wake(countdown: float, until: datetime) -> tuple[str, dict[str, Any]]:
    return ("reconcile.poll_due", {
        "headers": {tasks._HELPER_HEADER: "1", tasks._WAKE_HEADER: repr(until.timestamp())},
        "expires": countdown + 2.0, "countdown": countdown})


def test_a_tick_sends_a_wake_for_a_row_due_before_the_next_tick(
        sent: Sent, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tick's wake is marked (a helper, so it sends no helper; and its tick's time, the
    next tick's, two seconds on), is due when the row is and expires as a tick does after it."""
    _runs(monkeypatch, more=False, full=False)
    asked = _wakes_at(monkeypatch, 0.7)
    tasks.poll_due.apply()
    until = START + timedelta(seconds=2)
    assert asked == [until]
    assert sent == [_wake(0.7, until)]


def test_a_wake_keeps_its_ticks_time_and_a_helper_or_a_resend_sends_none(
        sent: Sent, monkeypatch: pytest.MonkeyPatch) -> None:
    """A wake's own run wakes again only before its header's time (never the time of a tick
    of its own: a chain of wakes ends at the next tick); a helper and a re-send wake nothing;
    a run whose budget ran out re-sends and wakes nothing."""
    _runs(monkeypatch, more=False, full=False)
    asked = _wakes_at(monkeypatch, 0.5)
    until = START + timedelta(seconds=1.3)
    tasks.poll_due.apply(headers=_wake(0.5, until)[1]["headers"])
    assert asked == [until] and sent == [_wake(0.5, until)]

    sent.clear()
    tasks.poll_due.apply(headers={tasks._HELPER_HEADER: "1"})
    assert sent == [] and len(asked) == 1

    _runs(monkeypatch, more=True, full=False)
    tasks.poll_due.apply()
    assert sent == [RESEND] and len(asked) == 1


@pytest.mark.parametrize("until", ["soon", "nan", "inf", "1e300", ""])
def test_a_wake_header_that_is_no_time_sends_no_wake(
        sent: Sent, monkeypatch: pytest.MonkeyPatch, until: str) -> None:
    _runs(monkeypatch, more=False, full=False)
    asked = _wakes_at(monkeypatch, 0.5)
    tasks.poll_due.apply(headers={tasks._HELPER_HEADER: "1", tasks._WAKE_HEADER: until})
    assert sent == [] and asked == []


def test_a_failed_lookup_or_send_loses_nothing_but_the_wake(
        sent: Sent, monkeypatch: pytest.MonkeyPatch) -> None:
    """The wake is an optimisation: a database error finding the next due time, or a broker
    refusing the send, is logged and the run's own report still comes back."""
    _runs(monkeypatch, more=False, full=False)

    def broken(rt: Any, until: Any) -> float:
        raise RuntimeError("database down")

    monkeypatch.setattr(batch_poll, "wake_in", broken)
    assert "claimed=32" in tasks.poll_due.apply().get()
    assert sent == []

    _wakes_at(monkeypatch, 0.5)

    def refused(name: str, args: list[Any], countdown: float | None = None, **kw: Any) -> None:
        raise ConnectionError("broker down")

    monkeypatch.setattr(tasks, "send", refused)
    assert "claimed=32" in tasks.poll_due.apply().get()


def test_chain_mode_wakes_nothing(sent: Sent, monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _wakes_at(monkeypatch, 0.5)
    monkeypatch.setattr(tasks, "get_runtime", lambda: SimpleNamespace(
        settings=Settings(poll_mode="chain"), now=lambda: START))
    assert tasks.poll_due.apply().get() == "off"
    assert sent == [] and asked == []
