"""Batch mode's fallback tick (``reconcile.worker.ticker``): a worker process sends one
``reconcile.poll_due`` when due rows wait unclaimed, at most one outstanding per process, and
nothing in chain mode."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from reconcile.lifecycle import batch
from reconcile.settings import Settings
from reconcile.worker import ticker as ticker_mod


def _ticker(mode: str, sent: list[tuple[str, Any, Any]]) -> ticker_mod.Ticker:
    rt = SimpleNamespace(settings=Settings(poll_mode=mode, poll_batch_interval=1.0))
    return ticker_mod.Ticker(lambda: rt, lambda: True,
                             lambda name, args, expires=None: sent.append((name, args, expires)))


def test_a_stalled_batch_sends_one_poll_due_that_expires_like_beats_tick(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batch, "stalled", lambda rt: True)
    sent: list[tuple[str, Any, Any]] = []
    t = _ticker("batch", sent)
    assert t.tick() is True
    assert sent == [("reconcile.poll_due", [], Settings(poll_batch_interval=1.0).poll_due_tick[1])]
    # its message is still outstanding (not expired): no second one, however stalled
    assert t.tick() is False and len(sent) == 1
    t._next_send = 0.0  # the first one's expiry passed
    assert t.tick() is True and len(sent) == 2


def test_nothing_is_sent_while_the_ticks_keep_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batch, "stalled", lambda rt: False)
    sent: list[tuple[str, Any, Any]] = []
    assert _ticker("batch", sent).tick() is False
    assert sent == []


def test_chain_mode_ends_the_ticker_without_reading_the_database(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(rt: object) -> bool:
        raise AssertionError("chain mode must not query")

    monkeypatch.setattr(batch, "stalled", boom)
    sent: list[tuple[str, Any, Any]] = []
    t = _ticker("chain", sent)
    assert t.tick() is None
    t.start()
    assert t._thread is not None
    t._thread.join(timeout=5)
    assert not t._thread.is_alive() and sent == []
