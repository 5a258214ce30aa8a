"""Baseline: the platform tables the library works on, created only where absent.

A platform that already has ``jobs``, ``usage_logs`` and ``workflow_executions`` keeps them
untouched (only ``workflow_executions.failed_nodes``/``error_message`` are added if missing); a
standalone install gets them here. Everything created is recorded in
``reconcile_created_objects`` and is all that a downgrade removes.

Revision ID: 0001
Revises:
"""

from alembic import op
from reconcile.db.migrate import (
    add_column_if_absent,
    create_table_if_absent,
    drop_recorded,
    is_pg,
    set_lock_timeout,
)

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

JOBS = """CREATE TABLE jobs (
  id uuid PRIMARY KEY, user_id uuid NOT NULL, job_type text NOT NULL,
  status text NOT NULL,
  input_data jsonb, output_data jsonb, error_message text, progress int NOT NULL DEFAULT 0,
  should_watermark boolean, is_public boolean, workflow_execution_id uuid, node_id text,
  provider text, provider_cost numeric(12,6), display_cost bigint,
  created_at timestamptz NOT NULL DEFAULT now(), started_at timestamptz, completed_at timestamptz)"""
JOBS_SQLITE = """CREATE TABLE jobs (
  id CHAR(32) NOT NULL PRIMARY KEY, user_id CHAR(32) NOT NULL, job_type TEXT NOT NULL,
  status TEXT NOT NULL,
  input_data JSON, output_data JSON, error_message TEXT, progress INTEGER NOT NULL DEFAULT 0,
  should_watermark BOOLEAN, is_public BOOLEAN, workflow_execution_id CHAR(32), node_id TEXT,
  provider TEXT, provider_cost NUMERIC(12,6), display_cost BIGINT,
  created_at DATETIME NOT NULL DEFAULT (CURRENT_TIMESTAMP), started_at DATETIME,
  completed_at DATETIME)"""
USAGE = """CREATE TABLE usage_logs (
  id uuid PRIMARY KEY, job_id uuid, user_id uuid NOT NULL,
  status text NOT NULL,
  credits bigint NOT NULL, metadata jsonb,
  created_at timestamptz NOT NULL DEFAULT now())"""
USAGE_SQLITE = """CREATE TABLE usage_logs (
  id CHAR(32) NOT NULL PRIMARY KEY, job_id CHAR(32), user_id CHAR(32) NOT NULL,
  status TEXT NOT NULL, credits BIGINT NOT NULL, metadata JSON,
  created_at DATETIME NOT NULL DEFAULT (CURRENT_TIMESTAMP))"""
WORKFLOWS = """CREATE TABLE workflow_executions (
  id uuid PRIMARY KEY, status text NOT NULL, failed_nodes jsonb, error_message text)"""
WORKFLOWS_SQLITE = """CREATE TABLE workflow_executions (
  id CHAR(32) NOT NULL PRIMARY KEY, status TEXT NOT NULL, failed_nodes JSON, error_message TEXT)"""


def upgrade() -> None:
    set_lock_timeout()
    op.execute("CREATE TABLE IF NOT EXISTS reconcile_created_objects (name text NOT NULL PRIMARY KEY)")
    create_table_if_absent("jobs", JOBS, JOBS_SQLITE)
    create_table_if_absent("usage_logs", USAGE, USAGE_SQLITE)
    create_table_if_absent("workflow_executions", WORKFLOWS, WORKFLOWS_SQLITE)
    json_type = "jsonb" if is_pg() else "JSON"
    add_column_if_absent("workflow_executions", "failed_nodes", json_type)
    add_column_if_absent("workflow_executions", "error_message", "text")


def downgrade() -> None:
    set_lock_timeout()
    drop_recorded("column:")
    drop_recorded("table:")
    op.execute("DROP TABLE IF EXISTS reconcile_created_objects")
