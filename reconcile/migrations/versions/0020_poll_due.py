"""Batch polling (issue 16): ``jobs.poll_due_at`` and its partial index.

``RECONCILE_POLL_MODE=batch`` keeps a job's next status read on its row instead of in a broker
message: ``poll_due_at`` (nullable, no default: adding it rewrites nothing) is when the next read
is due, and a claim moves it one batch lease ahead. ``jobs_poll_due_idx`` (``poll_due_at``, in
flight and due-scheduled only) is what the poller's ``ORDER BY poll_due_at LIMIT n FOR UPDATE
SKIP LOCKED`` reads; chain-mode rows (``poll_due_at`` NULL) are not in it.

The column is recorded as the library's (a downgrade drops it only if this revision added it);
the index is built concurrently (no write lock on ``jobs``) and dropped the same way.

Revision ID: 0020
Revises: 0019
"""

from alembic import op
from reconcile.db.migrate import (
    create_index_concurrently,
    drop_index_concurrently,
    drop_recorded,
    is_pg,
    record,
    set_lock_timeout,
    sqlite_has_column,
)

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

COLUMN = "poll_due_at"
INDEX = "jobs_poll_due_idx"
POLL_DUE = "status IN ('pending', 'processing') AND poll_due_at IS NOT NULL"


def upgrade() -> None:
    set_lock_timeout()
    if is_pg():
        op.execute(f"INSERT INTO reconcile_created_objects (name) SELECT 'column:jobs.{COLUMN}' "
                   "WHERE NOT EXISTS (SELECT 1 FROM information_schema.columns WHERE "
                   "table_schema = current_schema() AND table_name = 'jobs' AND "
                   f"column_name = '{COLUMN}') ON CONFLICT DO NOTHING")
        op.execute(f"ALTER TABLE jobs ADD COLUMN IF NOT EXISTS {COLUMN} timestamptz")
    elif not sqlite_has_column("jobs", COLUMN):
        op.execute(f"ALTER TABLE jobs ADD COLUMN {COLUMN} DATETIME")
        record(f"column:jobs.{COLUMN}")
    create_index_concurrently(INDEX, "jobs", COLUMN, where=POLL_DUE)


def downgrade() -> None:
    set_lock_timeout()
    drop_index_concurrently(INDEX)
    drop_recorded("column:", only={f"column:jobs.{COLUMN}"})
