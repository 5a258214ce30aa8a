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


def _hung_broker(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, list[int]]:
    """``send`` as a broker that accepts and never answers, until the event is set; each
    attempt is counted."""
    release = threading.Event()
    attempts: list[int] = []

    def hung(name: str, args: list[Any], countdown: float | None = None, **kw: Any) -> None:
        attempts.append(1)
        release.wait(30)

    monkeypatch.setattr(tasks, "send", hung)
    return release, attempts


def test_the_send_does_not_hold_the_run_and_a_second_waits_for_none(
        sent: Sent, monkeypatch: pytest.MonkeyPatch) -> None:
    """A broker that never answers: the send blocks on its own thread, the run goes on at once;
    while it is pending, the next run's helper is dropped, not queued behind it."""
    release, attempts = _hung_broker(monkeypatch)
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


def _wake(countdown: float, until: datetime, hop: int = 1) -> tuple[str, dict[str, Any]]:
    return ("reconcile.poll_due", {
        "headers": {tasks._HELPER_HEADER: "1", tasks._WAKE_HEADER: repr(until.timestamp()),
                    tasks._WAKE_HOP_HEADER: str(hop)},
        "expires": countdown + 2.0, "countdown": countdown})


def _apply(**options: Any) -> str:
    """Run the task (eagerly, as the tests' broker-less app does); return its report once its
    wake (sent on a thread of its own) is sent."""
    out = tasks.poll_due.apply(**options).get()
    tasks._send_wake.wait(10)
    return str(out)


def test_a_tick_sends_a_wake_for_a_row_due_before_the_next_tick(
        sent: Sent, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tick's wake is marked (a helper, so it sends no helper; its tick's time, the next
    tick's, two seconds on; the first of its chain), is due when the row is and expires as a
    tick does after it."""
    _runs(monkeypatch, more=False, full=False)
    asked = _wakes_at(monkeypatch, 0.7)
    _apply()
    until = START + timedelta(seconds=2)
    assert asked == [until]
    assert sent == [_wake(0.7, until)]


def test_a_wake_keeps_its_ticks_time_and_a_helper_or_a_resend_sends_none(
        sent: Sent, monkeypatch: pytest.MonkeyPatch) -> None:
    """A wake's own run wakes again only before its header's time (a chain of wakes ends at
    the next tick); a helper and a re-send wake nothing; a run whose budget ran out re-sends
    and wakes nothing."""
    _runs(monkeypatch, more=False, full=False)
    asked = _wakes_at(monkeypatch, 0.5)
    until = START + timedelta(seconds=1.3)
    _apply(headers=_wake(0.5, until)[1]["headers"])
    assert asked == [until] and sent == [_wake(0.5, until, 2)]

    sent.clear()
    _apply(headers={tasks._HELPER_HEADER: "1"})
    assert sent == [] and len(asked) == 1

    _runs(monkeypatch, more=True, full=False)
    _apply()
    assert sent == [RESEND] and len(asked) == 1


def test_a_wake_never_reaches_past_this_process_s_own_next_tick(
        sent: Sent, monkeypatch: pytest.MonkeyPatch) -> None:
    """A header time past this process's next tick (a worker with a longer interval sent it,
    or it is forged: a year on) is cut to that tick, and the cut time is what the next wake
    carries: the chain ends within one tick here."""
    _runs(monkeypatch, more=False, full=False)
    asked = _wakes_at(monkeypatch, 0.5)
    far = START + timedelta(days=365)
    _apply(headers=_wake(0.5, far)[1]["headers"])
    own = START + timedelta(seconds=2)
    assert asked == [own] and sent == [_wake(0.5, own, 2)]


def test_a_chain_ends_after_three_wakes_even_on_a_clock_that_does_not_move(
        sent: Sent, monkeypatch: pytest.MonkeyPatch) -> None:
    """The runtime's clock stands still (a test clock; Celery's eager mode runs each wake at
    once): a tick and each wake it leads to run in turn, rows always falling due; the chain
    stops at its third wake."""
    _runs(monkeypatch, more=False, full=False)
    _wakes_at(monkeypatch, 0.5)
    _apply()
    runs = 1
    while sent:
        name, options = sent.pop()
        assert name == "reconcile.poll_due" and runs < 10
        _apply(headers=options["headers"])
        runs += 1
    assert runs == 1 + 3


@pytest.mark.parametrize("until", ["soon", "nan", "inf", "1e300", ""])
def test_a_wake_header_that_is_no_time_sends_no_wake(
        sent: Sent, monkeypatch: pytest.MonkeyPatch, until: str) -> None:
    _runs(monkeypatch, more=False, full=False)
    asked = _wakes_at(monkeypatch, 0.5)
    _apply(headers={tasks._HELPER_HEADER: "1", tasks._WAKE_HEADER: until,
                    tasks._WAKE_HOP_HEADER: "1"})
    assert sent == [] and asked == []


@pytest.mark.parametrize("hop", [None, "", "x", "0", "-1", "3", "99"])
def test_a_wake_hop_that_is_no_place_in_a_chain_sends_no_wake(
        sent: Sent, monkeypatch: pytest.MonkeyPatch, hop: str | None) -> None:
    _runs(monkeypatch, more=False, full=False)
    asked = _wakes_at(monkeypatch, 0.5)
    headers = {tasks._HELPER_HEADER: "1",
               tasks._WAKE_HEADER: repr((START + timedelta(seconds=1)).timestamp())}
    if hop is not None:
        headers[tasks._WAKE_HOP_HEADER] = hop
    _apply(headers=headers)
    assert sent == [] and asked == []


def test_a_wake_past_the_broker_s_countdown_bound_is_not_sent(
        sent: Sent, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tick longer than ``MAX_COUNTDOWN`` (nothing refuses one): a wake would wait past the
    broker's bound, so none is sent; the tick claims the row."""
    _runs(monkeypatch, more=False, full=False)
    settings = Settings(poll_mode="batch", poll_batch_interval=900.0, max_countdown=300)
    monkeypatch.setattr(tasks, "get_runtime",
                        lambda: SimpleNamespace(settings=settings, now=lambda: START))
    _wakes_at(monkeypatch, 600.0)
    _apply()
    assert sent == []
    _wakes_at(monkeypatch, 300.0)
    _apply()
    assert [options["countdown"] for _, options in sent] == [300.0]


def test_a_failed_lookup_or_send_loses_nothing_but_the_wake(
        sent: Sent, monkeypatch: pytest.MonkeyPatch) -> None:
    """The wake is an optimisation: a database error finding the next due time, or a broker
    refusing the send, is logged and the run's own report still comes back."""
    _runs(monkeypatch, more=False, full=False)

    def broken(rt: Any, until: Any) -> float:
        raise RuntimeError("database down")

    monkeypatch.setattr(batch_poll, "wake_in", broken)
    assert "claimed=32" in _apply()
    assert sent == []

    _wakes_at(monkeypatch, 0.5)

    def refused(name: str, args: list[Any], countdown: float | None = None, **kw: Any) -> None:
        raise ConnectionError("broker down")

    monkeypatch.setattr(tasks, "send", refused)
    assert "claimed=32" in _apply()


def test_a_hung_broker_holds_neither_the_tick_nor_the_next_wake(
        sent: Sent, monkeypatch: pytest.MonkeyPatch) -> None:
    """A broker that never answers: the wake's publish blocks on its own thread and the tick's
    run returns at once; while it is pending, the next run's wake is dropped, not queued."""
    _runs(monkeypatch, more=False, full=False)
    _wakes_at(monkeypatch, 0.5)
    release, attempts = _hung_broker(monkeypatch)
    try:
        finished = threading.Event()
        threading.Thread(target=lambda: (tasks.poll_due.apply(), finished.set()),
                         daemon=True).start()
        assert finished.wait(5), "the wake's send held the tick"
        tasks.poll_due.apply()
    finally:
        release.set()
        tasks._send_wake.wait(10)
    assert attempts == [1]


def test_chain_mode_wakes_nothing(sent: Sent, monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _wakes_at(monkeypatch, 0.5)
    monkeypatch.setattr(tasks, "get_runtime", lambda: SimpleNamespace(
        settings=Settings(poll_mode="chain"), now=lambda: START))
    assert _apply() == "off"
    assert sent == [] and asked == []
