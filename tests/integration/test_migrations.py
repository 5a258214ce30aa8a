"""Migrations: deploy-safe on PostgreSQL, correct on SQLite, and harmless to a platform."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa

from reconcile.db.migrate import downgrade, upgrade
from tests.conftest import PgDatabases

ROOT = Path(__file__).resolve().parents[2]
ALEMBIC = [sys.executable, "-m", "alembic", "-c", str(ROOT / "alembic.ini")]

PLATFORM_DDL = """
CREATE TABLE jobs (
  id uuid PRIMARY KEY, user_id uuid NOT NULL, job_type text NOT NULL,
  status text NOT NULL,
  input_data jsonb, output_data jsonb, error_message text, progress int NOT NULL DEFAULT 0,
  should_watermark boolean, is_public boolean, workflow_execution_id uuid, node_id text,
  provider text, provider_cost numeric(12,6), display_cost bigint,
  created_at timestamptz NOT NULL DEFAULT now(), started_at timestamptz, completed_at timestamptz);
CREATE TABLE usage_logs (
  id uuid PRIMARY KEY, job_id uuid, user_id uuid NOT NULL,
  status text NOT NULL, credits bigint NOT NULL, metadata jsonb,
  created_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE workflow_executions (id uuid PRIMARY KEY, status text NOT NULL);
CREATE TABLE alembic_version (version_num varchar(32) NOT NULL PRIMARY KEY);
INSERT INTO alembic_version VALUES ('platform_042');
"""

LIBRARY_TABLES = {"reconcile_credit_balances", "reconcile_credit_lots",
                  "reconcile_credit_transactions", "reconcile_webhook_deliveries",
                  "reconcile_assets", "reconcile_credit_anomalies", "reconcile_job_events",
                  "reconcile_created_objects", "reconcile_alembic_version"}
GENERIC_NAMES = {"credit_balances", "credit_lots", "credit_transactions", "webhook_deliveries",
                 "assets", "credit_anomalies", "job_events"}


def _psql(url: str) -> psycopg.Connection:
    return psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True)


def _tables(url: str) -> set[str]:
    with _psql(url) as conn:
        return {r[0] for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}


def _columns(url: str, table: str) -> set[str]:
    with _psql(url) as conn:
        return {r[0] for r in conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = %s", (table,))}


@pytest.fixture
def platform_db(pg_databases: PgDatabases) -> tuple[str, list[uuid.UUID]]:
    """A platform-shaped database holding rows, with its own alembic_version."""
    url = pg_databases.create("rtplat")
    job_ids = [uuid.uuid4() for _ in range(3)]
    with _psql(url) as conn:
        conn.execute(PLATFORM_DDL)
        for i, jid in enumerate(job_ids):
            conn.execute(
                "INSERT INTO jobs (id, user_id, job_type, status, input_data) VALUES (%s, %s, %s, %s, %s)",
                (jid, uuid.uuid4(), "image", ["pending", "processing", "completed"][i], '{"p": 1}'),
            )
            conn.execute(
                "INSERT INTO usage_logs (id, job_id, user_id, status, credits, metadata) "
                "VALUES (%s, %s, %s, 'reserved', 10, '{\"from_sub\": 10, \"from_topup\": 0}')",
                (uuid.uuid4(), jid, uuid.uuid4()),
            )
        conn.execute("INSERT INTO workflow_executions VALUES (%s, 'running')", (uuid.uuid4(),))
    return url, job_ids


def test_upgrade_on_empty_postgres_creates_everything(pg_databases: PgDatabases) -> None:
    """An empty database gets the platform tables and the library's, every library table
    under the ``reconcile_`` prefix (none of revision 0003's generic names is left)."""
    url = pg_databases.create()
    upgrade(url)
    assert {"jobs", "usage_logs", "workflow_executions"} | LIBRARY_TABLES <= _tables(url)
    assert not _tables(url) & GENERIC_NAMES
    assert {"provider_task_id", "submission_state", "credits_actual"} <= _columns(url, "jobs")


def test_upgrade_on_sqlite_creates_everything_and_round_trips(tmp_path: Path) -> None:
    """The embedded default migrates up, down to base and up again."""
    url = f"sqlite:///{tmp_path / 'r.db'}"
    upgrade(url)
    engine = sa.create_engine(url)
    names = set(sa.inspect(engine).get_table_names())
    assert {"jobs", "usage_logs", "workflow_executions"} | LIBRARY_TABLES <= names
    downgrade(url)
    assert set(sa.inspect(engine).get_table_names()) == {"reconcile_alembic_version"}
    upgrade(url)
    names = set(sa.inspect(engine).get_table_names())
    assert "reconcile_credit_lots" in names and not names & GENERIC_NAMES
    engine.dispose()


def test_platform_rows_survive_upgrade_and_downgrade(platform_db: tuple[str, list[uuid.UUID]]) -> None:
    """Upgrading keeps every platform row (attempts 0, submission_state NULL); downgrading
    removes only what the library added."""
    url, job_ids = platform_db
    before_jobs = _columns(url, "jobs")
    upgrade(url)
    with _psql(url) as conn:
        rows = conn.execute("SELECT id, reconcile_attempts, submission_state, input_data FROM jobs").fetchall()
        assert {r[0] for r in rows} == set(job_ids)
        assert all(r[1] == 0 and r[2] is None and r[3] == {"p": 1} for r in rows)
        assert conn.execute("SELECT version_num FROM alembic_version").fetchone()[0] == "platform_042"
    # the platform's workflow_executions lacked these; the migration added them
    assert {"failed_nodes", "error_message"} <= _columns(url, "workflow_executions")

    downgrade(url)
    assert _tables(url) == {"jobs", "usage_logs", "workflow_executions", "alembic_version",
                            "reconcile_alembic_version"}
    assert _columns(url, "jobs") == before_jobs
    assert _columns(url, "workflow_executions") == {"id", "status"}
    with _psql(url) as conn:
        assert conn.execute("SELECT count(*) FROM jobs").fetchone()[0] == 3
        assert conn.execute("SELECT count(*) FROM usage_logs").fetchone()[0] == 3
        assert conn.execute("SELECT count(*) FROM workflow_executions").fetchone()[0] == 1
        assert conn.execute("SELECT version_num FROM alembic_version").fetchone()[0] == "platform_042"


def test_seed_135_ddl_twice_is_a_no_op(platform_db: tuple[str, list[uuid.UUID]]) -> None:
    """Revision 0002's statements run again change nothing and raise nothing."""

    url, _ = platform_db
    upgrade(url)
    sql_path = ROOT / "reconcile" / "migrations" / "versions" / "0002_reconcile_135.py"
    ns: dict[str, object] = {}
    exec(compile(sql_path.read_text(), str(sql_path), "exec"), ns)  # the module's own constants
    add_columns = ns["ADD_COLUMNS_SQL"]
    name, table, column, where = ns["INFLIGHT_INDEX"]  # type: ignore[misc]
    index_sql = f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON {table} ({column}) WHERE {where}"
    with _psql(url) as conn:
        before = conn.execute("SELECT column_name, data_type FROM information_schema.columns "
                              "WHERE table_name = 'jobs' ORDER BY 1").fetchall()
        for _ in range(2):
            conn.execute(add_columns)
            conn.execute(index_sql)
        after = conn.execute("SELECT column_name, data_type FROM information_schema.columns "
                             "WHERE table_name = 'jobs' ORDER BY 1").fetchall()
        assert before == after


def test_empty_database_downgrade_then_upgrade(pg_databases: PgDatabases) -> None:
    """Down to base and up again on an empty database works."""
    url = pg_databases.create()
    upgrade(url)
    downgrade(url)
    assert _tables(url) == {"reconcile_alembic_version"}
    upgrade(url)
    assert LIBRARY_TABLES <= _tables(url)


def test_inflight_index_is_partial_concurrent_and_valid(pg_url: str) -> None:
    """jobs_inflight_keyset_idx: partial on (provider_call_started_at, id) for pending/processing,
    valid; 0022 dropped the one-column jobs_inflight_idx it supersedes."""
    with _psql(pg_url) as conn:
        indexdef, valid = conn.execute(
            "SELECT pg_get_indexdef(i.indexrelid), i.indisvalid FROM pg_index i "
            "JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname = 'jobs_inflight_keyset_idx'"
        ).fetchone()
        single = conn.execute(
            "SELECT count(*) FROM pg_class WHERE relname = 'jobs_inflight_idx'").fetchone()[0]
    assert valid is True
    assert "(provider_call_started_at, id)" in indexdef
    assert "'pending'" in indexdef and "'processing'" in indexdef and "WHERE" in indexdef
    assert single == 0


def test_0022_downgrade_rebuilds_the_one_column_index_and_upgrade_drops_it(pg_databases) -> None:
    url = pg_databases.create("rt0022")
    upgrade(url)
    downgrade(url, "0021")
    with _psql(url) as conn:
        assert conn.execute("SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON "
                            "c.oid = i.indexrelid WHERE c.relname = 'jobs_inflight_idx'"
                            ).fetchone() == (True,)
    upgrade(url)
    with _psql(url) as conn:
        assert conn.execute("SELECT count(*) FROM pg_class WHERE relname = 'jobs_inflight_idx'"
                            ).fetchone() == (0,)


def test_offline_sql_sets_lock_timeout_and_builds_indexes_outside_transactions(pg_url: str) -> None:
    """The rendered SQL sets lock_timeout and runs CONCURRENTLY outside BEGIN/COMMIT."""
    sql = subprocess.run([*ALEMBIC, "-x", f"url={pg_url}", "upgrade", "0001:head", "--sql"],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert "SET lock_timeout = '5s'" in sql
    depth = 0
    for line in sql.splitlines():
        if line.startswith("BEGIN"):
            depth += 1
        elif line.startswith("COMMIT"):
            depth -= 1
        elif "CONCURRENTLY" in line:
            assert depth == 0, line


def test_squawk_passes_on_the_migrations_sql(pg_url: str, tmp_path: Path) -> None:
    """squawk (with the reasons written in .squawk.toml) finds nothing."""
    sql = subprocess.run([*ALEMBIC, "-x", f"url={pg_url}", "upgrade", "0001:head", "--sql"],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout
    path = tmp_path / "migrations.sql"
    path.write_text(sql)
    squawk = Path(sys.executable).parent / "squawk"
    result = subprocess.run([str(squawk), "--reporter", "gcc", str(path)], capture_output=True,
                            text=True, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_alembic_check_shows_no_drift(pg_url: str) -> None:
    """The models equal the migrated schema."""
    result = subprocess.run([*ALEMBIC, "-x", f"url={pg_url}", "check"], capture_output=True,
                            text=True, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "No new upgrade operations detected" in result.stdout + result.stderr


@pytest.mark.parametrize("backend", ["postgresql", "sqlite"])
def test_prefix_rename_keeps_ledger_rows_both_ways(backend: str, pg_databases: PgDatabases,
                                                   tmp_path: Path) -> None:
    """Revision 0004 renames in place: rows written under 0003's names survive the rename, a
    downgrade to 0003 and the rename again, and the renamed unique constraint still holds."""
    url = pg_databases.create() if backend == "postgresql" else f"sqlite:///{tmp_path / 'p.db'}"
    upgrade(url, "0003")
    engine = sa.create_engine(url)
    user = str(uuid.uuid4()) if backend == "sqlite" else uuid.uuid4()
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO credit_lots (user_id, pool, kind, source_txn_id, amount, "
                             "remaining_amount) VALUES (:u, 'sub', 'GRANT', 'g1', 50, 50)"), {"u": user})
    upgrade(url)
    downgrade(url, "0003")
    upgrade(url)
    with engine.begin() as conn:
        rows = conn.execute(sa.text("SELECT source_txn_id, remaining_amount FROM reconcile_credit_lots")).all()
        assert [tuple(r) for r in rows] == [("g1", 50)]
    with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO reconcile_credit_lots (user_id, pool, kind, source_txn_id, "
                             "amount, remaining_amount) VALUES (:u, 'sub', 'GRANT', 'g1', 1, 1)"),
                     {"u": user})
    engine.dispose()
