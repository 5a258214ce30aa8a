"""Issue 18: countdowns within the broker's limits, the start-up check, the broker-loss fix."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
from kombu import Connection

from reconcile import Settings
from reconcile.testing.processes import ROOT, free_port
from reconcile.worker import broker


def conf(url: str, *, time_limit: int = 600, visibility: int | None = 3600) -> SimpleNamespace:
    options = {} if visibility is None else {"visibility_timeout": visibility}
    return SimpleNamespace(broker_url=url, task_time_limit=time_limit,
                           broker_transport_options=options)


def test_every_countdown_is_capped() -> None:
    settings = Settings(max_countdown=300)
    assert broker.cap_countdown(1800.0, settings) == 300.0
    assert broker.cap_countdown(12.5, settings) == 12.5
    assert broker.cap_countdown(-1.0, settings) == 0.0


def test_the_defaults_fit_both_brokers() -> None:
    settings = Settings()
    assert broker.limit_problems(conf("redis://127.0.0.1:6379/0"), settings) == []
    assert broker.limit_problems(conf("amqp://guest@127.0.0.1//", visibility=None), settings) == []
    from reconcile import celery_settings

    assert celery_settings.worker_cancel_long_running_tasks_on_connection_loss is False
    assert celery_settings.worker_soft_shutdown_timeout > 0
    assert celery_settings.worker_enable_soft_shutdown_on_idle is True


@pytest.mark.parametrize("url,kw,settings,needle", [
    ("redis://h/0", {"visibility": 600}, {}, "visibility timeout 600"),
    ("redis://h/0", {"visibility": 3600, "time_limit": 3400}, {}, "3700"),
    ("amqp://h//", {"visibility": None}, {"broker_consumer_timeout": 600}, "consumer_timeout 600"),
    ("redis://h/0", {"time_limit": 0}, {}, "task_time_limit is unset"),
])
def test_limits_that_a_delivery_could_outlive_are_refused(url: str, kw: dict, settings: dict,
                                                          needle: str) -> None:
    problems = broker.limit_problems(conf(url, **kw), Settings(**settings))
    assert any(needle in p for p in problems), problems
    with pytest.raises(broker.UnsafeBrokerLimits):
        broker.refuse_unsafe_limits(conf(url, **kw), Settings(**settings))


def test_collect_forgets_the_default_channel() -> None:
    """The Celery 5.7.0 defect's trigger: ``close()`` after ``collect()`` must not find the
    collected connection's default channel (it would rebuild a pool from a dropped transport)."""
    broker.survive_broker_loss()
    connection = Connection("memory://")
    assert connection.default_channel is not None
    connection.collect()
    assert connection._default_channel is None
    connection.close()  # nothing stale left to close


def test_a_worker_refuses_to_start_past_the_visibility_timeout() -> None:
    """A real ``celery worker`` with countdown + time limit above the visibility timeout exits
    at start-up, naming the rule (it never reaches the broker: nothing listens there)."""
    env = {**os.environ, "RECONCILE_BROKER_URL": f"redis://127.0.0.1:{free_port()}/0",
           "RECONCILE_BROKER_VISIBILITY_TIMEOUT": "100", "RECONCILE_DATABASE_URL": "sqlite://"}
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "reconcile.celery_app", "worker", "--pool=solo",
         "--without-gossip", "--without-mingle", "--without-heartbeat"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "UnsafeBrokerLimits" in done.stdout + done.stderr
    assert "visibility timeout 100" in done.stdout + done.stderr
