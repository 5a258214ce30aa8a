"""The last error's code in its own column (issue 17): ``jobs.reconcile_last_error_code``.

Until now the code of a job's last error (``UPSTREAM_TASK_NOT_FOUND``, ``INTERNAL`` …) was the
prefix of ``reconcile_last_error``'s text and was parsed back out of it when the job exhausted
its attempts. The library now writes it beside the text. Nullable, no default: adding it
rewrites nothing, and a row written before this revision (code NULL, text set) is read through
``reconcile.jobstore.legacy_error_code`` (the one documented fallback).

The column is recorded as the library's (a downgrade drops it only if this revision added it).

Revision ID: 0021
Revises: 0020
"""

from alembic import op
from reconcile.db.migrate import drop_recorded, is_pg, record, set_lock_timeout, sqlite_has_column

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

COLUMN = "reconcile_last_error_code"


def upgrade() -> None:
    set_lock_timeout()
    if is_pg():
        op.execute(f"INSERT INTO reconcile_created_objects (name) SELECT 'column:jobs.{COLUMN}' "
                   "WHERE NOT EXISTS (SELECT 1 FROM information_schema.columns WHERE "
                   "table_schema = current_schema() AND table_name = 'jobs' AND "
                   f"column_name = '{COLUMN}') ON CONFLICT DO NOTHING")
        op.execute(f"ALTER TABLE jobs ADD COLUMN IF NOT EXISTS {COLUMN} text")
    elif not sqlite_has_column("jobs", COLUMN):
        op.execute(f"ALTER TABLE jobs ADD COLUMN {COLUMN} TEXT")
        record(f"column:jobs.{COLUMN}")


def downgrade() -> None:
    set_lock_timeout()
    drop_recorded("column:", only={f"column:jobs.{COLUMN}"})
