"""Seed migration 135 — external-call reconciliation (jobs columns + in-flight index).

Exactly the seed's DDL: five columns with ``ADD COLUMN IF NOT EXISTS`` (metadata-only on
PG 11+, no table rewrite) and ``jobs_inflight_idx`` on ``provider_call_started_at`` for rows
``pending`` or ``processing``, built ``CONCURRENTLY`` outside the transaction. Running it twice
is a no-op. Columns a platform already had (seed phase-1 plumbing) are not recorded, so a
downgrade never drops them.

Revision ID: 0002
Revises: 0001
"""

from alembic import op
from reconcile.db.migrate import (
    create_index_concurrently,
    drop_index_concurrently,
    drop_recorded,
    is_pg,
    record_missing_columns,
    set_lock_timeout,
    sqlite_has_column,
)

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

COLUMNS = [
    ("provider_kind", "text"),
    ("provider_task_id", "text"),
    ("provider_call_started_at", "timestamptz"),
    ("reconcile_attempts", "int  NOT NULL DEFAULT 0"),
    ("reconcile_last_error", "text"),
]
ADD_COLUMNS_SQL = "ALTER TABLE jobs\n" + ",\n".join(
    f"  ADD COLUMN IF NOT EXISTS {name:<24} {ddl}" for name, ddl in COLUMNS
)
INFLIGHT_INDEX = ("jobs_inflight_idx", "jobs", "provider_call_started_at",
                  "status IN ('pending', 'processing')")


def upgrade() -> None:
    set_lock_timeout()
    record_missing_columns("jobs", [name for name, _ in COLUMNS])
    if is_pg():
        op.execute(ADD_COLUMNS_SQL)
    else:
        for name, ddl in COLUMNS:
            if not sqlite_has_column("jobs", name):
                sqlite_ddl = ddl.replace("timestamptz", "DATETIME")
                op.execute(f"ALTER TABLE jobs ADD COLUMN {name} {sqlite_ddl}")
    create_index_concurrently(*INFLIGHT_INDEX)


def downgrade() -> None:
    set_lock_timeout()
    drop_index_concurrently("jobs_inflight_idx")
    drop_recorded("column:", only={f"column:jobs.{name}" for name, _ in COLUMNS})
