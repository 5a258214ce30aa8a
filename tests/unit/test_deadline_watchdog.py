"""The exchange deadline's watchdog thread: woken only when it must be.

Every provider exchange schedules a deadline. The thread used to be notified for each one, a
context switch per status read, though the new deadline (same timeout, later start) was never
the one it slept for. Each test runs a watchdog of its own (not the process's) and counts the
notifications its condition sends."""

from __future__ import annotations

import threading
import time

from reconcile.providers import deadline


class _Counting(threading.Condition):
    def __init__(self) -> None:
        super().__init__()
        self.notified = 0

    def notify(self, n: int = 1) -> None:
        self.notified += 1
        super().notify(n)


def _watchdog() -> deadline._Watchdog:
    watchdog = deadline._Watchdog()
    watchdog.cond = _Counting()
    return watchdog


def _until(predicate, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def test_exchanges_that_end_in_time_wake_the_thread_once_and_leave_one_watch() -> None:
    watchdog = _watchdog()
    for _ in range(200):
        watch = deadline._Watch(30.0)
        watchdog.schedule(30.0, watch)
        watch.end()
    # the first deadline, and once more if the thread, starting, dropped it before the second
    # came: every later one is later than the one the thread sleeps for
    assert watchdog.cond.notified <= 2
    assert len(watchdog.heap) == 1  # the ended watches ahead of the newest one are dropped


def test_a_shorter_deadline_after_a_longer_one_is_expired_on_time() -> None:
    watchdog = _watchdog()
    long = deadline._Watch(60.0)
    watchdog.schedule(60.0, long)
    assert _until(lambda: watchdog.waking_at < float("inf"), 20.0)  # the thread sleeps for it
    short = deadline._Watch(0.2)
    started = time.monotonic()
    watchdog.schedule(0.2, short)
    assert _until(lambda: short.expired, 30.0)
    assert time.monotonic() - started < 30.0  # not at the long one's 60 s
    assert not long.expired


def test_a_live_watch_behind_ended_ones_is_expired_and_the_ended_ones_are_not() -> None:
    watchdog = _watchdog()
    ended = []
    for _ in range(50):
        watch = deadline._Watch(0.1)
        watchdog.schedule(0.1, watch)
        ended.append(watch)
    for watch in ended:
        watch.end()
    live = deadline._Watch(0.3)
    watchdog.schedule(0.3, live)
    assert _until(lambda: live.expired, 20.0)
    assert not any(watch.expired for watch in ended)
    assert _until(lambda: not watchdog.heap, 20.0)


def test_a_watch_whose_exchange_runs_on_is_expired_while_others_end_in_time() -> None:
    """A long exchange (live) at the head, short ones that end behind it: the head is still
    expired at its own time, not pushed back by the others."""
    watchdog = _watchdog()
    head = deadline._Watch(0.3)
    watchdog.schedule(0.3, head)
    started = time.monotonic()
    while time.monotonic() - started < 0.2:
        watch = deadline._Watch(5.0)
        watchdog.schedule(5.0, watch)
        watch.end()
    assert _until(lambda: head.expired, 4.0)
    # at its own 0.3 s, give or take a loaded host; never at the others' 5 s
    assert time.monotonic() - started < 4.0


def test_a_long_run_of_ended_watches_is_dropped_a_slice_at_a_time() -> None:
    """Behind a long live exchange, ended watches pile up; once it ends, no single schedule
    drops them all under the lock (every other exchange's schedule would wait for it)."""
    watchdog = _watchdog()
    head = deadline._Watch(60.0)
    watchdog.schedule(60.0, head)
    for _ in range(1000):
        watch = deadline._Watch(60.0)
        watchdog.schedule(60.0, watch)
        watch.end()
    head.end()
    before = len(watchdog.heap)
    watch = deadline._Watch(60.0)
    watchdog.schedule(60.0, watch)
    watch.end()
    assert before - len(watchdog.heap) + 1 <= deadline._Watchdog.DROP_SLICE
    for _ in range(1000 // deadline._Watchdog.DROP_SLICE + 1):  # the next exchanges drain it
        watch = deadline._Watch(60.0)
        watchdog.schedule(60.0, watch)
        watch.end()
    assert len(watchdog.heap) <= 2


def test_an_infinite_total_does_not_end_the_thread() -> None:
    """A wait of ``inf`` overflowed the condition's wait and ended the thread: after that no
    deadline in the process was enforced."""
    watchdog = _watchdog()
    watchdog.schedule(float("inf"), deadline._Watch(float("inf")))
    watchdog.schedule(1e12, deadline._Watch(1e12))
    time.sleep(0.2)
    short = deadline._Watch(0.1)
    watchdog.schedule(0.1, short)
    assert _until(lambda: short.expired, 20.0)
