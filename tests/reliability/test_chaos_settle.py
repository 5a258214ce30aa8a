"""The chaos run's settle phase: a job still in flight is waited for until its liveness horizon
(the bound the library promises), not for a fixed time. CI's red run at seed 20261130 reported
5 in-flight jobs after a fixed 108 s on a slow host, while their horizon was minutes away."""

from __future__ import annotations

import importlib
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from reconcile import Settings
from reconcile.kinds import get_kind
from reconcile.states import ATTEMPT_SPACING, MAX_ATTEMPTS
from reconcile.testing.chaos import ChaosConfig, control, make_plan

chaos_run = importlib.import_module("reconcile.testing.chaos.run")  # the package's run() shadows it

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


class _Clock:
    """time.monotonic and time.sleep of the settle loop, and the runtime's wall clock, in step."""

    def __init__(self) -> None:
        self.t = 1000.0

    def monotonic(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds

    def wall(self) -> datetime:
        return NOW + timedelta(seconds=self.t - 1000.0)


def _rt(clock: _Clock) -> Any:
    settings = Settings(time_scale=0.05)
    return SimpleNamespace(settings=settings, kind=get_kind, now=clock.wall)


def _job(kind: str, status: str, started: datetime | None, created: datetime) -> Any:
    return SimpleNamespace(provider_kind=kind, status=status, provider_call_started_at=started,
                           started_at=None, created_at=created, submission_state="accepted",
                           reconcile_attempts=0, reconcile_last_attempt_at=None,
                           poll_lease_expires_at=None, storing_until=None, storing_count=None)


def test_the_horizon_is_the_kinds_threshold_then_every_attempt_scaled() -> None:
    rt = _rt(_Clock())
    veo = get_kind("kie-veo")
    assert veo is not None
    started = NOW - timedelta(seconds=10)
    expected = started + (veo.stale_threshold + ATTEMPT_SPACING * (MAX_ATTEMPTS + 1)) * 0.05
    assert chaos_run._horizon(rt, _job("kie-veo", "processing", started, NOW)) == expected
    # no provider call yet: from its creation
    assert chaos_run._horizon(rt, _job("kie-veo", "pending", None, started)) == expected
    # terminal, waiting for its settlement: the floor only
    assert chaos_run._horizon(rt, _job("kie-veo", "failed", started, started)) == started


def _state(tmp_path: Path, settle_timeout: float) -> control._Run:
    config = ChaosConfig(jobs=10, seed=1, settle_timeout=settle_timeout, quiet=True)
    return control._Run(config, make_plan(1, 10), tmp_path)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    clock = _Clock()
    monkeypatch.setattr(chaos_run.time, "monotonic", clock.monotonic)
    monkeypatch.setattr(chaos_run.time, "sleep", clock.sleep)
    monkeypatch.setattr("reconcile.sweep.sweep", lambda rt: None)  # the last quiet tick
    return clock


def test_a_job_within_its_horizon_is_waited_for_past_the_floor(
        tmp_path: Path, clock: _Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    """The floor (5 s) is over long before the job's horizon (200 s): the wait goes on until the
    job settles at 150 s."""
    job = uuid.uuid4()
    horizon = NOW + timedelta(seconds=200)
    monkeypatch.setattr(chaos_run, "_unsettled",
                        lambda rt: [(job, horizon)] if clock.t < 1150.0 else [])
    state = _state(tmp_path, settle_timeout=5.0)
    chaos_run._settle(state, _rt(clock), sim=None)
    assert 150.0 <= state.settle_seconds < 152.0
    assert state.stop.is_set()


def test_a_job_past_its_horizon_ends_the_wait_once_the_floor_is_over(
        tmp_path: Path, clock: _Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job the library lost (never settles) is reported: the wait ends at the later of its
    horizon (30 s) and the floor (60 s), not at the cap."""
    job = uuid.uuid4()
    monkeypatch.setattr(chaos_run, "_unsettled",
                        lambda rt: [(job, NOW + timedelta(seconds=30))])
    state = _state(tmp_path, settle_timeout=60.0)
    chaos_run._settle(state, _rt(clock), sim=None)
    assert 60.0 <= state.settle_seconds < 62.0


def test_an_unreachable_database_ends_the_wait_at_the_cap(
        tmp_path: Path, clock: _Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    """None (the database does not answer) never ends the wait by itself; the cap does: the
    floor plus the longest horizon of the run's kinds."""
    monkeypatch.setattr(chaos_run, "_unsettled", lambda rt: None)
    state = _state(tmp_path, settle_timeout=10.0)
    rt = _rt(clock)
    chaos_run._settle(state, rt, sim=None)
    longest = max(get_kind(k).stale_threshold for k in chaos_run.FAMILIES)  # type: ignore[union-attr]
    cap = 10.0 + ((longest + ATTEMPT_SPACING * (MAX_ATTEMPTS + 1)) * 0.05).total_seconds()
    assert cap <= state.settle_seconds < cap + 2.0


def test_a_job_whose_attempts_started_over_is_waited_for_until_the_librarys_own_horizon() -> None:
    """An ``uncertain`` job adopted late (jobstore.adopt_task_id: attempts reset, a new poll
    lease; its provider call started long before) gets every attempt again from its adoption:
    the library itself (the audit's in-flight horizon) does not hold it past its horizon for
    another ~18 spacings. On main the settle phase's horizon counted from the provider call
    only, so it stopped waiting and reported a job the library still promises to finish."""
    from reconcile.audit._jobs import _past_horizon

    rt = _rt(_Clock())
    veo = get_kind("kie-veo")
    assert veo is not None
    scaled = rt.settings.scaled
    started = NOW - scaled(veo.stale_threshold + ATTEMPT_SPACING * 10)
    adopted = NOW  # evidence found now: attempts start over
    job = SimpleNamespace(
        id=uuid.uuid4(), user_id=uuid.uuid4(), provider_kind="kie-veo", status="processing",
        submission_state="accepted", provider_call_started_at=started, started_at=started,
        created_at=started, reconcile_attempts=0, reconcile_last_attempt_at=None,
        poll_lease_expires_at=adopted + timedelta(seconds=30), storing_until=None,
        storing_count=None)
    horizon = chaos_run._horizon(rt, job)

    def library_says_late(at: datetime) -> bool:
        return _past_horizon(SimpleNamespace(settings=rt.settings, grace=timedelta(0), now=at),
                             job) is not None

    # the wait lasts until the library itself calls the job late (on main: ~3 minutes before)
    assert library_says_late(horizon + timedelta(seconds=1)), (horizon, started)
    # and no longer than every attempt again from the new lease, plus one spacing
    assert horizon == job.poll_lease_expires_at + scaled(ATTEMPT_SPACING * (MAX_ATTEMPTS + 1))


def test_a_job_attempted_on_schedule_keeps_the_horizon_from_its_provider_call() -> None:
    """Attempts counted one spacing apart move nothing: the horizon stays the threshold then
    every attempt after the provider call (the lost-job bound is unchanged)."""
    rt = _rt(_Clock())
    veo = get_kind("kie-veo")
    assert veo is not None
    scaled = rt.settings.scaled
    started = NOW - timedelta(seconds=10)
    job = SimpleNamespace(
        provider_kind="kie-veo", status="processing", provider_call_started_at=started,
        started_at=started, created_at=started, submission_state="accepted", reconcile_attempts=5,
        reconcile_last_attempt_at=started + scaled(veo.stale_threshold + ATTEMPT_SPACING * 4),
        poll_lease_expires_at=None, storing_until=None, storing_count=None)
    assert chaos_run._horizon(rt, job) == started + scaled(
        veo.stale_threshold + ATTEMPT_SPACING * (MAX_ATTEMPTS + 1))


def test_a_sync_job_is_waited_for_until_the_librarys_own_sync_horizon() -> None:
    """The settle wait's horizon is the library's one rule (``jobstore.horizon``): a sync kind
    has no attempts, so its job is late one spacing after its threshold (or its call's claim).
    The chaos copy gave every kind ``MAX_ATTEMPTS + 1`` spacings after its threshold, a sync
    call too (a 100-minute wait for a job the sweep fails after 5); the two copies disagreed
    and the library's bound is kept. Fails on main (threshold + 19 spacings)."""
    rt = _rt(_Clock())
    llm = get_kind("anthropic-sync")
    assert llm is not None and llm.sync
    scaled = rt.settings.scaled
    started = NOW - timedelta(seconds=10)
    job = SimpleNamespace(
        provider_kind="anthropic-sync", status="pending", provider_call_started_at=started,
        started_at=started, created_at=started, submission_state="submitting",
        reconcile_attempts=0, reconcile_last_attempt_at=None, poll_lease_expires_at=None,
        claim_expires_at=None)
    assert chaos_run._horizon(rt, job) == started + scaled(llm.stale_threshold + ATTEMPT_SPACING)
