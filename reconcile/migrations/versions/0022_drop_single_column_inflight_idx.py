"""Drop ``jobs_inflight_idx``: the keyset index of 0019 serves every query it served.

``jobs_inflight_idx (provider_call_started_at) WHERE status IN ('pending', 'processing')`` came
with the original reconciliation migration (0002). Revision 0019 added
``jobs_inflight_keyset_idx (provider_call_started_at, id)`` with the same predicate, so the old
index's one column is the new one's leading column: any query the old index can serve, the new
one serves too. Keeping both let the planner choose, per ANALYZE sample, the one-column index for
the sweep's keyset walk, where the cursor ``(provider_call_started_at, id) > (…)`` is then only a
range on its first column plus an Incremental Sort: ``make bench`` figure 1 measured the whole
tick over 10,000 in-flight rows at 1,000,000 rows of history at 1,190 ms with both indexes and
817 ms with the keyset index alone (and flat against 100,000 rows: ×0.95).

Dropped concurrently (no write lock on ``jobs``), and only when the index of that name is the
one 0002 builds (one column, ``provider_call_started_at``, the in-flight predicate): a
platform's own index that happens to carry the name but indexes something else is left alone
(0002's ``IF NOT EXISTS`` kept it too). A downgrade rebuilds the library's definition only where
no index of that name exists.

Revision ID: 0022
Revises: 0021
"""

from alembic import op
from reconcile.db.migrate import (
    create_index_concurrently,
    drop_index_concurrently,
    is_pg,
    set_lock_timeout,
)

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

INDEX = "jobs_inflight_idx"
IN_FLIGHT = "status IN ('pending', 'processing')"


def _is_the_librarys(definition: str | None) -> bool:
    """Whether ``definition`` (PostgreSQL's ``pg_get_indexdef`` / SQLite's ``CREATE INDEX``
    text) is 0002's: exactly the one column and the in-flight predicate."""
    if not definition:
        return False
    columns = definition.split("(", 1)[1].split(")", 1)[0].replace('"', "").strip() \
        if "(" in definition else ""
    return columns == "provider_call_started_at" and "pending" in definition \
        and "processing" in definition


def _definition() -> str | None:
    bind = op.get_bind()
    if is_pg():
        row = bind.exec_driver_sql(
            "SELECT pg_get_indexdef(i.indexrelid) FROM pg_index i "
            "JOIN pg_class c ON c.oid = i.indexrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            f"WHERE c.relname = '{INDEX}' AND n.nspname = current_schema()").first()
    else:
        row = bind.exec_driver_sql(
            f"SELECT sql FROM sqlite_master WHERE type = 'index' AND name = '{INDEX}'").first()
    return row[0] if row else None


def upgrade() -> None:
    set_lock_timeout()
    if op.get_context().as_sql:  # offline SQL: no catalog to read; 0002's index is the one
        drop_index_concurrently(INDEX)
    elif _is_the_librarys(_definition()):
        drop_index_concurrently(INDEX)


def downgrade() -> None:
    set_lock_timeout()
    create_index_concurrently(INDEX, "jobs", "provider_call_started_at", where=IN_FLIGHT)
