"""The schema: the platform's tables the library works on, and the library's own.

The platform tables (``jobs``, ``usage_logs``, ``workflow_executions``) are mapped with the
columns an existing platform already has plus the library's additions. Migrations in ``alembic/``
create exactly this (``alembic check`` proves it).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    FetchedValue,
    Identity,
    Index,
    Integer,
    MetaData,
    Numeric,
    Table,
    Text,
    UniqueConstraint,
    Uuid,
    func,
    text,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator, TypeEngine

from ..states import Status, Submission
from .types import JSONType, UTCDateTime

#: the most characters ``jobs.provider_status`` stores (the writer cuts a longer status:
#: ``reconcile.jobstore.stored_status``)
PROVIDER_STATUS_MAX = 64


def _longest(bound: int) -> dict[str, int]:
    """A text column's ``info``: the longest value the library writes to it. The table contract
    breaks on a ``varchar(n)`` shorter than that (the library's write would fail), and notes a
    longer one as fitting."""
    return {"longest": bound}

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

BIGID = BigInteger().with_variant(Integer, "sqlite")
IN_FLIGHT = text("status IN ('pending', 'processing')")
POLL_DUE = "status IN ('pending', 'processing') AND poll_due_at IS NOT NULL"
COMPLETED_AFTER_FAILURE = "status = 'completed' AND error_code IS NOT NULL"
# in flight with an unknown outcome (the console's uncertain list; migration 0025)
UNKNOWN_OUTCOME_IN_FLIGHT = ("status IN ('pending', 'processing') "
                             "AND submission_state IN ('submitting', 'uncertain')")


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class Job(Base):
    __tablename__ = "jobs"

    # --- the platform's columns (what an existing platform already has) ---
    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True)
    user_id: Mapped[uuid.UUID] = mapped_column(Uuid)
    job_type: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(Text, info=_longest(max(len(s) for s in Status)))
    input_data: Mapped[Any | None] = mapped_column(JSONType)
    output_data: Mapped[Any | None] = mapped_column(JSONType)
    error_message: Mapped[str | None] = mapped_column(Text)
    progress: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    should_watermark: Mapped[bool | None] = mapped_column(Boolean)
    is_public: Mapped[bool | None] = mapped_column(Boolean)
    workflow_execution_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    node_id: Mapped[str | None] = mapped_column(Text)
    provider: Mapped[str | None] = mapped_column(Text)
    provider_cost: Mapped[Decimal | None] = mapped_column(Numeric(12, 6))
    display_cost: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, server_default=func.now())
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    completed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    # --- the in-flight columns and index (revision 0002) ---
    provider_kind: Mapped[str | None] = mapped_column(Text)
    provider_task_id: Mapped[str | None] = mapped_column(Text)
    provider_call_started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    reconcile_attempts: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    reconcile_last_error: Mapped[str | None] = mapped_column(Text)

    # --- the library's columns ---
    # NULL: a row the library never submitted (legacy or another subsystem's)
    submission_state: Mapped[str | None] = mapped_column(
        Text, info=_longest(max(len(s) for s in Submission)))
    provider_model: Mapped[str | None] = mapped_column(Text)
    # provider request options that are not model input (e.g. a Replicate training's destination)
    provider_options: Mapped[Any | None] = mapped_column(JSONType)
    claim_token: Mapped[str | None] = mapped_column(Text)
    claim_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    poll_generation: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    poll_seq: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    poll_lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    error_code: Mapped[str | None] = mapped_column(Text)
    error_detail: Mapped[Any | None] = mapped_column(JSONType)
    credits_actual: Mapped[int | None] = mapped_column(BigInteger)
    # settlement retry time only (never a poll schedule); only the library sets it
    next_poll_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    settle_attempts: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    reconcile_last_attempt_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    create_not_before: Mapped[datetime | None] = mapped_column(UTCDateTime)
    create_rate_limit_count: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    create_enqueue_count: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    create_enqueued_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # RECONCILE_POLL_MODE=batch: when the next status read is due (a claim pushes it one batch
    # lease ahead); NULL for chain-mode rows. Never next_poll_at (settlement retries use that)
    poll_due_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # the code of reconcile_last_error (migration 0021); NULL on rows written before it (then
    # jobstore.legacy_error_code reads the code from the text) and for errors without a code
    reconcile_last_error_code: Mapped[str | None] = mapped_column(Text)
    # the worker process (reconcile_workers.worker_id) that wrote the row's current claim: the
    # create claim, the poll turn or the batch claim; NULL when the writer had no heartbeat.
    # When that worker's heartbeat lapses its claims end at once instead of at their lease
    claimed_by: Mapped[str | None] = mapped_column(Text)
    # the provider's raw status token at the latest status read of the job in flight (migration
    # 0028; PollResult.raw_status, at most PROVIDER_STATUS_MAX characters); NULL until
    # a read stored one. Batch mode writes it with the read's result, chain mode with the
    # chain's next turn (README, The provider's last status)
    provider_status: Mapped[str | None] = mapped_column(Text, info=_longest(PROVIDER_STATUS_MAX))
    # how many times the job's polling was resumed (migration 0030; jobstore.start_new_chain
    # adds one, NULL: none since then): the mark of a resume that keeps a turnless generation,
    # which a reader holding no turn of its own (the sweep) fences on (jobstore.claim_of)
    poll_resumes: Mapped[int | None] = mapped_column(Integer)
    # until when a success read of the task may still be having its outputs stored (migration
    # 0031; lifecycle.storing_hold, NULL: no mark): no read that is no verdict fails the job at
    # its exhaustion horizon before then (lifecycle.exhaust)
    storing_until: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # how many storers may still be storing under that mark (migration 0032; NULL: none): one
    # storer's failed storing takes its own back, the failure at the horizon waits for none
    storing_count: Mapped[int | None] = mapped_column(Integer)

    __table_args__ = (
        # in-flight rows by call start (migration 0019; 0022 dropped the one-column
        # jobs_inflight_idx it supersedes): the sweep's keyset cursor
        # (provider_call_started_at, id) > (…) as an index condition
        Index("jobs_inflight_keyset_idx", "provider_call_started_at", "id",
              postgresql_where=IN_FLIGHT, sqlite_where=IN_FLIGHT),
        # the batch poller's claim: due rows in flight, oldest due first (migration 0020)
        Index("jobs_poll_due_idx", "poll_due_at",
              postgresql_where=text(POLL_DUE), sqlite_where=text(POLL_DUE)),
        # failed/cancelled rows whose refund has not settled: only the library sets next_poll_at
        Index("jobs_unsettled_idx", "next_poll_at",
              postgresql_where=text("next_poll_at IS NOT NULL"),
              sqlite_where=text("next_poll_at IS NOT NULL")),
        # webhook → job lookup, in flight only
        Index("jobs_inflight_task_idx", "provider_task_id",
              postgresql_where=text("status IN ('pending', 'processing') AND provider_task_id IS NOT NULL"),
              sqlite_where=text("status IN ('pending', 'processing') AND provider_task_id IS NOT NULL")),
        # completed by someone else after the library failed it (the library's own completion
        # clears error_code): the late-completion sweep phase reads only these
        Index("jobs_completed_after_failure_idx", "completed_at",
              postgresql_where=text(COMPLETED_AFTER_FAILURE),
              sqlite_where=text(COMPLETED_AFTER_FAILURE)),
        # the console (migration 0025): uncertain submissions oldest first, keyset (created_at,
        # id); completed rows by completion time (the health page's last day)
        Index("jobs_uncertain_idx", "created_at", "id",
              postgresql_where=text(UNKNOWN_OUTCOME_IN_FLIGHT),
              sqlite_where=text(UNKNOWN_OUTCOME_IN_FLIGHT)),
        Index("jobs_completed_at_idx", "completed_at",
              postgresql_where=text("status = 'completed'"),
              sqlite_where=text("status = 'completed'")),
    )


class _AnyId(TypeEngine[Any]):
    """A uuid in DDL (``UUID``; ``CHAR(32)`` on SQLite) that binds a value as it is: no cast, so
    an integer id binds as an integer."""

    __visit_name__ = "uuid"
    native_uuid = True
    as_uuid = True
    length = 32
    collation = None


class UsageLogId(TypeDecorator[uuid.UUID | int]):
    """``usage_logs.id``: the platform's uuid, or its integer (a ``bigint`` identity, a serial:
    Django's ``BigAutoField``). Created as a uuid column; reads and binds either (the table
    contract, :mod:`reconcile.db.contract`)."""

    impl = Uuid
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        return _AnyId()

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        if isinstance(value, uuid.UUID) and dialect.name != "postgresql":
            return value.hex  # SQLite: Uuid's CHAR(32) storage
        return value

    def process_result_value(self, value: Any, dialect: Dialect) -> uuid.UUID | int | None:
        if isinstance(value, str):
            return uuid.UUID(value)
        found: uuid.UUID | int | None = value
        return found


class UsageLog(Base):
    __tablename__ = "usage_logs"

    # a uuid, or the platform's integer id: the database assigns it where it has a default
    # (FetchedValue: an insert may leave it out and read it back; no DDL)
    id: Mapped[uuid.UUID | int] = mapped_column(UsageLogId, primary_key=True,
                                                server_default=FetchedValue())
    job_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    user_id: Mapped[uuid.UUID] = mapped_column(Uuid)
    status: Mapped[str] = mapped_column(Text)  # reserved | committed | refunded
    credits: Mapped[int] = mapped_column(BigInteger)
    metadata_: Mapped[Any | None] = mapped_column("metadata", JSONType)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, server_default=func.now())

    __table_args__ = (Index("reconcile_usage_logs_job_idx", "job_id"),)


class WorkflowExecution(Base):
    __tablename__ = "workflow_executions"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True)
    status: Mapped[str] = mapped_column(Text)
    failed_nodes: Mapped[Any | None] = mapped_column(JSONType)
    error_message: Mapped[str | None] = mapped_column(Text)


class ReconcileMeta(Base):
    """One row: when the library was adopted on this database (the legacy cutoff's default)."""

    __tablename__ = "reconcile_meta"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, server_default=text("1"))
    adopted_at: Mapped[datetime] = mapped_column(UTCDateTime)

    __table_args__ = (CheckConstraint("id = 1", name="one_row"),)


class CreatedObject(Base):
    """What the library itself created, so a downgrade removes only that."""

    __tablename__ = "reconcile_created_objects"

    name: Mapped[str] = mapped_column(Text, primary_key=True)  # "table:jobs", "column:t.c"


# ----------------------------------------------------------------------------- ledger


class CreditBalance(Base):
    __tablename__ = "reconcile_credit_balances"

    user_id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True)
    sub: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    topup: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, server_default=func.now())


class CreditLot(Base):
    __tablename__ = "reconcile_credit_lots"

    id: Mapped[int] = mapped_column(BIGID, Identity(), primary_key=True)
    user_id: Mapped[uuid.UUID] = mapped_column(Uuid)
    pool: Mapped[str] = mapped_column(Text)  # sub | topup
    kind: Mapped[str] = mapped_column(Text)  # GRANT | REFUND | RELEASE
    source_txn_id: Mapped[str] = mapped_column(Text, unique=True)
    amount: Mapped[int] = mapped_column(BigInteger)
    remaining_amount: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, server_default=func.now())

    __table_args__ = (
        # FIFO consumption touches only lots with something left
        Index("reconcile_credit_lots_open_idx", "user_id", "pool", "id",
              postgresql_where=text("remaining_amount > 0"),
              sqlite_where=text("remaining_amount > 0")),
    )


class CreditTransaction(Base):
    """Append-only. Ids are deterministic (``job-usage:{job}``, ``job-refund:{job}``, …)."""

    __tablename__ = "reconcile_credit_transactions"

    id: Mapped[str] = mapped_column(Text, primary_key=True)
    user_id: Mapped[uuid.UUID] = mapped_column(Uuid, index=True)
    job_id: Mapped[uuid.UUID | None] = mapped_column(Uuid, index=True)
    type: Mapped[str] = mapped_column(Text)  # GRANT | USAGE | COMMIT | RELEASE | REFUND
    amount: Mapped[int] = mapped_column(BigInteger)
    from_sub: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    from_topup: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, server_default=func.now())

    __table_args__ = (
        # refunds per hour (the console's health page; migration 0025)
        Index("reconcile_credit_transactions_refund_idx", "created_at",
              postgresql_where=text("type = 'REFUND'"), sqlite_where=text("type = 'REFUND'")),
    )


# ----------------------------------------------------------------------------- evidence & outputs


class WebhookDelivery(Base):
    __tablename__ = "reconcile_webhook_deliveries"

    id: Mapped[int] = mapped_column(BIGID, Identity(), primary_key=True)
    provider: Mapped[str] = mapped_column(Text)
    delivery_id: Mapped[str] = mapped_column(Text)
    upstream_id: Mapped[str | None] = mapped_column(Text, index=True)
    job_id: Mapped[uuid.UUID | None] = mapped_column(Uuid, index=True)  # the planted job id
    received_at: Mapped[datetime] = mapped_column(UTCDateTime)
    payload_digest: Mapped[str] = mapped_column(Text)
    status: Mapped[str | None] = mapped_column(Text)
    payload: Mapped[Any | None] = mapped_column(JSONType)

    __table_args__ = (UniqueConstraint("provider", "delivery_id"),)


class Asset(Base):
    __tablename__ = "reconcile_assets"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True)
    job_id: Mapped[uuid.UUID] = mapped_column(Uuid)
    user_id: Mapped[uuid.UUID] = mapped_column(Uuid, index=True)
    index: Mapped[int] = mapped_column(Integer)
    storage_key: Mapped[str] = mapped_column(Text)
    media_type: Mapped[str | None] = mapped_column(Text)
    is_public: Mapped[bool] = mapped_column(Boolean)
    watermarked: Mapped[bool] = mapped_column(Boolean)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, server_default=func.now())

    __table_args__ = (UniqueConstraint("job_id", "index"),)


class CreditAnomaly(Base):
    __tablename__ = "reconcile_credit_anomalies"

    id: Mapped[int] = mapped_column(BIGID, Identity(), primary_key=True)
    job_id: Mapped[uuid.UUID | None] = mapped_column(Uuid, index=True)
    user_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    kind: Mapped[str] = mapped_column(Text)
    detail: Mapped[Any | None] = mapped_column(JSONType)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, server_default=func.now())
    # open (NULL) until the operator action that answers it closes it (reconcile.operator;
    # migration 0025): when, who (identity via surface), which action
    resolved_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    resolved_by: Mapped[str | None] = mapped_column(Text)
    resolved_action: Mapped[str | None] = mapped_column(Text)

    __table_args__ = (
        Index("reconcile_credit_anomalies_open_idx", "id",
              postgresql_where=text("resolved_at IS NULL"),
              sqlite_where=text("resolved_at IS NULL")),
    )


class JobEvent(Base):
    """Outbox: written with the state change, published after commit, at least once."""

    __tablename__ = "reconcile_job_events"

    id: Mapped[int] = mapped_column(BIGID, Identity(), primary_key=True)
    event_id: Mapped[str] = mapped_column(Text, unique=True)  # consumers dedupe on it
    job_id: Mapped[uuid.UUID] = mapped_column(Uuid, index=True)
    user_id: Mapped[uuid.UUID] = mapped_column(Uuid)
    type: Mapped[str] = mapped_column(Text)
    payload: Mapped[Any | None] = mapped_column(JSONType)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    published_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    __table_args__ = (
        Index("reconcile_job_events_unpublished_idx", "created_at",
              postgresql_where=text("published_at IS NULL"),
              sqlite_where=text("published_at IS NULL")),
    )


def table_of(model: type[Base]) -> Table:
    """A mapped class's :class:`~sqlalchemy.Table` (SQLAlchemy types ``__table__`` as a
    ``FromClause``; every model here maps one table)."""
    table = model.__table__
    assert isinstance(table, Table)
    return table


class SweepTick(Base):
    """One sweep tick's counts and decisions (``reconcile.sweep``), kept a week for the
    operator's health page; the log line and the metrics carry the same figures."""

    __tablename__ = "reconcile_sweep_ticks"

    id: Mapped[int] = mapped_column(BIGID, Identity(), primary_key=True)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    elapsed_ms: Mapped[int] = mapped_column(Integer)
    scanned: Mapped[int] = mapped_column(Integer)
    recovered: Mapped[int] = mapped_column(Integer)
    failed: Mapped[int] = mapped_column(Integer)
    still_running: Mapped[int] = mapped_column(Integer)
    errors: Mapped[int] = mapped_column(Integer)
    fanned_out: Mapped[int] = mapped_column(Integer)
    observed: Mapped[int] = mapped_column(Integer)
    late_completions: Mapped[int] = mapped_column(Integer)
    # {"<row> <action> <outcome>": count} of the rows it acted on
    decisions: Mapped[Any | None] = mapped_column(JSONType)


class OperatorAction(Base):
    """The operator record: one row per action a person took on a job by hand
    (:mod:`reconcile.operator`), with who, through which surface, and why. Customers never read
    it."""

    __tablename__ = "reconcile_operator_actions"

    id: Mapped[int] = mapped_column(BIGID, Identity(), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    operator: Mapped[str] = mapped_column(Text)
    via: Mapped[str] = mapped_column(Text)
    action: Mapped[str] = mapped_column(Text)
    job_id: Mapped[uuid.UUID | None] = mapped_column(Uuid, index=True)
    user_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    reason: Mapped[str] = mapped_column(Text)
    detail: Mapped[Any | None] = mapped_column(JSONType)


__all__ = [
    "Asset", "Base", "CreatedObject", "CreditAnomaly", "CreditBalance", "CreditLot",
    "CreditTransaction", "Job", "JobEvent", "OperatorAction", "ReconcileMeta", "SweepTick", "UsageLog",
    "WebhookDelivery", "WorkflowExecution", "table_of",
]


class IdempotencyKey(Base):
    """A submit's ``Idempotency-Key`` (unique per user): the job it created and the answer it
    got, so a retried request replays that answer instead of creating a second job. Kept
    :data:`reconcile.idempotency.RETENTION`; the sweep purges older rows."""

    __tablename__ = "reconcile_idempotency_keys"

    user_id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True)
    key: Mapped[str] = mapped_column(Text, primary_key=True)
    fingerprint: Mapped[str] = mapped_column(Text)  # sha256 of the canonical request
    job_id: Mapped[uuid.UUID] = mapped_column(Uuid)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    response_status: Mapped[int | None] = mapped_column(Integer)
    response_body: Mapped[Any | None] = mapped_column(JSONType)


class WorkerHeartbeat(Base):
    """One live worker process (``reconcile.worker.heartbeat``): renewed every
    ``HEARTBEAT_INTERVAL`` seconds; past ``expires_at`` the process counts as dead and the claims
    it holds (``jobs.claimed_by``) end at once (``reconcile.sweep.liveness``)."""

    __tablename__ = "reconcile_workers"

    worker_id: Mapped[str] = mapped_column(Text, primary_key=True)
    hostname: Mapped[str] = mapped_column(Text)
    pid: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime)
    beat_at: Mapped[datetime] = mapped_column(UTCDateTime)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)
