"""Internal: Helpers shared by the Alembic revisions, and a programmatic ``upgrade``/``downgrade``.

PostgreSQL gets deploy-safe DDL: a ``lock_timeout``, ``ADD COLUMN IF NOT EXISTS`` (no table
rewrite: constant defaults are metadata-only since PG 11), ``CREATE INDEX CONCURRENTLY IF NOT
EXISTS`` outside the transaction. What the library creates on a platform's tables is recorded in
``reconcile_created_objects`` so a downgrade removes exactly that and nothing of the platform's.
SQLite (embedded default) takes the same steps through the inspector.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa

from alembic import op

from .functions import drop_ddl, function_ddl

__all__ = [
    "alembic_config", "downgrade", "repair", "upgrade",
]

LOCK_TIMEOUT = "5s"
# an upper bound for any one statement (a concurrent index build over a large jobs table is the
# slowest); a migration that needs longer should be run by hand
STATEMENT_TIMEOUT = "30min"


def is_pg() -> bool:
    return op.get_context().dialect.name == "postgresql"


def set_lock_timeout() -> None:
    """Fail fast rather than queue behind a long transaction and block the platform's traffic."""
    if is_pg():
        op.execute(f"SET lock_timeout = '{LOCK_TIMEOUT}'")
        op.execute(f"SET statement_timeout = '{STATEMENT_TIMEOUT}'")


def _sqlite_has_table(name: str) -> bool:
    return sa.inspect(op.get_bind()).has_table(name)


def sqlite_has_column(table: str, column: str) -> bool:
    return any(c["name"] == column for c in sa.inspect(op.get_bind()).get_columns(table))


def record(name: str) -> None:
    op.execute(
        sa.text("INSERT INTO reconcile_created_objects (name) VALUES (:n)").bindparams(n=name)
        if not is_pg()
        else f"INSERT INTO reconcile_created_objects (name) VALUES ('{name}') ON CONFLICT DO NOTHING"
    )


def create_table_if_absent(name: str, pg_ddl: str, sqlite_ddl: str | None = None) -> None:
    """Create a platform table only where the platform does not have it, and remember that."""
    if is_pg():
        op.execute(
            f"""DO $$ BEGIN
  IF to_regclass('{name}') IS NULL THEN
    {pg_ddl};
    INSERT INTO reconcile_created_objects (name) VALUES ('table:{name}');
  END IF;
END $$"""
        )
    elif not _sqlite_has_table(name):
        op.execute(sqlite_ddl or pg_ddl)
        record(f"table:{name}")


def add_column_if_absent(table: str, column: str, ddl_type: str) -> None:
    """Add a column the platform may lack, and remember that the library added it."""
    if is_pg():
        op.execute(
            f"""DO $$ BEGIN
  IF NOT EXISTS (SELECT 1 FROM information_schema.columns
                 WHERE table_schema = current_schema() AND table_name = '{table}'
                   AND column_name = '{column}') THEN
    ALTER TABLE {table} ADD COLUMN {column} {ddl_type};
    INSERT INTO reconcile_created_objects (name) VALUES ('column:{table}.{column}');
  END IF;
END $$"""
        )
    elif not sqlite_has_column(table, column):
        op.execute(f"ALTER TABLE {table} ADD COLUMN {column} {ddl_type}")
        record(f"column:{table}.{column}")


def record_missing_columns(table: str, columns: list[str]) -> None:
    """Before an ``ADD COLUMN IF NOT EXISTS``, note which of ``columns`` the library will add."""
    if is_pg():
        values = ", ".join(f"('{c}')" for c in columns)
        op.execute(
            f"""INSERT INTO reconcile_created_objects (name)
SELECT 'column:{table}.' || c.name FROM (VALUES {values}) AS c(name)
WHERE NOT EXISTS (SELECT 1 FROM information_schema.columns
                  WHERE table_schema = current_schema() AND table_name = '{table}'
                    AND column_name = c.name)
ON CONFLICT DO NOTHING"""
        )
    else:
        for column in columns:
            if not sqlite_has_column(table, column):
                record(f"column:{table}.{column}")


def add_library_column(table: str, column: str, pg_type: str, sqlite_type: str) -> None:
    """A nullable library column: recorded as the library's only where it was missing, then
    ``ADD COLUMN IF NOT EXISTS`` (PostgreSQL; a plain statement the migration linter reads) —
    a column the platform already has is kept as it is (:func:`drop_library_column`)."""
    if is_pg():
        record_missing_columns(table, [column])
        op.execute(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column} {pg_type}")
    elif not sqlite_has_column(table, column):
        op.execute(f"ALTER TABLE {table} ADD COLUMN {column} {sqlite_type}")
        record(f"column:{table}.{column}")


def drop_library_column(table: str, column: str) -> None:
    """The downgrade of :func:`add_library_column`: drops the column only if the library added
    it."""
    drop_recorded("column:", only={f"column:{table}.{column}"})


def create_index_concurrently(name: str, table: str, columns: str, where: str | None = None) -> None:
    """``CREATE INDEX CONCURRENTLY IF NOT EXISTS`` outside the migration's transaction (PG)."""
    predicate = f" WHERE {where}" if where else ""
    if is_pg():
        with op.get_context().autocommit_block():
            op.execute(f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON {table} ({columns}){predicate}")
        set_lock_timeout()  # the autocommit block ran on the same session; keep the guard
    else:
        op.execute(f"CREATE INDEX IF NOT EXISTS {name} ON {table} ({columns}){predicate}")


def drop_index_concurrently(name: str) -> None:
    if is_pg():
        with op.get_context().autocommit_block():
            op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
    else:
        op.execute(f"DROP INDEX IF EXISTS {name}")


def drop_recorded(prefix: str, only: set[str] | None = None) -> None:
    """Drop what the library recorded creating: every ``table:`` or ``column:`` record, or just
    the records named in ``only``. Objects the platform had before are never recorded."""
    bind = op.get_bind()
    names = [
        row[0]
        for row in bind.execute(
            sa.text("SELECT name FROM reconcile_created_objects WHERE name LIKE :p ORDER BY name"),
            {"p": prefix + "%"},
        )
        if only is None or row[0] in only
    ]
    for name in names:
        target = name[len(prefix):]
        if prefix == "table:":
            op.execute(f"DROP TABLE IF EXISTS {target}")
        else:
            table, column = target.split(".", 1)
            if is_pg():
                op.execute(f"ALTER TABLE {table} DROP COLUMN IF EXISTS {column}")
            elif sqlite_has_column(table, column):
                op.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
        bind.execute(sa.text("DELETE FROM reconcile_created_objects WHERE name = :n"), {"n": name})


def create_functions(functions: Mapping[str, tuple[str, str]]) -> None:
    """Install a revision's functions (``name → (arguments, body)``: :mod:`.functions`) with
    ``CREATE OR REPLACE FUNCTION`` (PostgreSQL; SQLite has none): no table is locked, a
    session already calling one finishes on the body it started with."""
    if is_pg():
        for name, (arguments, body) in functions.items():
            op.execute(function_ddl(name, arguments, body))


def drop_functions(functions: Mapping[str, tuple[str, str]]) -> None:
    if is_pg():
        for name, (arguments, _) in functions.items():
            op.execute(drop_ddl(name, arguments))


def alembic_config(url: str):  # type: ignore[no-untyped-def]
    """The packaged migrations (``reconcile/migrations``): the same from a wheel in any folder
    as from a checkout — no ``alembic.ini`` needed."""
    from alembic.config import Config

    from ..migrations import LOCATION

    cfg = Config()
    cfg.set_main_option("script_location", str(LOCATION))
    cfg.set_main_option("path_separator", "os")
    cfg.cmd_opts = None
    cfg.attributes["x_url"] = url
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    """Run the library's migrations on ``url`` (what ``alembic -x url=… upgrade head`` does)."""
    from alembic import command

    command.upgrade(_with_x(url), revision)


def downgrade(url: str, revision: str = "base") -> None:
    from alembic import command

    command.downgrade(_with_x(url), revision)


def _with_x(url: str):  # type: ignore[no-untyped-def]
    from argparse import Namespace

    cfg = alembic_config(url)
    cfg.cmd_opts = Namespace(x=[f"url={url}"])
    return cfg


def repair(url: str) -> list[str]:
    """Add back what the library's migrations created and is gone although they are at head
    (so ``upgrade`` adds nothing): its columns and indexes on the platform's tables — an ORM's
    table rebuild drops them, as Django's SQLite ``AlterField`` does — its own tables, and on
    PostgreSQL the ledger's functions (as the newest revision defining them has them). Each
    from the models (which ``alembic check`` keeps equal to the migrations); nothing that
    exists is touched, and the values a rebuild dropped do not come back. Returns the
    statements it ran (none: nothing was missing).

    On PostgreSQL it is deploy-safe as the migrations are: the ``lock_timeout`` and
    ``statement_timeout`` of :func:`set_lock_timeout` (behind a long transaction it fails
    rather than queue the platform's traffic behind itself; the columns are added in one
    transaction, so all or none), ``ADD COLUMN IF NOT EXISTS``, indexes ``CONCURRENTLY``; an
    index of the library's that an interrupted concurrent build left invalid is dropped and
    built again."""
    from sqlalchemy.schema import CreateColumn, CreateIndex

    from .contract import LIBRARY_TABLES, PLATFORM_COLUMNS, PLATFORM_TABLES, newer_revision
    from .functions import declared, differing, install
    from .models import Base
    from .session import make_engine

    engine = make_engine(url)
    pg = engine.dialect.name == "postgresql"

    def guard(conn: Any) -> None:
        if pg:
            conn.exec_driver_sql(f"SET lock_timeout = '{LOCK_TIMEOUT}'")
            conn.exec_driver_sql(f"SET statement_timeout = '{STATEMENT_TIMEOUT}'")

    done: list[str] = []
    try:
        with engine.begin() as conn:
            guard(conn)
            inspector = sa.inspect(conn)
            for name in PLATFORM_TABLES:
                if not inspector.has_table(name):
                    continue  # a platform table is created by `upgrade`, never rebuilt here
                live = {c["name"] for c in inspector.get_columns(name)}
                for column in Base.metadata.tables[name].columns:
                    if column.name in live or column.name in PLATFORM_COLUMNS[name]:
                        continue
                    now = column.server_default is not None and "now" in str(
                        getattr(column.server_default, "arg", "")).lower()
                    ddl = str(CreateColumn(column).compile(dialect=conn.dialect))
                    if now and conn.dialect.name == "sqlite":
                        # SQLite adds no column with a non-constant default (revision 0023)
                        ddl = ddl.split(" DEFAULT ")[0].replace(" NOT NULL", "")
                    add = "ADD COLUMN IF NOT EXISTS" if pg else "ADD COLUMN"
                    statements = [f"ALTER TABLE {name} {add} {ddl}"]
                    if now and conn.dialect.name == "sqlite":
                        statements.append(f"UPDATE {name} SET {column.name} = CURRENT_TIMESTAMP")
                    for statement in statements:
                        conn.exec_driver_sql(statement)
                        done.append(statement)
            for name in LIBRARY_TABLES:
                if not inspector.has_table(name):
                    Base.metadata.tables[name].create(conn, checkfirst=True)
                    done.append(f"CREATE TABLE {name} (with its indexes)")
            # the ledger's, as the head defines them; none in a database a later release's
            # migrations upgraded (its functions are that release's to repair)
            functions = declared() if pg else {}
            wrong = differing(conn, functions)
            if wrong and newer_revision(conn) is not None:
                wrong = {}  # read only when a function differs: the usual repair finds none
            for name in wrong:
                install(conn, name, *functions[name])
                done.append(f"CREATE OR REPLACE FUNCTION {name}")
        indexes = []
        with engine.connect() as conn:
            inspector = sa.inspect(conn)
            for name in PLATFORM_TABLES:
                if not inspector.has_table(name):
                    continue
                live_indexes = inspector.get_indexes(name)
                invalid = _invalid_indexes(conn, name) if pg else set()
                for index in sorted(Base.metadata.tables[name].indexes, key=lambda i: str(i.name)):
                    if index.name in invalid:
                        indexes.append(f"DROP INDEX CONCURRENTLY IF EXISTS {index.name}")
                    elif not _index_missing(index, live_indexes):
                        continue
                    if index.name:
                        indexes.append(str(CreateIndex(index, if_not_exists=True).compile(
                            dialect=conn.dialect)))
        if indexes and pg:
            # deploy-safe on the platform's tables: CONCURRENTLY, outside a transaction
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                guard(conn)
                for statement in indexes:
                    statement = statement.replace("CREATE INDEX ", "CREATE INDEX CONCURRENTLY ", 1)
                    conn.exec_driver_sql(statement)
                    done.append(statement)
        elif indexes:
            with engine.begin() as conn:
                for statement in indexes:
                    conn.exec_driver_sql(statement)
                    done.append(statement)
    finally:
        engine.dispose()
    return done


def _invalid_indexes(conn: Any, table: str) -> set[str]:
    """PostgreSQL: the names of ``table``'s indexes that are not valid (a concurrent build that
    failed leaves one; ``CREATE INDEX ... IF NOT EXISTS`` would skip it)."""
    return set(conn.exec_driver_sql(
        "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
        "WHERE i.indrelid = to_regclass(%(t)s) AND NOT i.indisvalid", {"t": table}).scalars())


def _partial(index: Any) -> bool:
    return any(k.endswith("_where") and v is not None
               for k, v in (index.get("dialect_options") or {}).items())


def _index_missing(index: Any, live: list[Any]) -> bool:
    """Whether the model's ``index`` is gone from a platform table: not there by name, and —
    for a full index — no other full index of the platform's leads with its first column
    (revision 0014 drops the library's ``usage_logs(job_id)`` index where the platform has its
    own; a repair must not bring it back)."""
    if any(i["name"] == index.name for i in live):
        return False
    if index.dialect_options["postgresql"].get("where") is not None:
        return True
    first = [c.name for c in index.columns][:1]
    return not any(i["column_names"][:1] == first and not _partial(i) for i in live)
