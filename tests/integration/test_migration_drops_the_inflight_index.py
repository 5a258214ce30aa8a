"""Attack on migration 0022 (drop jobs_inflight_idx): round trips, a platform's own index of that
name, alembic check, and the sweep's candidate plans at a few thousand rows."""

from __future__ import annotations

import subprocess
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from reconcile.db.migrate import downgrade, upgrade
from tests.conftest import PgDatabases
from tests.integration.test_migrations import ALEMBIC, PLATFORM_DDL, ROOT

PLATFORM_INDEX = ("CREATE INDEX jobs_inflight_idx ON jobs (created_at) "
                  "WHERE status IN ('pending', 'processing')")


def _psql(url: str) -> psycopg.Connection:
    return psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True)


def _indexdef(url: str, name: str) -> tuple[str, bool] | None:
    with _psql(url) as conn:
        row = conn.execute("SELECT pg_get_indexdef(c.oid), i.indisvalid FROM pg_class c "
                           "JOIN pg_index i ON i.indexrelid = c.oid WHERE c.relname = %s",
                           (name,)).fetchone()
    return None if row is None else (row[0], row[1])


def _check(url: str) -> None:
    result = subprocess.run([*ALEMBIC, "-x", f"url={url}", "check"], capture_output=True,
                            text=True, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_pg_round_trip_twice_then_alembic_check_is_clean(pg_databases: PgDatabases) -> None:
    url = pg_databases.create("atk0022")
    upgrade(url)
    keyset = _indexdef(url, "jobs_inflight_keyset_idx")
    assert keyset is not None and keyset[1]
    for _ in range(2):
        downgrade(url, "0021")
        one = _indexdef(url, "jobs_inflight_idx")
        assert one is not None and one[1]
        assert "(provider_call_started_at)" in one[0] and "pending" in one[0]
        upgrade(url)
        assert _indexdef(url, "jobs_inflight_idx") is None
        assert _indexdef(url, "jobs_inflight_keyset_idx") == keyset
    _check(url)
    # past 0022 down to 0018 and back: 0019's keyset index goes and comes back with 0022 applied
    downgrade(url, "0018")
    assert _indexdef(url, "jobs_inflight_keyset_idx") is None
    assert _indexdef(url, "jobs_inflight_idx") is not None
    upgrade(url)
    assert _indexdef(url, "jobs_inflight_idx") is None
    _check(url)


def test_sqlite_round_trip(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'r.db'}"
    upgrade(url)

    def names() -> set[str]:
        engine = sa.create_engine(url)
        with engine.connect() as conn:
            found = {r[0] for r in conn.exec_driver_sql(
                "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'jobs'")}
        engine.dispose()
        return found

    assert "jobs_inflight_idx" not in names() and "jobs_inflight_keyset_idx" in names()
    downgrade(url, "0021")
    assert "jobs_inflight_idx" in names()
    upgrade(url)
    assert "jobs_inflight_idx" not in names() and "jobs_inflight_keyset_idx" in names()


def test_platform_that_created_the_same_index_itself(pg_databases: PgDatabases) -> None:
    """A platform that added provider_call_started_at and the same partial index before
    adopting: 0002 keeps its index, 0022 drops it (its queries move to the keyset
    index: README, Migrations, beside the platform's own), a downgrade rebuilds it valid."""
    url = pg_databases.create("atkplat")
    with _psql(url) as conn:
        conn.execute(PLATFORM_DDL)
        conn.execute("ALTER TABLE jobs ADD COLUMN provider_call_started_at timestamptz")
        conn.execute("CREATE INDEX jobs_inflight_idx ON jobs (provider_call_started_at) "
                     "WHERE status IN ('pending', 'processing')")
        conn.execute("INSERT INTO jobs (id, user_id, job_type, status, provider_call_started_at)"
                     " VALUES (%s, %s, 'image', 'processing', now())", (uuid.uuid4(), uuid.uuid4()))
    upgrade(url)
    assert _indexdef(url, "jobs_inflight_idx") is None
    assert _indexdef(url, "jobs_inflight_keyset_idx") is not None
    _check(url)
    downgrade(url, "0021")
    assert _indexdef(url, "jobs_inflight_idx") is not None
    upgrade(url)
    with _psql(url) as conn:
        assert conn.execute("SELECT count(*) FROM jobs WHERE status = 'processing'"
                            ).fetchone() == (1,)
        assert conn.execute("SELECT version_num FROM alembic_version").fetchone() == (
            "platform_042",)


def test_platform_index_of_that_name_on_another_column_survives(pg_databases: PgDatabases
                                                                ) -> None:
    url = pg_databases.create("atkplat2")
    with _psql(url) as conn:
        conn.execute(PLATFORM_DDL)
        conn.execute(PLATFORM_INDEX)
    before = _indexdef(url, "jobs_inflight_idx")
    assert before is not None and "(created_at)" in before[0]
    upgrade(url)
    assert _indexdef(url, "jobs_inflight_idx") == before


def _rows(db: sessionmaker[Session], now: datetime) -> None:
    """5,000 rows: mostly terminal history, 400 in flight started, 100 unstarted, 100 failed
    awaiting settlement."""
    with db.begin() as s:
        conn = s.connection()
        conn.exec_driver_sql(
            "INSERT INTO jobs (id, user_id, job_type, status, provider_kind, provider_task_id, "
            "provider_call_started_at, next_poll_at, created_at) "
            "SELECT gen_random_uuid(), gen_random_uuid(), 'image', "
            "CASE WHEN g <= 400 THEN 'processing' WHEN g <= 500 THEN 'pending' "
            "     WHEN g <= 600 THEN 'failed' ELSE 'completed' END, 'kie-standard', 't', "
            "CASE WHEN g > 400 AND g <= 500 THEN NULL ELSE %(now)s - g * interval '1 second' END, "
            "CASE WHEN g > 500 AND g <= 600 THEN %(now)s - g * interval '1 second' END, "
            "%(now)s - g * interval '1 minute' FROM generate_series(1, 5000) AS g",
            {"now": now})
        conn.exec_driver_sql("ANALYZE jobs")


@pytest.mark.parametrize("mid_cursor", [False, True])
def test_candidate_plans_at_5000_rows_use_the_keyset_and_unsettled_indexes(
        db: sessionmaker[Session], mid_cursor: bool) -> None:
    from reconcile.sweep import _phases

    now = datetime.now(UTC)
    _rows(db, now)
    cursors = {"unstarted": (uuid.UUID(int=2**127),),
               "started": (now - timedelta(seconds=200), uuid.UUID(int=2**127)),
               "unsettled": (now - timedelta(seconds=550), uuid.UUID(int=2**127))}
    want = {"unstarted": "jobs_inflight_keyset_idx", "started": "jobs_inflight_keyset_idx",
            "unsettled": "jobs_unsettled_idx"}
    for phase, query in _phases(now):
        stmt = query(cursors[phase] if mid_cursor else None).limit(25).with_for_update(
            skip_locked=True)
        with db() as s:
            conn = s.connection()
            compiled = stmt.compile(dialect=conn.dialect)
            plan = "\n".join(r[0] for r in conn.exec_driver_sql(
                "EXPLAIN " + str(compiled), compiled.params).all())
        assert want[phase] in plan, (phase, plan)
        assert "jobs_inflight_idx " not in plan and "Seq Scan" not in plan, (phase, plan)
