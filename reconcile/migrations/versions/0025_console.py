"""The operator console's lists: anomalies gain an open/resolved state, and the partial indexes
the console's lists read through.

``reconcile_credit_anomalies`` (the library's table) gains ``resolved_at``, ``resolved_by`` (the
operator's identity and surface) and ``resolved_action`` (the operator action that closed it):
nullable, no default, so adding them rewrites nothing; every existing anomaly is open.
``reconcile.operator`` closes a job's open anomalies of the kinds an action answers when that
action changes the job.

The indexes, each built concurrently (no write lock on the table) and dropped the same way:

* ``jobs_uncertain_idx (created_at, id)`` over the in-flight rows whose outcome is unknown
  (``submitting``/``uncertain``): "needs attention"'s uncertain list, oldest first, paged by
  the keyset ``(created_at, id) > (…)`` — a few rows of a million.
* ``jobs_completed_at_idx (completed_at)`` over completed rows: the health page's
  completion-delay distribution over the last day reads only that day's rows.
* ``reconcile_credit_anomalies_open_idx (id)`` over open anomalies: the open list, newest first.
* ``reconcile_credit_transactions_refund_idx (created_at)`` over REFUND rows: the health page's
  refunds per hour.

Revision ID: 0025
Revises: 0024
"""

from alembic import op
from reconcile.db.migrate import (
    create_index_concurrently,
    drop_index_concurrently,
    is_pg,
    set_lock_timeout,
    sqlite_has_column,
)

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None

ANOMALIES = "reconcile_credit_anomalies"
COLUMNS = (("resolved_at", "timestamptz", "DATETIME"), ("resolved_by", "text", "TEXT"),
           ("resolved_action", "text", "TEXT"))
UNKNOWN_OUTCOME = ("status IN ('pending', 'processing') "
                   "AND submission_state IN ('submitting', 'uncertain')")
INDEXES = (
    ("jobs_uncertain_idx", "jobs", "created_at, id", UNKNOWN_OUTCOME),
    ("jobs_completed_at_idx", "jobs", "completed_at", "status = 'completed'"),
    ("reconcile_credit_anomalies_open_idx", ANOMALIES, "id", "resolved_at IS NULL"),
    ("reconcile_credit_transactions_refund_idx", "reconcile_credit_transactions", "created_at",
     "type = 'REFUND'"),
)


def upgrade() -> None:
    set_lock_timeout()
    for name, pg_type, sqlite_type in COLUMNS:
        if is_pg():
            op.execute(f"ALTER TABLE {ANOMALIES} ADD COLUMN IF NOT EXISTS {name} {pg_type}")
        elif not sqlite_has_column(ANOMALIES, name):
            op.execute(f"ALTER TABLE {ANOMALIES} ADD COLUMN {name} {sqlite_type}")
    for name, table, columns, where in INDEXES:
        create_index_concurrently(name, table, columns, where=where)


def downgrade() -> None:
    set_lock_timeout()
    for name, *_ in reversed(INDEXES):
        drop_index_concurrently(name)
    for name, *_ in reversed(COLUMNS):
        if is_pg():
            op.execute(f"ALTER TABLE {ANOMALIES} DROP COLUMN IF EXISTS {name}")
        elif sqlite_has_column(ANOMALIES, name):
            op.execute(f"ALTER TABLE {ANOMALIES} DROP COLUMN {name}")
