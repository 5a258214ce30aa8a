"""The platform columns the library reads, added where an existing table lacks them (issue 26).

Revision 0001 creates ``jobs`` and ``usage_logs`` with these columns only where the platform has
no such table; on an existing table nothing added them, and every read of a job (``SELECT`` of
the mapped columns) failed with ``column jobs.progress does not exist``. Added here with ``ADD
COLUMN IF NOT EXISTS`` (a platform that has them keeps them as they are): nullable, or a
constant default (``progress`` 0; ``usage_logs.created_at`` ``now()``, a stable default that
PostgreSQL 11+ evaluates once, so existing rows get the upgrade's time and nothing is
rewritten). What this revision adds is recorded as the library's, so a downgrade drops exactly
that. The table contract (:mod:`reconcile.db.contract`) lists them as added by the library.

Revision ID: 0023
Revises: 0022
"""

from alembic import op
from reconcile.db.migrate import (
    drop_recorded,
    is_pg,
    record,
    record_missing_columns,
    set_lock_timeout,
    sqlite_has_column,
)

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None

JOB_COLUMNS = [
    ("progress", "int NOT NULL DEFAULT 0"),
    ("should_watermark", "boolean"),
    ("is_public", "boolean"),
    ("workflow_execution_id", "uuid"),
    ("node_id", "text"),
    ("provider_cost", "numeric(12,6)"),
    ("display_cost", "bigint"),
]
USAGE_COLUMNS = [("created_at", "timestamptz NOT NULL DEFAULT now()")]
TABLES = {"jobs": JOB_COLUMNS, "usage_logs": USAGE_COLUMNS}
# SQLite cannot add a column with a non-constant default: nullable there, and set once
SQLITE_TYPES = {"uuid": "CHAR(32)", "boolean": "BOOLEAN", "bigint": "BIGINT", "text": "TEXT",
                "numeric(12,6)": "NUMERIC(12,6)", "int NOT NULL DEFAULT 0": "INTEGER NOT NULL DEFAULT 0",
                "timestamptz NOT NULL DEFAULT now()": "DATETIME"}


def upgrade() -> None:
    set_lock_timeout()
    for table, columns in TABLES.items():
        if is_pg():
            record_missing_columns(table, [name for name, _ in columns])
            op.execute(f"ALTER TABLE {table}\n" + ",\n".join(
                f"  ADD COLUMN IF NOT EXISTS {name} {ddl}" for name, ddl in columns))
            continue
        for name, ddl in columns:
            if not sqlite_has_column(table, name):
                op.execute(f"ALTER TABLE {table} ADD COLUMN {name} {SQLITE_TYPES[ddl]}")
                record(f"column:{table}.{name}")
                if ddl.endswith("now()"):
                    op.execute(f"UPDATE {table} SET {name} = CURRENT_TIMESTAMP")


def downgrade() -> None:
    set_lock_timeout()
    drop_recorded("column:", only={f"column:{table}.{name}"
                                   for table, columns in TABLES.items() for name, _ in columns})
