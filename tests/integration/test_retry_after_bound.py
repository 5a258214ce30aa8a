"""Issue 24 finding 9: a create's 429 ``Retry-After`` is parsed defensively and its wait is capped
below the job's exhaustion horizon (``reconcile.jobstore.horizon``).

On main ``Retry-After: 7200`` kept a kie-standard job (threshold 10 min + 18 × 5 min) waiting
``not_started`` with its credits held past its horizon, and the audit reported
``in_flight_past_horizon``; an absurd value (``1e12``, a far-future HTTP date, ``inf``,
``1e999``) raised ``OverflowError`` out of ``create_step`` with the claim still held, so the sweep
later made the job ``uncertain`` although a 429 means "not created". Each header below goes
through the real KIE client against the simulator (the header is sent as written).
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from reconcile import credits, lifecycle
from reconcile.db.models import Job
from reconcile.kinds import get_kind
from reconcile.providers.http import parse_retry_after
from reconcile.sweep import sweep
from reconcile.testing import sim_kie
from reconcile.testing.simulator import Script, Simulator
from tests.integration.harness import Clock, drain, fund, make_runtime
from tests.integration.test_api import KIE, KIE_MODEL, T0

INSTANT = ((0.0, "queued"), (0.0, "succeeded"))

HEADERS = {
    "7200": "7200",  # 2 h: past kie-standard's 100-minute horizon
    "1e12": "1e12",
    "far_future_date": "Fri, 31 Dec 9999 23:59:59 GMT",
    "inf": "inf",
    "1e999": "1e999",
    "garbage": "soon, I promise",
    "negative": "-30",
}


def _submit(rt: object, db: sessionmaker[Session], simulator: Simulator, header: str,
            monkeypatch: pytest.MonkeyPatch) -> uuid.UUID:
    user = uuid.uuid4()
    fund(db, user)
    job_id = lifecycle.submit_job(rt, user, KIE, KIE_MODEL, {"prompt": "x"}, 40,  # type: ignore[arg-type]
                                  job_type="image", enqueue=False).job_id
    monkeypatch.setattr(sim_kie, "retry_after_header", lambda script: {"Retry-After": header})
    simulator.script(str(job_id), Script(create="rate_limit", rate_limit_times=1,
                                         timeline=INSTANT))
    return job_id


def _job(db: sessionmaker[Session], job_id: uuid.UUID) -> Job:
    with db() as s:
        job = s.get(Job, job_id)
        assert job is not None
        return job


@pytest.mark.parametrize("name", list(HEADERS))
def test_a_429_is_never_uncertain_and_waits_within_the_horizon(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """The 429 releases the claim (``not_started``, never a raise, never ``uncertain``) with a
    not-before time inside the job's horizon; the sweep then runs the create again in time, the
    job completes and is charged once, and the audit is clean at every tick on the way."""
    clock = Clock(T0)
    rt, queues = make_runtime(db, simulator, tmp_path, clock=clock)
    job_id = _submit(rt, db, simulator, HEADERS[name], monkeypatch)
    assert lifecycle.create_step(rt, job_id).action == "rate_limited"
    job = _job(db, job_id)
    assert (job.status, job.submission_state) == ("pending", "not_started")
    kind = get_kind(KIE)
    assert kind is not None
    horizon = T0 + kind.stale_threshold + timedelta(minutes=5) * 18
    assert job.create_not_before is not None and T0 < job.create_not_before < horizon
    for _ in range(40):  # 5-minute sweep ticks: 200 minutes at most
        clock.advance(minutes=5)
        sweep(rt)
        drain(rt, queues)
        with db() as s:
            found = credits.audit(s, now=clock.now, settings=rt.settings)
        assert [(d.kind, d.detail) for d in found] == [], clock.now - T0
        job = _job(db, job_id)
        assert job.submission_state != "uncertain"
        if job.status == "completed":
            break
    assert (job.status, job.credits_actual) == ("completed", 40)
    assert simulator.creates(str(job_id)) == 1


def test_a_429_with_no_room_left_before_the_horizon_is_rejected_and_refunded(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A job whose first create ran near the end of its horizon (its provider call started long
    ago) and is told to wait: no wait fits, so it is rejected ``UPSTREAM_RATE_LIMITED`` and
    refunded in full at once (not created), never held past its horizon."""
    clock = Clock(T0)
    rt, queues = make_runtime(db, simulator, tmp_path, clock=clock)
    job_id = _submit(rt, db, simulator, "60", monkeypatch)
    from sqlalchemy import update

    with db.begin() as s:  # its first create was claimed 97 minutes ago (horizon: 100)
        s.execute(update(Job).where(Job.id == job_id)
                  .values(provider_call_started_at=T0 - timedelta(minutes=97)))
    assert lifecycle.create_step(rt, job_id).action == "rejected"
    job = _job(db, job_id)
    assert (job.status, job.submission_state, job.error_code, job.credits_actual) == \
        ("failed", "rejected", "UPSTREAM_RATE_LIMITED", 0)
    assert (job.error_detail or {}).get("reason") == "retry_after_past_horizon"
    with db() as s:
        assert credits.audit(s, now=clock.now, settings=rt.settings) == []


@pytest.mark.parametrize("value,seconds", [
    ("120", 120.0), (" 7 ", 7.0), ("-30", 0.0), ("1e12", 1e12), ("inf", None), ("-inf", None),
    ("nan", None), ("1e999", None), ("soon", None), ("", None), (None, None),
    ("Mon, 99 Foo 2026 99:99:99 GMT", None),
])
def test_parse_retry_after_is_finite_or_none(value: str | None, seconds: float | None) -> None:
    """The one parser never hands out a non-finite wait (on main ``inf`` and ``1e999`` came
    back as ``inf``, which no ``timedelta`` can hold)."""
    assert parse_retry_after(value) == seconds


def test_a_far_future_date_is_a_finite_wait() -> None:
    got = parse_retry_after("Fri, 31 Dec 9999 23:59:59 GMT")
    assert got is not None and got > 1e11
