"""Worker heartbeats: ``reconcile_workers`` (one row per live worker process) and
``jobs.claimed_by`` (the worker process that wrote a row's current claim).

A worker process renews its row every ``HEARTBEAT_INTERVAL`` seconds; once a row is past its
``expires_at`` the process counts as dead and its claims (the create claim, the poll turn, the
batch claim: ``jobs.claimed_by``) end at once instead of at their lease. ``claimed_by`` is
nullable with no default (adding it rewrites nothing) and recorded as the library's, so a
downgrade drops it only if this revision added it. The dead worker's claims are found among the
in-flight rows (``jobs_inflight_keyset_idx``), so no index on ``jobs`` is built. A new library
table with no index beyond its primary key.

Revision ID: 0026
Revises: 0025
"""


import sqlalchemy as sa

from alembic import op
from reconcile.db.migrate import (
    drop_recorded,
    is_pg,
    record,
    record_missing_columns,
    set_lock_timeout,
    sqlite_has_column,
)
from reconcile.db.types import UTCDateTime

revision = "0026"
# revises 0025, written beside this one on another branch; until both are in one tree it
# revises 0024 (replace the expression by "0025" when they meet)
down_revision = "0025"
branch_labels = None
depends_on = None

TABLE = "reconcile_workers"
COLUMN = "claimed_by"


def upgrade() -> None:
    set_lock_timeout()
    op.create_table(
        TABLE,
        sa.Column("worker_id", sa.Text(), nullable=False),
        sa.Column("hostname", sa.Text(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("started_at", UTCDateTime(), nullable=False),
        sa.Column("beat_at", UTCDateTime(), nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("worker_id", name=f"pk_{TABLE}"),
        if_not_exists=True,
    )
    if is_pg():
        record_missing_columns("jobs", [COLUMN])
        op.execute(f"ALTER TABLE jobs ADD COLUMN IF NOT EXISTS {COLUMN} text")
    elif not sqlite_has_column("jobs", COLUMN):
        op.execute(f"ALTER TABLE jobs ADD COLUMN {COLUMN} TEXT")
        record(f"column:jobs.{COLUMN}")


def downgrade() -> None:
    set_lock_timeout()
    drop_recorded("column:", only={f"column:jobs.{COLUMN}"})
    op.drop_table(TABLE, if_exists=True)
