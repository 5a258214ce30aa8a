"""Every number setting is bounded at start-up: NaN, infinity and negative values are refused
with the setting's name, from the constructor and from the environment, never found later at a
call (a read timeout of ``inf`` that never ends, a ``time_scale`` of 0 that makes every lease
end at once, a negative retention that prunes what was written a second ago)."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from typing import Any

import pytest
from pydantic import ValidationError

from reconcile import Settings
from reconcile.settings import (
    MAX_RETENTION_DAYS,
    MAX_SECONDS,
    MAX_TIME_SCALE,
    MIN_HEARTBEAT_INTERVAL,
    MIN_TIME_SCALE,
)


def _number_fields() -> dict[str, Any]:
    """Every field of the settings whose value is a number or a duration (read from the model,
    so a setting added later is covered without editing this list)."""
    fields = type(Settings()).model_fields
    numeric = (int, float, timedelta, Fraction)
    return {name: f.annotation for name, f in fields.items()
            if any(t.__name__ in str(f.annotation) for t in numeric)}


NUMBERS = sorted(_number_fields())
FLOATS = sorted(n for n, a in _number_fields().items() if "float" in str(a))
# settings where 0 means something (a budget of 0 fans every row out; no heartbeat; no
# countdown; no soft shutdown; a refund share of 0)
ZERO_OK = {"sweep_time_budget", "heartbeat_interval", "max_countdown",
           "worker_soft_shutdown_timeout", "failure_refund", "cancel_refund"}


def test_the_list_is_the_settings_numbers() -> None:
    # the derivation finds the timing, size and share settings (a broken filter would pass
    # every test below on an empty list)
    assert {"read_timeout", "time_scale", "sweep_interval", "legacy_age", "media_max_bytes",
            "failure_refund", "poll_batch_size"} <= set(NUMBERS)
    assert {"read_timeout", "time_scale", "job_events_retention_days"} <= set(FLOATS)


@pytest.mark.parametrize("name", FLOATS)
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, "inf", "nan", "1e400"])
def test_a_float_setting_refuses_what_is_not_finite(name: str, value: Any) -> None:
    with pytest.raises(ValidationError) as refused:
        Settings(**{name: value})
    assert name in str(refused.value)


@pytest.mark.parametrize("name", NUMBERS)
def test_a_number_setting_refuses_a_negative_value(name: str) -> None:
    with pytest.raises(ValidationError) as refused:
        Settings(**{name: -1})
    assert name in str(refused.value)


@pytest.mark.parametrize("name", sorted(set(NUMBERS) - ZERO_OK))
def test_a_number_setting_refuses_zero_unless_zero_means_something(name: str) -> None:
    with pytest.raises(ValidationError) as refused:
        Settings(**{name: 0})
    assert name in str(refused.value)


@pytest.mark.parametrize("name", sorted(ZERO_OK))
def test_zero_is_kept_where_it_means_something(name: str) -> None:
    assert Settings(**{name: 0}) is not None


# the settings in seconds: each must stay a duration once scaled and added to now
SECONDS = sorted({"broker_visibility_timeout", "broker_consumer_timeout", "max_countdown",
                  "task_time_limit", "worker_soft_shutdown_timeout", "sweep_interval",
                  "sweep_time_budget", "poll_batch_interval", "poll_batch_time_budget",
                  "heartbeat_interval", "heartbeat_timeout", "connect_timeout", "read_timeout",
                  "sync_read_timeout", "sync_deadline"})


@pytest.mark.parametrize("name", SECONDS)
def test_a_seconds_setting_stops_where_a_scaled_duration_would_overflow(name: str) -> None:
    # 1e15 s loaded, then overflowed at start-up in celery_settings (no setting named)
    with pytest.raises(ValidationError) as refused:
        Settings(**{name: MAX_SECONDS * 10})
    assert name in str(refused.value)
    # (a heartbeat's timeout is at least twice its interval)
    extra = {"heartbeat_timeout": MAX_SECONDS} if name == "heartbeat_interval" else {}
    top = MAX_SECONDS / 2 if name == "heartbeat_interval" else MAX_SECONDS
    longest = Settings(**{name: top, "time_scale": MAX_TIME_SCALE, **extra})
    # the longest, at the largest scale, is still a date when added to now
    assert datetime.now(UTC) + longest.scaled(timedelta(seconds=getattr(longest, name)))


def test_the_time_scale_and_the_retentions_have_a_ceiling() -> None:
    for name, value in (("time_scale", MAX_TIME_SCALE * 10),
                        ("job_events_retention_days", MAX_RETENTION_DAYS * 10),
                        ("webhook_deliveries_retention_days", MAX_RETENTION_DAYS * 10)):
        with pytest.raises(ValidationError, match=name):
            Settings(**{name: value})


def test_the_time_scale_has_a_floor_where_leases_would_round_to_zero() -> None:
    # at 1e-9 a 300 s lease is 0.3 microseconds: a timedelta of 0, every claim ends as taken
    for value in (1e-9, MIN_TIME_SCALE / 2):
        with pytest.raises(ValidationError, match="time_scale"):
            Settings(time_scale=value)
    smallest = Settings(time_scale=MIN_TIME_SCALE)
    # the smallest scale keeps a one-second duration a duration (100 microseconds)
    assert smallest.scaled(timedelta(seconds=1)) >= timedelta(microseconds=100)


@pytest.mark.parametrize("value", [1e-300, 1e-6, MIN_HEARTBEAT_INTERVAL / 2])
def test_a_heartbeat_is_off_or_no_faster_than_its_floor(value: float) -> None:
    # a beat is a database write per worker process: 1e-300 s was a renewal loop on one core
    with pytest.raises(ValidationError, match="heartbeat_interval") as refused:
        Settings(heartbeat_interval=value, heartbeat_timeout=1)
    assert f"at least {MIN_HEARTBEAT_INTERVAL} s" in str(refused.value)
    assert Settings(heartbeat_interval=MIN_HEARTBEAT_INTERVAL,
                    heartbeat_timeout=1).heartbeat_interval == MIN_HEARTBEAT_INTERVAL
    assert Settings(heartbeat_interval=0).heartbeat_interval == 0


@pytest.mark.parametrize(("env", "value"), [
    ("RECONCILE_TIME_SCALE", "1e-9"), ("RECONCILE_HEARTBEAT_INTERVAL", "1e-300"),
    ("RECONCILE_READ_TIMEOUT", "inf"), ("RECONCILE_CONNECT_TIMEOUT", "nan"),
    ("RECONCILE_TIME_SCALE", "0"), ("RECONCILE_SWEEP_INTERVAL", "-300"),
    ("RECONCILE_LEGACY_AGE", "inf"), ("RECONCILE_LEGACY_AGE", "-60"),
    ("RECONCILE_JOB_EVENTS_RETENTION_DAYS", "-1"), ("RECONCILE_MEDIA_MAX_BYTES", "0"),
])
def test_the_environment_is_held_to_the_same_bounds(monkeypatch: pytest.MonkeyPatch, env: str,
                                                    value: str) -> None:
    monkeypatch.setenv(env, value)
    with pytest.raises(ValidationError) as refused:
        Settings()
    assert env.removeprefix("RECONCILE_").lower() in str(refused.value)


@pytest.mark.parametrize("name", ["job_events_retention_days",
                                  "webhook_deliveries_retention_days"])
def test_a_retention_is_held_to_the_prunes_own_minimum_at_start_up(name: str) -> None:
    # the bound reconcile prune applies (a day), refused when the settings load, not at the
    # first prune the beat runs
    with pytest.raises(ValidationError, match=name):
        Settings(**{name: 0.5})
    assert getattr(Settings(**{name: 1}), name) == 1


def test_ordinary_values_still_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RECONCILE_READ_TIMEOUT", "12.5")
    monkeypatch.setenv("RECONCILE_LEGACY_AGE", "3600")
    s = Settings(time_scale=0.01, sweep_time_budget=0, heartbeat_interval=0,
                 job_events_retention_days=1.5)
    assert (s.read_timeout, s.legacy_age, s.time_scale) == (12.5, timedelta(hours=1), 0.01)
    assert Settings().sweep_interval == 300.0
