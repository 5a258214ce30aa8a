"""The platform's timestamp columns mean UTC whatever the session's time zone (issue 24, finding 7).

A platform may keep ``jobs``/``usage_logs`` timestamps as ``timestamp without time zone`` holding
UTC (Rails does), on a server whose zone is not UTC. PostgreSQL converts an instant to and from
such a column in the session's zone, so before the fix the library stored local wall time and
read it back as UTC: in America/New_York a just-submitted sync job read as 5 hours old and the
next sweep failed and refunded it; in Asia/Tokyo a lost create was not re-enqueued for 9 hours.

Every test runs on both zones, both column types, and both ways of getting the zone: the
database's default (``ALTER DATABASE … SET timezone``) and the session's (the URL's
``options=-c TimeZone=…``, as a platform's connection string may carry it).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session, sessionmaker

from reconcile import lifecycle
from reconcile.db.models import Job, UsageLog
from reconcile.db.session import make_engine
from reconcile.testing.platform_schema import (
    platform_ddl,
)
from reconcile.testing.simulator import Script, Simulator
from tests.conftest import PgDatabases
from tests.integration import harness
from tests.integration._platform_db import clean_sessions, plain, platform_database
from tests.integration._sweep_helpers import INSTANT, World, assert_refunded

ZONES = ("America/New_York", "Asia/Tokyo")
SHAPES = [(zone, naive, level) for zone in ZONES for naive in (True, False)
          for level in ("database", "session")]


def _platform_conn(zoned: dict[str, Any]) -> psycopg.Connection[Any]:
    """A plain connection as the platform opens one: in the zone under test (the database's
    default, or the session zone its connection string asks for)."""
    extra = {"options": f"-c TimeZone={zoned['zone']}"} if zoned["level"] == "session" else {}
    return psycopg.connect(plain(zoned["url"].split("?")[0]), autocommit=True, **extra)


@pytest.fixture(scope="module", params=SHAPES,
                ids=[f"{z.split('/')[1]}-{'naive' if n else 'tz'}-{lv}" for z, n, lv in SHAPES])
def zoned(request: pytest.FixtureRequest, pg_databases: PgDatabases) -> Iterator[dict[str, Any]]:
    """A migrated platform-shaped database in a non-UTC zone: (url, engine, naive)."""
    zone, naive, level = request.param
    url, engine = platform_database(pg_databases, "rtzone", naive=naive, zone=zone, level=level)
    yield {"url": url, "engine": engine, "naive": naive, "zone": zone, "level": level}
    engine.dispose()


@pytest.fixture
def zdb(zoned: dict[str, Any]) -> sessionmaker[Session]:
    engine: Engine = zoned["engine"]
    return clean_sessions(engine)


@pytest.fixture(params=["batch", "chain"])
def zworld(zdb: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
           request: pytest.FixtureRequest) -> World:
    """Both poll modes' writers (batch, the default: the batch poller's claims and writes)."""
    return World(zdb, simulator, tmp_path, poll_mode=request.param)


def test_the_shape_is_what_the_test_says(zoned: dict[str, Any]) -> None:
    """The fixture really has naive columns (or not) and a session zone that is not UTC for a
    plain connection (the platform's own view): the tests below test what they claim."""
    with _platform_conn(zoned) as conn:
        assert conn.execute("SHOW TimeZone").fetchone() == (zoned["zone"],)
        types = dict(conn.execute(
            "SELECT table_name || '.' || column_name, data_type FROM information_schema.columns "
            "WHERE table_name IN ('jobs', 'usage_logs') AND column_name IN "
            "('created_at', 'started_at', 'completed_at')").fetchall())
    want = "timestamp without time zone" if zoned["naive"] else "timestamp with time zone"
    assert types == dict.fromkeys(["jobs.created_at", "jobs.started_at", "jobs.completed_at",
                                   "usage_logs.created_at"], want)
    with zoned["engine"].connect() as conn:  # the library's own sessions run in UTC
        assert conn.execute(text("SHOW TimeZone")).scalar_one() == "UTC"


def test_a_just_submitted_sync_job_is_not_swept_before_its_threshold(zworld: World) -> None:
    """New York: the job read as 5 hours old and the next tick failed + refunded it before its
    call ran. It is left until its 5-minute threshold, and failed + refunded after it (Tokyo: it
    read as 9 hours in the future and was never failed)."""
    job_id = zworld.submit("elevenlabs-sync")
    zworld.tick()
    assert zworld.job(job_id).status == "pending" and zworld.refunds(job_id) == 0
    zworld.clock.advance(minutes=4)
    zworld.tick()
    assert zworld.job(job_id).status == "pending" and zworld.refunds(job_id) == 0
    zworld.clock.advance(minutes=2)
    zworld.tick()
    assert_refunded(zworld, job_id)


def test_a_lost_create_is_reenqueued_after_two_minutes_not_hours(zworld: World) -> None:
    """Tokyo: a create lost with the broker read as created 9 hours in the future and was not
    re-enqueued for 9 hours (New York: re-enqueued at once). Re-enqueued after 2 min, not at 1."""
    job_id = zworld.submit("kie-standard")
    zworld.clock.advance(minutes=1)
    zworld.tick()
    assert zworld.q.create_calls == 0
    zworld.clock.advance(minutes=2)
    zworld.tick()
    assert list(zworld.q.creates) == [job_id]


def test_every_time_column_written_on_the_platforms_tables_reads_back_as_written(
        zworld: World, zoned: dict[str, Any]) -> None:
    """Submit (jobs.created_at, usage_logs.created_at), create (jobs.started_at), complete
    (jobs.completed_at), each at its own instant: the library reads back the instant written,
    and the stored value means UTC for the platform too (a naive column holds UTC wall time,
    read on a plain connection in the non-UTC zone)."""
    w = zworld
    w.clock.now = datetime(2026, 3, 8, 6, 59, 58, 123456, tzinfo=UTC)  # around New York's DST switch
    submitted = w.clock.now
    job_id = w.submit("kie-standard")
    w.sim.script(str(job_id), Script(timeline=INSTANT))
    created = w.clock.advance(seconds=7.25)
    assert lifecycle.create_step(w.rt, job_id).action == "accepted"
    completed = w.clock.advance(minutes=1, microseconds=3)
    harness.drain(w.rt, w.q)
    want = {"jobs.created_at": submitted, "jobs.started_at": created,
            "jobs.completed_at": completed, "usage_logs.created_at": submitted}

    job = w.job(job_id)
    assert job.status == "completed", (job.status, job.error_code)
    with w.db() as s:
        log = s.query(UsageLog).filter(UsageLog.job_id == job_id).one()
        again = s.get(Job, job_id)
        assert again is not None
    assert {"jobs.created_at": job.created_at, "jobs.started_at": job.started_at,
            "jobs.completed_at": job.completed_at, "usage_logs.created_at": log.created_at} == want

    with _platform_conn(zoned) as conn:
        row = conn.execute("SELECT j.created_at, j.started_at, j.completed_at, u.created_at "
                           "FROM jobs j JOIN usage_logs u ON u.job_id = j.id WHERE j.id = %s",
                           (job_id,)).fetchone()
    assert row is not None
    stored = [v.replace(tzinfo=UTC) if zoned["naive"] else v.astimezone(UTC) for v in row]
    if zoned["naive"]:
        assert all(v.tzinfo is None for v in row)
    assert dict(zip(want, stored, strict=True)) == want


def test_a_platform_row_in_naive_utc_is_aged_from_its_utc_time(
        zworld: World, zoned: dict[str, Any]) -> None:
    """A row the platform wrote itself (naive UTC, as Rails writes it; or an instant): the
    sweep's untracked-row threshold counts from that UTC time, not from a shifted one."""
    w = zworld
    row_id = uuid.uuid4()
    created = w.clock.now - timedelta(minutes=2)
    value = created.replace(tzinfo=None) if zoned["naive"] else created
    with _platform_conn(zoned) as conn:  # the platform's own connection, in its zone
        conn.execute("INSERT INTO jobs (id, user_id, job_type, status, provider_kind, created_at, "
                     "started_at) VALUES (%s, %s, 'image', 'processing', 'elevenlabs-sync', %s, %s)",
                     (row_id, w.user, value, value))
    with w.db.begin() as s:
        w.rt.ledger.reserve(s, w.user, row_id, 40, now=created)
    w.tick()
    assert w.job(row_id).status == "processing" and w.refunds(row_id) == 0
    w.clock.advance(minutes=4)
    w.tick()
    assert_refunded(w, row_id)


def test_platform_ddl_naive_changes_only_the_timestamp_type() -> None:
    tz, naive = platform_ddl(), platform_ddl(naive=True)
    assert "timestamptz" in tz and "timestamptz" not in naive
    assert naive.replace("timestamp without time zone", "timestamptz") == tz


def test_a_session_handed_back_in_another_zone_is_put_back_in_utc(
        zoned: dict[str, Any]) -> None:
    """A pooled session whose zone changed under the library (a ``RESET ALL`` back to the
    database's zone, a ``SET`` by other code, a pooler handing over another client's session) is
    in UTC again when it next leaves the pool: the zone the server reports is checked at every
    checkout, not only when the connection was opened."""
    engine = make_engine(zoned["url"], pool_size=1, max_overflow=0)
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SHOW TimeZone")).scalar_one() == "UTC"
            pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
            conn.exec_driver_sql("RESET ALL")  # back to the database's or the URL's zone
            conn.commit()
            assert conn.execute(text("SHOW TimeZone")).scalar_one() == zoned["zone"]
        with engine.connect() as conn:  # the same pooled connection, checked out again
            assert conn.execute(text("SELECT pg_backend_pid()")).scalar_one() == pid
            assert conn.execute(text("SHOW TimeZone")).scalar_one() == "UTC"
    finally:
        engine.dispose()
