"""The sweep's keyset walk as an index condition: ``(provider_call_started_at, id)`` in flight.

A sweep tick pages the in-flight rows 25 at a time with the cursor
``(provider_call_started_at, id) > (:t, :id)``. With only ``jobs_inflight_idx`` (one column) the
planner can use that cursor as a range on the first column alone, estimates the range from
whole-table statistics, and at a million rows of history sometimes sorts every in-flight row past
the cursor on each page: the walk over 10,000 rows in flight became quadratic (``make bench``,
figure 1). This index makes the row comparison an index condition; each page reads its 25 rows.

Built concurrently (no write lock on ``jobs``); a downgrade drops it the same way.

Revision ID: 0019
Revises: 0015
"""

from reconcile.db.migrate import (
    create_index_concurrently,
    drop_index_concurrently,
    set_lock_timeout,
)

revision = "0019"
down_revision = "0015"
branch_labels = None
depends_on = None

INDEX = "jobs_inflight_keyset_idx"
IN_FLIGHT = "status IN ('pending', 'processing')"


def upgrade() -> None:
    set_lock_timeout()
    create_index_concurrently(INDEX, "jobs", "provider_call_started_at, id", where=IN_FLIGHT)


def downgrade() -> None:
    set_lock_timeout()
    drop_index_concurrently(INDEX)
