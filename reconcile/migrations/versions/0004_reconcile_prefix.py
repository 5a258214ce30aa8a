"""Give the library's own tables a ``reconcile_`` prefix (schema isolation).

A platform that already has an ``assets`` (or ``job_events``, ``credit_lots`` …) table could not
install revision 0003's generic names. Tables, their primary/unique constraints, indexes and
identity sequences are renamed in place: a rename is a catalog change (no rewrite, no data
copy), taken under the usual ``lock_timeout``. The platform's tables (``jobs``, ``usage_logs``,
``workflow_executions``) keep the seed's names.

SQLite (the embedded default) renames the tables; its indexes cannot be renamed, so they are
dropped and created again under the new names (the embedded database is small by nature).

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa

from alembic import op
from reconcile.db.migrate import is_pg, set_lock_timeout

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

TABLES = (
    "credit_balances", "credit_lots", "credit_transactions", "webhook_deliveries", "assets",
    "credit_anomalies", "job_events",
)
WITH_IDENTITY = ("credit_lots", "webhook_deliveries", "credit_anomalies", "job_events")
# constraints named by 0003 (pk_<t>, uq_<t>_<cols>): renamed with their table
UNIQUES = {
    "credit_lots": ["source_txn_id"],
    "webhook_deliveries": ["provider_delivery_id"],
    "assets": ["job_id_index"],
    "job_events": ["event_id"],
}
# index name -> (table, columns, partial predicate)
INDEXES = {
    "credit_lots_open_idx": ("credit_lots", ["user_id", "pool", "id"], "remaining_amount > 0"),
    "ix_credit_transactions_user_id": ("credit_transactions", ["user_id"], None),
    "ix_credit_transactions_job_id": ("credit_transactions", ["job_id"], None),
    "ix_webhook_deliveries_upstream_id": ("webhook_deliveries", ["upstream_id"], None),
    "ix_webhook_deliveries_job_id": ("webhook_deliveries", ["job_id"], None),
    "ix_assets_user_id": ("assets", ["user_id"], None),
    "ix_credit_anomalies_job_id": ("credit_anomalies", ["job_id"], None),
    "ix_job_events_job_id": ("job_events", ["job_id"], None),
    "job_events_unpublished_idx": ("job_events", ["created_at"], "published_at IS NULL"),
}


def new_name(old: str) -> str:
    """``credit_lots_open_idx`` → ``reconcile_credit_lots_open_idx``; ``ix_assets_user_id`` →
    ``ix_reconcile_assets_user_id`` (the naming convention's shape for the new table name)."""
    for prefix in ("ix_", "uq_", "pk_"):
        if old.startswith(prefix):
            return prefix + "reconcile_" + old[len(prefix):]
    return "reconcile_" + old


def _pg(sql: str, rule: str) -> None:
    # squawk warns that a rename breaks clients still running the old code. Here the only client
    # is this library, and a deploy ships the renamed models with this revision (the old code
    # never ran in production); the comment silences exactly that rule for this one statement.
    op.execute(f"-- squawk-ignore {rule}\n{sql}")


def _rename(forward: bool) -> None:
    set_lock_timeout()
    src = (lambda t: t) if forward else (lambda t: "reconcile_" + t)
    dst = (lambda t: "reconcile_" + t) if forward else (lambda t: t)
    if is_pg():
        for table in TABLES:
            _pg(f"ALTER TABLE {src(table)} RENAME TO {dst(table)}", "renaming-table")
            _pg(f"ALTER TABLE {dst(table)} RENAME CONSTRAINT pk_{src(table)} TO pk_{dst(table)}",
                "renaming-object")
            for cols in UNIQUES.get(table, []):
                _pg(f"ALTER TABLE {dst(table)} RENAME CONSTRAINT "
                    f"uq_{src(table)}_{cols} TO uq_{dst(table)}_{cols}", "renaming-object")
            if table in WITH_IDENTITY:
                _pg(f"ALTER SEQUENCE IF EXISTS {src(table)}_id_seq RENAME TO {dst(table)}_id_seq",
                    "renaming-object")
        for old in INDEXES:
            a, b = (old, new_name(old)) if forward else (new_name(old), old)
            _pg(f"ALTER INDEX {a} RENAME TO {b}", "renaming-object")
        return
    for old in INDEXES:
        op.execute(f"DROP INDEX IF EXISTS {old if forward else new_name(old)}")
    for table in TABLES:
        op.execute(f"ALTER TABLE {src(table)} RENAME TO {dst(table)}")
    for old, (table, columns, where) in INDEXES.items():
        kw = {"sqlite_where": sa.text(where)} if where else {}
        op.create_index(new_name(old) if forward else old, dst(table), columns, **kw)


def upgrade() -> None:
    _rename(forward=True)


def downgrade() -> None:
    _rename(forward=False)
