"""Issue 17: the last error's code has its own column, ``jobs.reconcile_last_error_code``
(migration 0021), written with ``reconcile_last_error`` on every path that writes the text, and
read at exhaustion instead of parsing the text. A row written before 0021 (code NULL, text set)
decides the same through ``jobstore.legacy_error_code``, the one fallback."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from reconcile import jobstore, lifecycle
from reconcile.lifecycle import poll
from reconcile.states import MAX_ATTEMPTS
from reconcile.testing.simulator import Script, Simulator
from tests.integration._sweep_helpers import World, assert_refunded

KIND = "replicate-prediction"
VANISHED = Script(timeline=((0.0, "queued"), (0.0, "vanished")))
RUNNING = Script(timeline=((0.0, "queued"), (0.0, "running")))


@pytest.fixture
def world(db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> World:
    return World(db, simulator, tmp_path)


def _observe(w: World, job_id: uuid.UUID) -> str:
    job = w.job(job_id)
    kind = w.rt.kind(job.provider_kind)
    assert kind is not None
    return lifecycle.observe(w.rt, job, kind, via="poll")


def _codes(w: World, job_id: uuid.UUID) -> tuple[str | None, str | None]:
    job = w.job(job_id)
    return job.reconcile_last_error_code, job.reconcile_last_error


def test_a_verdict_before_the_threshold_writes_its_code(world: World) -> None:
    """note_error (no attempt yet): the not-found verdict's code beside its text."""
    w = world
    job_id = w.accept(KIND, VANISHED)
    assert _observe(w, job_id) == "in_flight"
    assert _codes(w, job_id) == ("UPSTREAM_TASK_NOT_FOUND",
                                 "UPSTREAM_TASK_NOT_FOUND: task not found upstream")


def test_a_counted_attempt_writes_its_code(world: World) -> None:
    """count_attempt (past the threshold): the verdict's code, and the attempt counted."""
    w = world
    job_id = w.accept(KIND, VANISHED)
    w.clock.advance(minutes=21)
    assert _observe(w, job_id) == "in_flight"
    job = w.job(job_id)
    assert job.reconcile_attempts == 1
    assert job.reconcile_last_error_code == "UPSTREAM_TASK_NOT_FOUND"


@pytest.mark.parametrize("past_threshold", [False, True])
def test_an_error_without_a_code_writes_none_and_keeps_a_verdict(
        world: World, past_threshold: bool) -> None:
    """A failed read has no code; against a verdict it keeps both the text and the code."""
    w = world
    job_id = w.accept(KIND, RUNNING)
    w.sim.configure(read_fail_rate=1.0)
    if past_threshold:
        w.clock.advance(minutes=21)
    assert _observe(w, job_id) == "in_flight"
    code, text = _codes(w, job_id)
    assert code is None and text is not None and text.startswith("read failed")
    w.set(job_id, reconcile_last_error="UPSTREAM_TASK_NOT_FOUND: task not found upstream",
          reconcile_last_error_code="UPSTREAM_TASK_NOT_FOUND", reconcile_last_attempt_at=None)
    assert _observe(w, job_id) == "in_flight"
    assert _codes(w, job_id) == ("UPSTREAM_TASK_NOT_FOUND",
                                 "UPSTREAM_TASK_NOT_FOUND: task not found upstream")


@pytest.mark.parametrize("past_threshold", [False, True])
def test_a_raising_step_writes_its_code(world: World, monkeypatch: pytest.MonkeyPatch,
                                        past_threshold: bool) -> None:
    """observe's catch-all (and the batch poller's raise, the same ``raised=``): INTERNAL."""
    w = world
    job_id = w.accept(KIND, RUNNING)

    def boom(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("injected")

    monkeypatch.setattr(poll, "_observe", boom)  # observe looks it up in its own module
    if past_threshold:
        w.clock.advance(minutes=21)
    assert _observe(w, job_id) == "error"
    code, text = _codes(w, job_id)
    assert code == "INTERNAL" and text == "INTERNAL: RuntimeError: injected"


def test_completion_and_adoption_clear_the_code(world: World) -> None:
    w = world
    job_id = w.accept(KIND, Script(timeline=((0.0, "queued"), (0.0, "succeeded"))))
    w.set(job_id, reconcile_last_error="UPSTREAM_UNKNOWN_STATUS: x",
          reconcile_last_error_code="UPSTREAM_UNKNOWN_STATUS")
    assert _observe(w, job_id) == "completed"
    assert _codes(w, job_id) == (None, None)

    other = w.submit(KIND)
    w.set(other, submission_state="uncertain", reconcile_last_error="INTERNAL: boom",
          reconcile_last_error_code="INTERNAL")
    assert lifecycle.adopt_upstream_id(w.rt, other, "task-1", source="operator")
    assert _codes(w, other) == (None, None)


def _exhaust(w: World, job_id: uuid.UUID) -> Any:
    job = w.job(job_id)
    assert lifecycle.exhaust(w.rt, job) == "failed"
    return w.job(job_id)


@pytest.mark.parametrize(("code", "text", "expected"), [
    ("UPSTREAM_TASK_NOT_FOUND", "UPSTREAM_TASK_NOT_FOUND: task not found upstream",
     "UPSTREAM_TASK_NOT_FOUND"),
    ("INTERNAL", "INTERNAL: RuntimeError: injected", "INTERNAL"),
    (None, "read failed: HTTP 500", "UPSTREAM_TIMEOUT"),
    ("SOME_OTHER_CODE", "SOME_OTHER_CODE: x", "UPSTREAM_TIMEOUT"),
])
@pytest.mark.parametrize("legacy", [False, True])
def test_exhaustion_decides_from_the_column_and_a_legacy_row_the_same(
        world: World, code: str | None, text: str, expected: str, legacy: bool) -> None:
    """The column decides; a legacy row (code NULL, the same text) decides the same. The
    message is the text after the code either way."""
    w = world
    job_id = w.accept(KIND, RUNNING)
    if legacy and code == "SOME_OTHER_CODE":
        expected = "UPSTREAM_TIMEOUT"  # the legacy rule read only UPSTREAM_… and INTERNAL
    w.set(job_id, reconcile_last_error=text, reconcile_attempts=MAX_ATTEMPTS,
          reconcile_last_error_code=None if legacy else code)
    job = _exhaust(w, job_id)
    assert_refunded(w, job_id, expected)
    if expected != "UPSTREAM_TIMEOUT":
        assert job.error_message == text.split(": ", 1)[1]


def test_the_column_wins_over_the_text(world: World) -> None:
    """Once set, the code is never parsed from the text (which may say anything)."""
    w = world
    job_id = w.accept(KIND, RUNNING)
    w.set(job_id, reconcile_last_error="INTERNAL: looks internal",
          reconcile_last_error_code="UPSTREAM_MEDIA_EXPIRED", reconcile_attempts=MAX_ATTEMPTS)
    _exhaust(w, job_id)
    assert_refunded(w, job_id, "UPSTREAM_MEDIA_EXPIRED")


@pytest.mark.parametrize("past_threshold", [False, True])
def test_a_legacy_verdict_is_kept_against_an_error_without_a_code(
        world: World, past_threshold: bool) -> None:
    """A legacy row's verdict (text only) is still a verdict: a failed read keeps it (the SQL
    CASE and the Python pre-check both), and exhaustion then fails with it."""
    w = world
    job_id = w.accept(KIND, RUNNING)
    legacy = "UPSTREAM_TASK_NOT_FOUND: task not found upstream"
    w.set(job_id, reconcile_last_error=legacy, reconcile_last_error_code=None)
    w.sim.configure(read_fail_rate=1.0)
    if past_threshold:
        w.clock.advance(minutes=21)
    assert _observe(w, job_id) == "in_flight"
    assert _codes(w, job_id) == (None, legacy)
    with w.db.begin() as s:  # the SQL branch alone (no Python pre-check)
        assert jobstore.note_error(s, job_id, "read failed: again", verdict=False)
    assert _codes(w, job_id) == (None, legacy)
    w.set(job_id, reconcile_attempts=MAX_ATTEMPTS)
    _exhaust(w, job_id)
    assert_refunded(w, job_id, "UPSTREAM_TASK_NOT_FOUND")


def test_note_error_and_settle_failed_say_whether_the_row_changed(world: World) -> None:
    w = world
    job_id = w.accept(KIND, RUNNING)
    with w.db.begin() as s:
        assert jobstore.note_error(s, job_id, "UPSTREAM_UNKNOWN_STATUS: x",
                                   code="UPSTREAM_UNKNOWN_STATUS")
        assert not jobstore.note_error(s, uuid.uuid4(), "x")
    w.set(job_id, status="failed", next_poll_at=w.clock.now)
    with w.db.begin() as s:
        assert not jobstore.note_error(s, job_id, "UPSTREAM_UNKNOWN_STATUS: y")  # not in flight
        assert jobstore.settle_failed(s, job_id, w.clock.now)
    w.set(job_id, credits_actual=0)
    with w.db.begin() as s:
        assert not jobstore.settle_failed(s, job_id, w.clock.now)  # settled already
