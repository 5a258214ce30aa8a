"""No second index on ``usage_logs(job_id)``: drop the library's where the platform has its own.

Revision 0003 created ``reconcile_usage_logs_job_idx`` (by name, ``IF NOT EXISTS``) even when
the platform's ``usage_logs`` already had an index leading with ``job_id``: the same lookups,
twice the write cost. Where another full (not partial) index leads with ``job_id``, this drops
the library's, concurrently. A downgrade puts it back.

Revision ID: 0014
Revises: 0004
"""

import sqlalchemy as sa

from alembic import op
from reconcile.db.migrate import (
    create_index_concurrently,
    drop_index_concurrently,
    set_lock_timeout,
)

revision = "0014"
down_revision = "0004"
branch_labels = None
depends_on = None

INDEX = "reconcile_usage_logs_job_idx"


def _platform_has_its_own() -> bool:
    for index in sa.inspect(op.get_bind()).get_indexes("usage_logs"):
        partial = any(k.endswith("_where") and v is not None
                      for k, v in (index.get("dialect_options") or {}).items())
        if index["name"] != INDEX and index["column_names"][:1] == ["job_id"] and not partial:
            return True
    return False


def upgrade() -> None:
    set_lock_timeout()
    # offline (--sql) there is no catalog to look at: the index stays, as 0003 made it
    if not op.get_context().as_sql and _platform_has_its_own():
        drop_index_concurrently(INDEX)


def downgrade() -> None:
    set_lock_timeout()
    create_index_concurrently(INDEX, "usage_logs", "job_id")
