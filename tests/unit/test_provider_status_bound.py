"""The provider's status as ``jobs.provider_status`` stores it (``jobstore.stored_status``): a
provider's answer is bounded before any write or poll message carries it — cut to
``PROVIDER_STATUS_MAX`` characters, what PostgreSQL cannot keep (NUL, an unpaired surrogate)
as U+FFFD, a status that is no text stored as its text — and the bound never raises."""

from __future__ import annotations

from typing import Any

import pytest

from reconcile.jobstore import PROVIDER_STATUS_MAX, stored_status

MAX = PROVIDER_STATUS_MAX


@pytest.mark.parametrize("raw", ["processing", "IN_PROGRESS", "generating", "TEXT_SUCCESS",
                                 "queued upstream", "", "x" * MAX, "müde", "待機中"])
def test_a_plain_status_is_stored_as_it_was_read(raw: str) -> None:
    assert stored_status(raw) == raw


def test_no_status_stores_nothing() -> None:
    assert stored_status(None) is None


@pytest.mark.parametrize(("raw", "stored"), [
    ("x" * (MAX + 1), "x" * MAX),
    ("p" * 1_000_000, "p" * MAX),
    ("é" * (MAX * 3), "é" * MAX),  # characters, not bytes
    ("paused" + " " * 200, ("paused" + " " * 200)[:MAX]),
])
def test_a_long_status_keeps_its_first_characters(raw: str, stored: str) -> None:
    assert stored_status(raw) == stored
    assert len(stored_status(raw) or "") == MAX


@pytest.mark.parametrize(("raw", "stored"), [
    ("run\x00ning", "run\ufffdning"),  # NUL: PostgreSQL's text refuses it
    ("\ud800paused", "\ufffdpaused"),  # a lone surrogate from a JSON escape: psycopg cannot encode it
    ("\x00" * (MAX + 10), "\ufffd" * MAX),
    ("a\nb\tc\x1b[31m", "a\nb\tc\x1b[31m"),  # storable: kept as read
])
def test_what_postgresql_cannot_keep_is_stored_as_a_replacement_character(
        raw: str, stored: str) -> None:
    assert stored_status(raw) == stored
    assert (stored_status(raw) or "").encode("utf-8")  # encodable: the write cannot refuse it


@pytest.mark.parametrize(("raw", "stored"), [
    (0, "0"), (3, "3"), (True, "True"), (1.5, "1.5"), (["a", 1], "['a', 1]"),
    ({"state": "x" * 100}, str({"state": "x" * 100})[:MAX]),
])
def test_a_status_that_is_no_text_is_stored_as_its_text(raw: Any, stored: str) -> None:
    assert stored_status(raw) == stored


def test_a_status_whose_text_cannot_be_made_stores_nothing() -> None:
    class Hostile:
        def __str__(self) -> str:
            raise RuntimeError("no text")

    assert stored_status(Hostile()) is None


def test_the_bound_is_idempotent() -> None:
    """A status bounded before its poll message is bounded again at the write: unchanged."""
    for raw in ("x" * 500, "run\x00ning", "\ud800p", "ok"):
        once = stored_status(raw)
        assert stored_status(once) == once


def test_a_str_subclass_is_stored_as_its_plain_text() -> None:
    """An adapter's ``str`` subclass whose slicing or ``__str__`` raises (or lies): its plain
    characters are stored, and the bound still never raises (it raised on the slice)."""
    class Sliceless(str):
        def __getitem__(self, key: Any) -> str:
            raise RuntimeError("no slicing")

        def __str__(self) -> str:
            raise RuntimeError("no text")

    class Liar(str):
        def __str__(self) -> str:
            return "succeeded"

    assert stored_status(Sliceless("processing" * 10)) == ("processing" * 10)[:MAX]
    assert type(stored_status(Sliceless("x"))) is str
    assert stored_status(Liar("running")) == "running"
