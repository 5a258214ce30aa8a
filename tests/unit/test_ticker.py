"""Batch mode's fallback tick (``reconcile.worker.ticker``): a worker process that polls sends
one ``reconcile.poll_due`` when due rows wait unclaimed, backs off while its messages are not
taken, never sends from a process that does not consume the poll queue, and ends in chain
mode."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from reconcile.lifecycle import batch
from reconcile.settings import Settings
from reconcile.worker import ticker as ticker_mod

T0 = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def _ticker(mode: str, sent: list[tuple[str, Any, Any]], serves: bool = True) -> ticker_mod.Ticker:
    rt = SimpleNamespace(settings=Settings(poll_mode=mode, poll_batch_interval=1.0))
    return ticker_mod.Ticker(lambda: rt, lambda: True,
                             lambda name, args, expires=None: sent.append((name, args, expires)),
                             serves)


def _due(monkeypatch: pytest.MonkeyPatch, oldest: list[datetime | None]) -> None:
    monkeypatch.setattr(batch, "stalled", lambda rt: oldest[0])


def test_a_stalled_batch_sends_a_poll_due_that_expires_like_beats_tick(
        monkeypatch: pytest.MonkeyPatch) -> None:
    oldest: list[datetime | None] = [T0]
    _due(monkeypatch, oldest)
    sent: list[tuple[str, Any, Any]] = []
    t = _ticker("batch", sent)
    expires = Settings(poll_batch_interval=1.0).poll_due_tick[1]
    assert t.tick() is True
    assert sent == [("reconcile.poll_due", [], expires)] and t.wait == expires
    assert t.tick() is False and len(sent) == 1  # within the wait: nothing more
    # the message was taken (the rows it was for were claimed; a newer row waits): one expiry
    oldest[0] = T0 + timedelta(seconds=5)
    t._next_send = 0.0
    assert t.tick() is True and t.wait == expires and len(sent) == 2


def test_nudges_nobody_takes_back_off_to_a_minute_and_reset_once_rows_move(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The same row still waits at every check (no poller consumes the queue): each wait
    doubles up to BACKOFF_MAX, so a fleet whose pollers are down sends about one message a
    minute per process, not one a second; a check with nothing overdue starts again."""
    oldest: list[datetime | None] = [T0]
    _due(monkeypatch, oldest)
    sent: list[tuple[str, Any, Any]] = []
    t = _ticker("batch", sent)
    waits = []
    for _ in range(10):
        t._next_send = 0.0  # the wait passed
        assert t.tick() is True
        waits.append(t.wait)
    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0, 60.0, 60.0]
    oldest[0] = None
    t._next_send = 0.0
    assert t.tick() is False and t.wait == 0.0
    oldest[0] = T0 + timedelta(minutes=5)
    assert t.tick() is True and t.wait == 1.0


def test_nothing_is_sent_while_the_ticks_keep_up(monkeypatch: pytest.MonkeyPatch) -> None:
    _due(monkeypatch, [None])
    sent: list[tuple[str, Any, Any]] = []
    assert _ticker("batch", sent).tick() is False
    assert sent == []


def test_a_worker_that_does_not_consume_the_poll_queue_never_nudges(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _due(monkeypatch, [T0])
    sent: list[tuple[str, Any, Any]] = []
    assert _ticker("batch", sent, serves=False).tick() is False
    assert sent == []


def test_serves_polls_reads_the_workers_queue_selection(monkeypatch: pytest.MonkeyPatch) -> None:
    from reconcile.worker.installed import installed_app

    queues = installed_app().amqp.queues
    monkeypatch.setattr(queues, "_consume_from", {"reconcile.create": object()})
    assert ticker_mod.serves_polls() is False  # a create-only worker (split layout)
    monkeypatch.setattr(queues, "_consume_from", {"reconcile.poll": object()})
    assert ticker_mod.serves_polls() is True


def test_chain_mode_ends_the_ticker_without_reading_the_database(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(rt: object) -> None:
        raise AssertionError("chain mode must not query")

    monkeypatch.setattr(batch, "stalled", boom)
    sent: list[tuple[str, Any, Any]] = []
    t = _ticker("chain", sent)
    assert t.tick() is None
    t.start()
    assert t._thread is not None
    t._thread.join(timeout=5)
    assert not t._thread.is_alive() and sent == []
