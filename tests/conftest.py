"""Shared fixtures: real PostgreSQL (and Redis) — a missing service fails, never skips.

``pg_url`` is a database migrated once per test session (named per process so parallel runs
never collide); ``db`` truncates the library's and platform's tables before each test and hands
out a sessionmaker.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session, sessionmaker

from reconcile.db.migrate import upgrade
from reconcile.db.session import make_engine, make_sessionmaker

PG_ADMIN_URL = os.environ.get("RECONCILE_TEST_PG_ADMIN", "postgresql://postgres@127.0.0.1:5432/postgres")
# Redis: one database per pytest-xdist worker (``make test`` runs ``-n``), because tests flush
# theirs. RECONCILE_TEST_REDIS_URL may list several URLs, comma-separated, one per worker (gw0,
# gw1, ...); unset, worker N gets the Nth of _XDIST_DBS, which skips the databases other code
# hard-codes (12 bench, 4 bench peers, 13 test_worker_crash, 14 test_flower) and 3-7 (kept for
# people running targeted tests beside the suite). Too few URLs for the worker count fails the worker.
_XDIST_DBS = (15, 11, 10, 9, 8, 2, 1, 0)
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw0", "gw1", ... or "" (no xdist)
_WORKER_INDEX = int(XDIST_WORKER[2:]) if XDIST_WORKER.startswith("gw") else 0
_REDIS_URLS = [u.strip() for u in os.environ.get("RECONCILE_TEST_REDIS_URL", "").split(",")
               if u.strip()] or [f"redis://127.0.0.1:6379/{n}" for n in _XDIST_DBS]
REDIS_URL = _REDIS_URLS[_WORKER_INDEX] if _WORKER_INDEX < len(_REDIS_URLS) else ""

TABLES = (
    "jobs", "usage_logs", "workflow_executions", "reconcile_credit_balances", "reconcile_credit_lots",
    "reconcile_credit_transactions", "reconcile_webhook_deliveries", "reconcile_assets",
    "reconcile_credit_anomalies", "reconcile_job_events",
    "reconcile_idempotency_keys", "reconcile_workers", "reconcile_operator_actions",
    "reconcile_sweep_ticks",
)


def _admin() -> psycopg.Connection:
    try:
        return psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:  # pragma: no cover - environment
        pytest.fail(f"PostgreSQL is required at {PG_ADMIN_URL}: {exc}", pytrace=False)


def pg_url_for(name: str) -> str:
    base = PG_ADMIN_URL.rsplit("/", 1)[0]
    return base.replace("postgresql://", "postgresql+psycopg://", 1) + "/" + name


class PgDatabases:
    """Creates throwaway databases and drops them at the end of the session."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def create(self, prefix: str = "rt") -> str:
        name = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:8]}"
        with _admin() as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        self.names.append(name)
        return pg_url_for(name)

    def drop_all(self) -> None:
        with _admin() as conn:
            for name in self.names:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def pg_databases() -> Iterator[PgDatabases]:
    dbs = PgDatabases()
    yield dbs
    dbs.drop_all()


@pytest.fixture(scope="session")
def pg_url(pg_databases: PgDatabases) -> str:
    url = pg_databases.create("rtmain")
    upgrade(url)
    return url


@pytest.fixture(scope="session")
def pg_engine(pg_url: str) -> Iterator[Engine]:
    engine = make_engine(pg_url, pool_size=20, max_overflow=10)
    yield engine
    engine.dispose()


@pytest.fixture
def db(pg_engine: Engine) -> sessionmaker[Session]:
    """A clean migrated PostgreSQL database (tables truncated) and its sessionmaker."""
    with pg_engine.begin() as conn:
        conn.execute(text("TRUNCATE " + ", ".join(TABLES)))
    return make_sessionmaker(pg_engine)


@pytest.fixture(scope="session")
def redis_url() -> str:
    import redis

    if not REDIS_URL:
        pytest.fail(f"xdist worker {XDIST_WORKER} has no Redis database of its own: "
                    f"RECONCILE_TEST_REDIS_URL lists {len(_REDIS_URLS)} URL(s); give one per "
                    "worker, comma-separated", pytrace=False)
    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=3).ping()
    except redis.RedisError as exc:  # pragma: no cover - environment
        pytest.fail(f"Redis is required at {REDIS_URL}: {exc}", pytrace=False)
    return REDIS_URL


# the shipped simulator fixtures (simulator, simulator_session, simulator_env)
from reconcile.testing.fixtures import simulator, simulator_env, simulator_session  # noqa: E402,F401


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist, hand out the ``slow`` tests (real worker processes, minutes each)
    first, so that no worker starts one when the others are nearly done (``make test``'s
    ``--dist loadfile --no-loadscope-reorder`` sends files in first-appearance order). Stable and
    the same on every worker (xdist requires identical collections); a plain run keeps the
    file order."""
    if XDIST_WORKER:
        items.sort(key=lambda item: (item.get_closest_marker("slow") is None,
                                     _LONGEST_FIRST.get(item.path.name, len(_LONGEST_FIRST))))


# the files that take minutes on one xdist worker (``make test`` prints its slowest tests), the
# longest first: started last, one of them alone would set the run's wall time
_LONGEST_FIRST = {name: rank for rank, name in enumerate((
    "test_broker_faults.py", "test_crash_matrix.py", "test_chaos.py",
    "test_worker_heartbeat_kill.py", "test_worker_crash.py", "test_django_platform.py",
    "test_wheel.py", "test_demo.py"))}
