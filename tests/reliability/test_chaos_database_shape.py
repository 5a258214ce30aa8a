"""The chaos run's database shape (issue 24, section 3): ``--db-timezone`` and
``--naive-timestamps`` (``make chaos DB_TZ=… NAIVE=1``) build what they say, the replay line
repeats them, and the run's time check flags a timestamp a session zone shifted.

The full runs are ``make chaos``'s; these check the pieces without workers."""

from __future__ import annotations

import importlib
import uuid
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from reconcile.db.migrate import upgrade
from reconcile.testing.chaos import ChaosConfig, ChaosReport, checks as chaos_checks
from tests.conftest import PG_ADMIN_URL, PgDatabases
from tests.integration.harness import fund

chaos_run = importlib.import_module("reconcile.testing.chaos.run")  # the package's run() shadows it


def test_the_options_reach_the_config_and_the_replay_line(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[ChaosConfig] = []

    def fake_run(config: ChaosConfig) -> ChaosReport:
        seen.append(config)
        return ChaosReport(seed=7, plan_digest="d", jobs=config.jobs, by_kind={}, kills=0,
                           worker_restarts=0, unplanned_worker_exits=0, redis_restarts=0,
                           pg_terminations=0, submit_failed=0, pg_backends_terminated=0,
                           sweeps=0, sweep_errors=0, recovered=0, completed=0, failed=0,
                           refunded=0, uncertain=[], orphans=0, lost_publishes=0,
                           webhook_answers={}, violations=[], seconds=1.0, throughput=0.0,
                           options=config.shape_options())

    monkeypatch.setattr(chaos_run, "run", fake_run)
    assert chaos_run.main(["--jobs", "5", "--seed", "7", "--db-timezone", "Asia/Tokyo",
                           "--naive-timestamps", "--quiet"]) == 0
    config = seen[-1]
    assert (config.jobs, config.seed, config.quiet) == (5, 7, True)
    assert (config.db_timezone, config.naive_timestamps) == ("Asia/Tokyo", True)
    report = fake_run(config)
    assert report.text().endswith("--jobs 5 --seed 7 --db-timezone Asia/Tokyo --naive-timestamps")
    assert chaos_run.main(["--jobs", "5", "--quiet"]) == 0  # the existing usage is unchanged
    assert (seen[-1].db_timezone, seen[-1].naive_timestamps, seen[-1].shape_options()) == (
        None, False, [])


def test_the_database_gets_the_zone_and_the_naive_platform_tables(
        pg_databases: PgDatabases) -> None:
    url = pg_databases.create("rtchaosdb")
    name = url.rsplit("/", 1)[1]
    config = ChaosConfig(pg_admin=PG_ADMIN_URL, db_timezone="America/New_York",
                         naive_timestamps=True)
    chaos_run._shape_database(config, name)
    upgrade(url)
    assert chaos_run._database_shape(config, name, url) == (
        "TimeZone=America/New_York (library sessions: UTC), "
        "platform timestamps: timestamp without time zone")
    with pytest.raises(ValueError, match="unknown time zone"):
        chaos_run._shape_database(ChaosConfig(pg_admin=PG_ADMIN_URL, db_timezone="Mars/Olympus"),
                                  name)


def test_a_time_shifted_by_a_session_zone_is_a_violation(db: sessionmaker[Session]) -> None:
    """The run's window on the wall clock: a value 5 hours early (New York wall time read as
    UTC) or 9 hours late (Tokyo) is reported, a value inside it is not."""
    from reconcile import credits

    now = datetime.now(UTC)
    rt = SimpleNamespace(sessions=db)
    user, job_id = uuid.uuid4(), uuid.uuid4()
    fund(db, user, 100)

    def job(**times: Any) -> Any:
        return SimpleNamespace(id=job_id, **{"created_at": now, "started_at": None,
                                             "completed_at": None, **times})

    assert chaos_checks._times_outside_run(rt, [job(started_at=now)], now, 60.0) == []
    shifted = chaos_checks._times_outside_run(
        rt, [job(created_at=now - timedelta(hours=5), completed_at=now + timedelta(hours=9))],
        now, 60.0)
    assert [v.split("=")[0] for v in shifted] == [f"time_outside_run {job_id} jobs.created_at",
                                                  f"time_outside_run {job_id} jobs.completed_at"]
    with db.begin() as s:
        credits.reserve(s, user, job_id, 40, now=now - timedelta(hours=5))
    assert [v.split("=")[0] for v in chaos_checks._times_outside_run(rt, [], now, 60.0)] == [
        "time_outside_run usage_logs.created_at"]
