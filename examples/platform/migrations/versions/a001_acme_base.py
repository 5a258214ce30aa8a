"""acme's tables (before it adopted reconcile): jobs, usage_logs, workflow_executions, and its
own acme_notifications.

Revision ID: a001
Revises:
"""

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB

from alembic import op

revision = "a001"
down_revision = None
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.Uuid(), primary_key=True),
        sa.Column("user_id", sa.Uuid(), nullable=False),
        sa.Column("job_type", sa.Text(), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("input_data", JSONB()),
        sa.Column("output_data", JSONB()),
        sa.Column("error_message", sa.Text()),
        sa.Column("progress", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("should_watermark", sa.Boolean()),
        sa.Column("is_public", sa.Boolean()),
        sa.Column("workflow_execution_id", sa.Uuid()),
        sa.Column("node_id", sa.Text()),
        sa.Column("provider", sa.Text()),
        sa.Column("provider_cost", sa.Numeric(12, 6)),
        sa.Column("display_cost", sa.BigInteger()),
        sa.Column("created_at", TZ, nullable=False, server_default=sa.func.now()),
        sa.Column("started_at", TZ),
        sa.Column("completed_at", TZ),
    )
    op.create_index("jobs_user_created_idx", "jobs", ["user_id", "created_at"])
    op.create_table(
        "usage_logs",
        sa.Column("id", sa.Uuid(), primary_key=True),
        sa.Column("job_id", sa.Uuid()),
        sa.Column("user_id", sa.Uuid(), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("credits", sa.BigInteger(), nullable=False),
        sa.Column("metadata", JSONB()),
        sa.Column("created_at", TZ, nullable=False, server_default=sa.func.now()),
    )
    op.create_index("usage_logs_job_id_idx", "usage_logs", ["job_id"])
    op.create_table(
        "workflow_executions",
        sa.Column("id", sa.Uuid(), primary_key=True),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("failed_nodes", JSONB()),
        sa.Column("error_message", sa.Text()),
    )
    op.create_table(
        "acme_notifications",
        sa.Column("id", sa.BigInteger(), sa.Identity(), primary_key=True),
        sa.Column("job_id", sa.Uuid(), nullable=False, unique=True),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("created_at", TZ, nullable=False, server_default=sa.func.now()),
    )


def downgrade() -> None:
    op.drop_table("acme_notifications")
    op.drop_table("workflow_executions")
    op.drop_table("usage_logs")
    op.drop_table("jobs")
