"""Internal: the library's own mechanics, not an import path for platforms (may move).

A platform-shaped database for the tests and the chaos run: the platform's own ``jobs``,
``usage_logs`` and ``workflow_executions`` created before the library's migrations run (as an
existing platform has them), optionally with ``timestamp without time zone`` columns holding UTC
(as Rails and many ORMs keep them), and a database whose default ``TimeZone`` is not UTC.

The tables are the ones revision 0001 creates in a standalone install (one definition of the
platform's shape); only the timestamp type changes.
"""

from __future__ import annotations

import importlib
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg

__all__ = ["NAIVE", "create_platform_tables", "platform_ddl", "set_database_timezone"]

NAIVE = "timestamp without time zone"


def platform_ddl(*, naive: bool = False) -> str:
    """The platform's tables as revision 0001 creates them on PostgreSQL; ``naive``: each
    ``timestamptz`` column is ``timestamp without time zone`` instead (its ``DEFAULT now()``
    then stores the session's wall time, as on such a platform)."""
    baseline = importlib.import_module("reconcile.migrations.versions.0001_baseline")
    ddl = ";\n".join((baseline.JOBS, baseline.USAGE, baseline.WORKFLOWS)) + ";"
    return re.sub(r"\btimestamptz\b", NAIVE, ddl) if naive else ddl


def create_platform_tables(conn: psycopg.Connection[Any], *, naive: bool = False) -> None:
    """Run :func:`platform_ddl` on an open psycopg connection (autocommit or committed by the
    caller), before :func:`reconcile.db.migrate.upgrade`: the migrations then keep them."""
    conn.execute(platform_ddl(naive=naive))


def set_database_timezone(conn: psycopg.Connection[Any], database: str, zone: str) -> None:
    """``ALTER DATABASE … SET timezone``: every new session on ``database`` starts in ``zone``
    (``conn``: an autocommit psycopg connection to another database, e.g. the admin one). The
    zone is checked against PostgreSQL's list first: a typo is an error, not a silent UTC."""
    from psycopg import sql

    if conn.execute("SELECT 1 FROM pg_timezone_names WHERE name = %s", (zone,)).fetchone() is None:
        raise ValueError(f"unknown time zone {zone!r} (not in pg_timezone_names)")
    conn.execute(sql.SQL("ALTER DATABASE {} SET timezone TO {}").format(
        sql.Identifier(database), sql.Literal(zone)))
