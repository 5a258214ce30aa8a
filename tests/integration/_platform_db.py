"""A migrated platform-shaped PostgreSQL database for a test module: its own tables
(``reconcile.testing.platform_schema``), optionally naive timestamp columns, a non-UTC zone (the
database's default or the URL's session zone) and a column the platform had before the
library's upgrade; and its sessions on a clean slate for each test."""

from __future__ import annotations

from urllib.parse import quote

import psycopg
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session, sessionmaker

from reconcile.db.migrate import upgrade
from reconcile.db.session import make_engine, make_sessionmaker
from reconcile.testing.platform_schema import create_platform_tables, set_database_timezone
from tests.conftest import PG_ADMIN_URL, TABLES, PgDatabases


def plain(url: str) -> str:
    """``url`` as libpq takes it (no SQLAlchemy driver part)."""
    return url.replace("postgresql+psycopg://", "postgresql://")


def platform_database(pg_databases: PgDatabases, prefix: str, *, naive: bool,
                      zone: str | None = None, level: str = "session",
                      before_upgrade: tuple[str, ...] = ()) -> tuple[str, Engine]:
    """A new database with the platform's tables (``naive``: timestamp columns without time
    zone), in ``zone`` set at ``level`` ("database": its default; "session": the URL's
    options), the statements ``before_upgrade`` run on it, then the library's migrations.
    Returns its URL (with the session zone, if any) and an engine."""
    url = pg_databases.create(prefix)
    with psycopg.connect(plain(url), autocommit=True) as conn:
        create_platform_tables(conn, naive=naive)
        for statement in before_upgrade:
            conn.execute(statement.encode())
    if zone is not None and level == "database":
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
            set_database_timezone(admin, url.rsplit("/", 1)[1], zone)
    elif zone is not None:
        url += "?options=" + quote(f"-c TimeZone={zone}")
    upgrade(url)
    return url, make_engine(url)


def clean_sessions(engine: Engine) -> sessionmaker[Session]:
    """Sessions on ``engine`` after every table of the test database is emptied."""
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE " + ", ".join(TABLES)))
    return make_sessionmaker(engine)
