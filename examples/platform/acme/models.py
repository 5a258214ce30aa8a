"""acme's own tables, as its Alembic history creates them (``migrations/``).

``jobs``, ``usage_logs`` and ``workflow_executions`` are acme's (the library works on them and
adds its columns); ``acme_notifications`` is acme's alone. The library's additions are not
described here: :func:`reconcile.migrations.include_object` keeps autogenerate off them.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    Index,
    Integer,
    Numeric,
    Text,
    Uuid,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


TZ = DateTime(timezone=True)


class Job(Base):
    __tablename__ = "jobs"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True)
    user_id: Mapped[uuid.UUID] = mapped_column(Uuid)
    job_type: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(Text)
    input_data: Mapped[Any | None] = mapped_column(JSONB)
    output_data: Mapped[Any | None] = mapped_column(JSONB)
    error_message: Mapped[str | None] = mapped_column(Text)
    progress: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    should_watermark: Mapped[bool | None] = mapped_column(Boolean)
    is_public: Mapped[bool | None] = mapped_column(Boolean)
    workflow_execution_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    node_id: Mapped[str | None] = mapped_column(Text)
    provider: Mapped[str | None] = mapped_column(Text)
    provider_cost: Mapped[Decimal | None] = mapped_column(Numeric(12, 6))
    display_cost: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(TZ, server_default=func.now())
    started_at: Mapped[datetime | None] = mapped_column(TZ)
    completed_at: Mapped[datetime | None] = mapped_column(TZ)

    __table_args__ = (Index("jobs_user_created_idx", "user_id", "created_at"),)


class UsageLog(Base):
    __tablename__ = "usage_logs"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True)
    job_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    user_id: Mapped[uuid.UUID] = mapped_column(Uuid)
    status: Mapped[str] = mapped_column(Text)
    credits: Mapped[int] = mapped_column(BigInteger)
    metadata_: Mapped[Any | None] = mapped_column("metadata", JSONB)
    created_at: Mapped[datetime] = mapped_column(TZ, server_default=func.now())

    # acme's own index on job_id: the library does not add a second one (its revision 0014)
    __table_args__ = (Index("usage_logs_job_id_idx", "job_id"),)


class WorkflowExecution(Base):
    __tablename__ = "workflow_executions"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True)
    status: Mapped[str] = mapped_column(Text)
    failed_nodes: Mapped[Any | None] = mapped_column(JSONB)
    error_message: Mapped[str | None] = mapped_column(Text)


class Notification(Base):
    """Written by acme's own task when the library reports a job completed."""

    __tablename__ = "acme_notifications"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    job_id: Mapped[uuid.UUID] = mapped_column(Uuid, unique=True)
    kind: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(TZ, server_default=func.now())
