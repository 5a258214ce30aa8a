"""The operator record: ``reconcile_operator_actions``, one row per action a person took on a
job by hand (``reconcile.operator``: fail, resolve, retry a settlement, release an orphan), with
the operator's identity, the surface (CLI, console, Django admin) and the reason.

A new library table (no platform table is touched), so a plain index on it is safe: the table
is empty when the index is built.

Revision ID: 0024
Revises: 0023
"""

import sqlalchemy as sa

from alembic import op
from reconcile.db.migrate import set_lock_timeout
from reconcile.db.types import JSONType, UTCDateTime

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None

TABLE = "reconcile_operator_actions"


def upgrade() -> None:
    set_lock_timeout()
    op.create_table(
        TABLE,
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), sa.Identity(),
                  nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("operator", sa.Text(), nullable=False),
        sa.Column("via", sa.Text(), nullable=False),
        sa.Column("action", sa.Text(), nullable=False),
        sa.Column("job_id", sa.Uuid(), nullable=True),
        sa.Column("user_id", sa.Uuid(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("detail", JSONType, nullable=True),
        sa.PrimaryKeyConstraint("id", name=f"pk_{TABLE}"),
        if_not_exists=True,
    )
    op.create_index(f"ix_{TABLE}_job_id", TABLE, ["job_id"], if_not_exists=True)


def downgrade() -> None:
    set_lock_timeout()
    op.drop_index(f"ix_{TABLE}_job_id", table_name=TABLE, if_exists=True)
    op.drop_table(TABLE, if_exists=True)
