"""Safe adoption on a live platform (issue 14): the adoption time and the late-completion index.

* ``reconcile_meta``: one row, ``adopted_at`` — when the library's migrations first ran on this
  database. Rows without a ``provider_kind`` created before it are the legacy candidates of the
  sweep (DESIGN.md §6 row 1, §10.11); rows created later (another subsystem's, such as pipeline
  wrappers) are never touched. A database that ran the library before this revision gets the
  earliest time its ledger recorded anything, if that is earlier than now (the safe side: an
  earlier cutoff makes fewer rows candidates).
* ``jobs_completed_after_failure_idx``: partial, ``status = 'completed' AND error_code IS NOT
  NULL``. The library clears ``error_code`` when it completes a job itself, so only a job the
  library failed and something else then completed is in it: the sweep's late-completion phase
  (``completed_after_refund``) costs what the anomalies cost, never what the history does.

Revision ID: 0015
Revises: 0018
"""

from datetime import UTC, datetime

import sqlalchemy as sa

from alembic import op
from reconcile.db.migrate import (
    create_index_concurrently,
    drop_index_concurrently,
    is_pg,
    set_lock_timeout,
)
from reconcile.db.models import CreditTransaction
from reconcile.db.types import UTCDateTime

revision = "0015"
down_revision = "0018"
branch_labels = None
depends_on = None

META = "reconcile_meta"
LATE_INDEX = ("jobs_completed_after_failure_idx", "jobs", "completed_at",
              "status = 'completed' AND error_code IS NOT NULL")


def upgrade() -> None:
    set_lock_timeout()
    op.create_table(
        META,
        sa.Column("id", sa.BigInteger(), nullable=False, server_default=sa.text("1")),
        sa.Column("adopted_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=f"pk_{META}"),
        sa.CheckConstraint("id = 1", name=f"ck_{META}_one_row"),
    )
    _record_adoption()
    create_index_concurrently(*LATE_INDEX)


def _record_adoption() -> None:
    ledger = CreditTransaction.__table__.name
    if is_pg():  # plain SQL, so `alembic upgrade --sql` (offline) renders it too
        op.execute(f"INSERT INTO {META} (id, adopted_at) SELECT 1, "
                   f"LEAST(now(), COALESCE(MIN(created_at), now())) FROM {ledger}")
        return
    # SQLite: bound through the column type, so the value reads back as aware UTC
    bind = op.get_bind()
    table = sa.table(ledger, sa.column("created_at", UTCDateTime()))
    meta = sa.table(META, sa.column("id", sa.BigInteger()), sa.column("adopted_at", UTCDateTime()))
    earliest = bind.execute(sa.select(sa.func.min(table.c.created_at))).scalar()
    if isinstance(earliest, str):
        earliest = datetime.fromisoformat(earliest)
    if earliest is not None and earliest.tzinfo is None:
        earliest = earliest.replace(tzinfo=UTC)
    now = datetime.now(UTC)
    bind.execute(sa.insert(meta).values(id=1, adopted_at=min(now, earliest or now)))


def downgrade() -> None:
    set_lock_timeout()
    drop_index_concurrently(LATE_INDEX[0])
    op.drop_table(META)
