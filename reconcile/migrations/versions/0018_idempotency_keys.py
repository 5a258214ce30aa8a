"""The library's idempotency keys for ``api.submit`` (one row per user and key).

A new library table (no platform table is touched), so a plain index on it is safe: the table
is empty when the index is built.

Revision ID: 0018
Revises: 0014
"""

import sqlalchemy as sa

from alembic import op
from reconcile.db.migrate import set_lock_timeout
from reconcile.db.types import JSONType, UTCDateTime

revision = "0018"
down_revision = "0014"
branch_labels = None
depends_on = None

TABLE = "reconcile_idempotency_keys"


def upgrade() -> None:
    set_lock_timeout()
    op.create_table(
        TABLE,
        sa.Column("user_id", sa.Uuid(), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("fingerprint", sa.Text(), nullable=False),
        sa.Column("job_id", sa.Uuid(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("response_status", sa.Integer(), nullable=True),
        sa.Column("response_body", JSONType, nullable=True),
        sa.PrimaryKeyConstraint("user_id", "key", name=f"pk_{TABLE}"),
        if_not_exists=True,
    )
    op.create_index(f"ix_{TABLE}_created_at", TABLE, ["created_at"], if_not_exists=True)


def downgrade() -> None:
    set_lock_timeout()
    op.drop_index(f"ix_{TABLE}_created_at", table_name=TABLE, if_exists=True)
    op.drop_table(TABLE, if_exists=True)
