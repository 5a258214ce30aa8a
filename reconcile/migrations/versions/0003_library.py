"""The library's own columns on ``jobs`` and its tables (DESIGN.md §2.2).

Columns: nullable or constant-default only (no table rewrite). New indexes on the platform's
tables are partial (in flight / unsettled) and built concurrently, so their cost never grows
with history. New tables: the credit ledger, webhook deliveries, assets, anomalies, the
``job_events`` outbox.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa

from alembic import op
from reconcile.db.migrate import (
    create_index_concurrently,
    drop_index_concurrently,
    is_pg,
    set_lock_timeout,
    sqlite_has_column,
)
from reconcile.db.types import JSONType, UTCDateTime

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

JOB_COLUMNS = [
    ("submission_state", "text"),
    ("provider_model", "text"),
    ("provider_options", "jsonb"),
    ("claim_token", "text"),
    ("claim_expires_at", "timestamptz"),
    ("poll_generation", "int NOT NULL DEFAULT 0"),
    ("poll_seq", "int NOT NULL DEFAULT 0"),
    ("poll_lease_expires_at", "timestamptz"),
    ("error_code", "text"),
    ("error_detail", "jsonb"),
    ("credits_actual", "bigint"),
    ("next_poll_at", "timestamptz"),
    ("settle_attempts", "int NOT NULL DEFAULT 0"),
    ("reconcile_last_attempt_at", "timestamptz"),
    ("create_not_before", "timestamptz"),
    ("create_rate_limit_count", "int NOT NULL DEFAULT 0"),
    ("create_enqueue_count", "int NOT NULL DEFAULT 0"),
    ("create_enqueued_at", "timestamptz"),
]

JOB_INDEXES = [
    ("jobs_unsettled_idx", "jobs", "next_poll_at", "next_poll_at IS NOT NULL"),
    ("jobs_inflight_task_idx", "jobs", "provider_task_id",
     "status IN ('pending', 'processing') AND provider_task_id IS NOT NULL"),
    ("reconcile_usage_logs_job_idx", "usage_logs", "job_id", None),
]

BIGID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _id() -> sa.Column:
    # identity, not serial (squawk prefer-identity); SQLite's INTEGER PRIMARY KEY is its rowid
    return sa.Column("id", BIGID, sa.Identity(), primary_key=True)


def upgrade() -> None:
    set_lock_timeout()
    if is_pg():
        op.execute("ALTER TABLE jobs\n" + ",\n".join(
            f"  ADD COLUMN IF NOT EXISTS {name} {ddl}" for name, ddl in JOB_COLUMNS))
    else:
        for name, ddl in JOB_COLUMNS:
            if not sqlite_has_column("jobs", name):
                ddl = ddl.replace("timestamptz", "DATETIME").replace("jsonb", "JSON")
                op.execute(f"ALTER TABLE jobs ADD COLUMN {name} {ddl}")

    op.create_table(
        "credit_balances",
        sa.Column("user_id", sa.Uuid(), primary_key=True),
        sa.Column("sub", sa.BigInteger(), nullable=False, server_default=sa.text("0")),
        sa.Column("topup", sa.BigInteger(), nullable=False, server_default=sa.text("0")),
        sa.Column("updated_at", UTCDateTime(), nullable=False, server_default=sa.func.now()),
        sa.PrimaryKeyConstraint("user_id", name="pk_credit_balances"),
    )
    op.create_table(
        "credit_lots",
        _id(),
        sa.Column("user_id", sa.Uuid(), nullable=False),
        sa.Column("pool", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("source_txn_id", sa.Text(), nullable=False),
        sa.Column("amount", sa.BigInteger(), nullable=False),
        sa.Column("remaining_amount", sa.BigInteger(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False, server_default=sa.func.now()),
        sa.PrimaryKeyConstraint("id", name="pk_credit_lots"),
        sa.UniqueConstraint("source_txn_id", name="uq_credit_lots_source_txn_id"),
    )
    op.create_index("credit_lots_open_idx", "credit_lots", ["user_id", "pool", "id"],
                    postgresql_where=sa.text("remaining_amount > 0"),
                    sqlite_where=sa.text("remaining_amount > 0"))
    op.create_table(
        "credit_transactions",
        sa.Column("id", sa.Text(), primary_key=True),
        sa.Column("user_id", sa.Uuid(), nullable=False),
        sa.Column("job_id", sa.Uuid(), nullable=True),
        sa.Column("type", sa.Text(), nullable=False),
        sa.Column("amount", sa.BigInteger(), nullable=False),
        sa.Column("from_sub", sa.BigInteger(), nullable=False, server_default=sa.text("0")),
        sa.Column("from_topup", sa.BigInteger(), nullable=False, server_default=sa.text("0")),
        sa.Column("created_at", UTCDateTime(), nullable=False, server_default=sa.func.now()),
        sa.PrimaryKeyConstraint("id", name="pk_credit_transactions"),
    )
    op.create_index("ix_credit_transactions_user_id", "credit_transactions", ["user_id"])
    op.create_index("ix_credit_transactions_job_id", "credit_transactions", ["job_id"])
    op.create_table(
        "webhook_deliveries",
        _id(),
        sa.Column("provider", sa.Text(), nullable=False),
        sa.Column("delivery_id", sa.Text(), nullable=False),
        sa.Column("upstream_id", sa.Text(), nullable=True),
        sa.Column("job_id", sa.Uuid(), nullable=True),
        sa.Column("received_at", UTCDateTime(), nullable=False),
        sa.Column("payload_digest", sa.Text(), nullable=False),
        sa.Column("status", sa.Text(), nullable=True),
        sa.Column("payload", JSONType, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_webhook_deliveries"),
        sa.UniqueConstraint("provider", "delivery_id", name="uq_webhook_deliveries_provider_delivery_id"),
    )
    op.create_index("ix_webhook_deliveries_upstream_id", "webhook_deliveries", ["upstream_id"])
    op.create_index("ix_webhook_deliveries_job_id", "webhook_deliveries", ["job_id"])
    op.create_table(
        "assets",
        sa.Column("id", sa.Uuid(), primary_key=True),
        sa.Column("job_id", sa.Uuid(), nullable=False),
        sa.Column("user_id", sa.Uuid(), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("storage_key", sa.Text(), nullable=False),
        sa.Column("media_type", sa.Text(), nullable=True),
        sa.Column("is_public", sa.Boolean(), nullable=False),
        sa.Column("watermarked", sa.Boolean(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False, server_default=sa.func.now()),
        sa.PrimaryKeyConstraint("id", name="pk_assets"),
        sa.UniqueConstraint("job_id", "index", name="uq_assets_job_id_index"),
    )
    op.create_index("ix_assets_user_id", "assets", ["user_id"])
    op.create_table(
        "credit_anomalies",
        _id(),
        sa.Column("job_id", sa.Uuid(), nullable=True),
        sa.Column("user_id", sa.Uuid(), nullable=True),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("detail", JSONType, nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False, server_default=sa.func.now()),
        sa.PrimaryKeyConstraint("id", name="pk_credit_anomalies"),
    )
    op.create_index("ix_credit_anomalies_job_id", "credit_anomalies", ["job_id"])
    op.create_table(
        "job_events",
        _id(),
        sa.Column("event_id", sa.Text(), nullable=False),
        sa.Column("job_id", sa.Uuid(), nullable=False),
        sa.Column("user_id", sa.Uuid(), nullable=False),
        sa.Column("type", sa.Text(), nullable=False),
        sa.Column("payload", JSONType, nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("published_at", UTCDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_job_events"),
        sa.UniqueConstraint("event_id", name="uq_job_events_event_id"),
    )
    op.create_index("ix_job_events_job_id", "job_events", ["job_id"])
    op.create_index("job_events_unpublished_idx", "job_events", ["created_at"],
                    postgresql_where=sa.text("published_at IS NULL"),
                    sqlite_where=sa.text("published_at IS NULL"))

    for name, table, columns, where in JOB_INDEXES:
        create_index_concurrently(name, table, columns, where)


def downgrade() -> None:
    set_lock_timeout()
    for name, *_ in JOB_INDEXES:
        drop_index_concurrently(name)
    for table in ("job_events", "credit_anomalies", "assets", "webhook_deliveries",
                  "credit_transactions", "credit_lots", "credit_balances"):
        op.drop_table(table)
    for name, _ in reversed(JOB_COLUMNS):
        if is_pg():
            op.execute(f"ALTER TABLE jobs DROP COLUMN IF EXISTS {name}")
        elif sqlite_has_column("jobs", name):
            op.execute(f"ALTER TABLE jobs DROP COLUMN {name}")
