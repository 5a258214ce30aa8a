"""The sweep's ticks: ``reconcile_sweep_ticks``, one row per real tick (its counts and its
decisions by row, action and outcome), kept a week for the operator console's health page.

A new library table (no platform table is touched), so a plain index on it is safe: the table
is empty when the index is built.

Revision ID: 0027
Revises: 0026
"""

import sqlalchemy as sa

from alembic import op
from reconcile.db.migrate import set_lock_timeout
from reconcile.db.types import JSONType, UTCDateTime

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None

TABLE = "reconcile_sweep_ticks"
COUNTS = ("elapsed_ms", "scanned", "recovered", "failed", "still_running", "errors",
          "fanned_out", "observed", "late_completions")


def upgrade() -> None:
    set_lock_timeout()
    op.create_table(
        TABLE,
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), sa.Identity(),
                  nullable=False),
        sa.Column("started_at", UTCDateTime(), nullable=False),
        *(sa.Column(name, sa.Integer(), nullable=False) for name in COUNTS),
        sa.Column("decisions", JSONType, nullable=True),
        sa.PrimaryKeyConstraint("id", name=f"pk_{TABLE}"),
        if_not_exists=True,
    )
    op.create_index(f"ix_{TABLE}_started_at", TABLE, ["started_at"], if_not_exists=True)


def downgrade() -> None:
    set_lock_timeout()
    op.drop_index(f"ix_{TABLE}_started_at", table_name=TABLE, if_exists=True)
    op.drop_table(TABLE, if_exists=True)
