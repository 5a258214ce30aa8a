"""Internal: the terminal writes — failed, cancelled over a failure, completed, the final cost,
the settlement (claimed, settled, retried), an operator's re-charge — and the one writer of
``credit_anomalies`` (recorded open; closed by the operator action that answers them)."""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from functools import lru_cache
from typing import Any

from sqlalchemy import Connection, insert, select, text, update
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from ..core import redact
from ..db.models import Asset, CreditAnomaly, Job, JobEvent, table_of
from ..db.session import rowcount
from ..settlement import CANCEL_READ_CODE
from ..states import IN_FLIGHT, Status
from .cas import _cas


def claim_settlement(session: Session, job_id: uuid.UUID, cutoff: datetime,
                     retry_at: datetime) -> Job | None:
    """Move a due settlement's ``next_poll_at`` to ``retry_at`` (a short lease: if this process
    dies before settling, the retry is due again then). None: settled or claimed meanwhile."""
    return _cas(session, Job.id == job_id, Job.credits_actual.is_(None),
                Job.next_poll_at.is_not(None), Job.next_poll_at <= cutoff,
                next_poll_at=retry_at)


def record_recharge(session: Session, job_id: uuid.UUID, amount: int) -> bool:
    """An operator's re-charge of a job its settlement returned credits to: its final cost is
    ``amount`` (what the settlement kept plus the re-charge)."""
    result = session.execute(update(Job).where(Job.id == job_id)
                             .values(credits_actual=amount, display_cost=amount))
    return rowcount(result) == 1


def record_anomaly(session: Session | Connection, *, job_id: uuid.UUID | None,
                   user_id: uuid.UUID | None, kind: str, detail: Any, now: datetime,
                   once: bool = False) -> bool:
    """The one writer of ``credit_anomalies``. ``once``: only if the job has no anomaly of
    ``kind`` yet (one SELECT first; the caller holds what serialises it, usually the job's row
    lock). A Session adds the row (its flush writes it, as before); a Connection inserts it.
    False: ``once`` and the anomaly exists. Its detail is redacted (:func:`redact.value`)."""
    detail = redact.value(detail)
    if once:
        seen = session.execute(select(CreditAnomaly.id).where(
            CreditAnomaly.job_id == job_id, CreditAnomaly.kind == kind).limit(1)).first()
        if seen is not None:
            return False
    if isinstance(session, Session):
        session.add(CreditAnomaly(job_id=job_id, user_id=user_id, kind=kind, detail=detail,
                                  created_at=now))
    else:
        session.execute(insert(table_of(CreditAnomaly)).values(
            job_id=job_id, user_id=user_id, kind=kind, detail=detail, created_at=now))
    return True


def resolve_anomalies(session: Session | Connection, job_id: uuid.UUID, kinds: Any, *,
                      now: datetime, by: str, action: str) -> int:
    """Close the job's open anomalies of ``kinds`` (the operator action ``action`` answered
    them; ``by``: who, through which surface). Returns how many were closed; a closed anomaly
    is never reopened."""
    kinds = sorted(kinds)
    if not kinds:
        return 0
    table = table_of(CreditAnomaly)
    result = session.execute(
        update(table)
        .where(table.c.job_id == job_id, table.c.kind.in_(kinds), table.c.resolved_at.is_(None))
        .values(resolved_at=now, resolved_by=redact.text(by)[:200], resolved_action=action))
    return rowcount(result)


def mark_failed(session: Session, job_id: uuid.UUID, *, now: datetime, code: str, message: str,
                detail: dict[str, Any] | None, where: tuple[Any, ...] = (),
                submission_state: str | None = None, status: str = Status.FAILED) -> Job | None:
    """In flight → failed (or cancelled), with ``next_poll_at = now`` so the refund is settled
    even if this process dies before it."""
    values: dict[str, Any] = dict(
        status=status, error_code=code, error_message=redact.text(message),
        error_detail=redact.value(detail),
        next_poll_at=now, completed_at=now, claim_expires_at=None, poll_lease_expires_at=None,
        credits_actual=None,
    )
    if submission_state is not None:
        values["submission_state"] = submission_state
    return _cas(session, Job.id == job_id, Job.status.in_(IN_FLIGHT), *where, **values)


def cancelled_over_failure(session: Session, job_id: uuid.UUID, task_id: str, *, code: str,
                           message: str, detail: dict[str, Any] | None) -> Job | None:
    """failed → cancelled, for the user's cancel whose own upstream cancel a poll (or a webhook)
    read first: the task failed ``UPSTREAM_FAILED`` *because* we cancelled it. Money is not
    touched (the failure's settlement already read the cancel request and settled it as the
    user's cancel: ``settlement.CANCEL_READ_CODE``, the same code); only the status, the
    code and the detail say what happened. Guarded on the same upstream task and on that code,
    so a completion, an exhaustion or another task's failure is never rewritten."""
    return _cas(session, Job.id == job_id, Job.status == Status.FAILED,
                Job.error_code == CANCEL_READ_CODE, Job.provider_task_id == task_id,
                status=Status.CANCELLED, error_code=code, error_message=redact.text(message),
                error_detail=redact.value(detail))


def completion_cas(**values: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The completion's compare-and-set, its one home: the guard and every value it writes.
    Completion is allowed only from pending/processing (README, Design notes: Completion).
    Clearing the last error's text clears its code too. Used by :func:`mark_completed` and by
    the completion that is one statement (``reconcile.lifecycle.completion``)."""
    if "reconcile_last_error" in values and values["reconcile_last_error"] is None:
        values.setdefault("reconcile_last_error_code", None)
    return (Job.status.in_(IN_FLIGHT),), dict(status=Status.COMPLETED, next_poll_at=None,
                                               poll_lease_expires_at=None, claim_expires_at=None,
                                               **values)


def mark_completed(session: Session, job_id: uuid.UUID, **values: Any) -> Job | None:
    """In flight → completed (:func:`completion_cas`). None: lost."""
    where, written = completion_cas(**values)
    return _cas(session, Job.id == job_id, *where, **written)


def completion_inserts(job_id: Any, user_id: Any, *, source: Any = None, when: Any = None,
                       credits_actual: Any = None) -> tuple[Any, Any]:
    """A won completion's asset rows and outbox event, their one home: ``INSERT … SELECT``
    statements (to be CTEs of the caller's one statement) over ``source`` (None: no FROM) where
    ``when``. ``job_id``/``user_id``: the job's, as SQL expressions. ``credits_actual``: an
    expression merged into the event's payload (None: the payload says it already).

    Binds: ``c_asset_ids``, ``c_indexes``, ``c_keys``, ``c_types`` (one array element per asset:
    ``unnest``, a fixed text, nothing compiled per job), ``c_is_public``, ``c_watermarked``,
    ``c_now``, ``c_event_id``, ``c_type``, ``c_payload``, ``c_published_at`` (:func:`completion_binds`).
    The event's ``INSERT`` returns its id, for the publisher."""
    from sqlalchemy import ARRAY, Boolean, Integer, Text, bindparam, cast, func
    from sqlalchemy.dialects.postgresql import JSONB, UUID

    assets, events = table_of(Asset), table_of(JobEvent)
    rows = func.unnest(bindparam("c_asset_ids", type_=ARRAY(UUID(as_uuid=True))),
                       bindparam("c_indexes", type_=ARRAY(Integer())),
                       bindparam("c_keys", type_=ARRAY(Text())),
                       bindparam("c_types", type_=ARRAY(Text()))
                       ).table_valued("id", "idx", "skey", "mtype").render_derived(name="a")
    now = bindparam("c_now", type_=assets.c.created_at.type)
    chosen = select(rows.c.id, job_id, user_id, rows.c.idx, rows.c.skey, rows.c.mtype,
                    bindparam("c_is_public", type_=Boolean()),
                    bindparam("c_watermarked", type_=Boolean()), now)
    chosen = chosen.select_from(rows if source is None else source.join(rows, text("true")))
    if when is not None:
        chosen = chosen.where(when)
    asset_rows = assets.insert().from_select(
        ["id", "job_id", "user_id", "index", "storage_key", "media_type", "is_public",
         "watermarked", "created_at"], chosen)
    payload: Any = cast(bindparam("c_payload", type_=Text()), JSONB())
    if credits_actual is not None:
        payload = payload.op("||")(func.jsonb_build_object("credits_actual", credits_actual))
    event = select(bindparam("c_event_id", type_=Text()), job_id, user_id,
                   bindparam("c_type", type_=Text()), payload, now,
                   bindparam("c_published_at", type_=events.c.published_at.type))
    if source is not None:
        event = event.select_from(source)
    if when is not None:
        event = event.where(when)
    event_row = events.insert().from_select(
        ["event_id", "job_id", "user_id", "type", "payload", "created_at", "published_at"],
        event).returning(events.c.id)
    return asset_rows, event_row


def completion_binds(assets: list[tuple[int, str, str | None]], *, is_public: bool,
                     watermarked: bool, event: JobEvent, now: datetime) -> dict[str, Any]:
    """:func:`completion_inserts`' binds for these assets ``(index, key, media type)`` and this
    event (built by ``events.new_event``)."""
    return {"c_is_public": is_public, "c_watermarked": watermarked, "c_now": now,
            "c_asset_ids": [uuid.uuid4() for _ in assets], "c_indexes": [a[0] for a in assets],
            "c_keys": [a[1] for a in assets], "c_types": [a[2] for a in assets],
            "c_event_id": event.event_id, "c_type": event.type,
            "c_payload": json.dumps(event.payload), "c_published_at": event.published_at}


@lru_cache(maxsize=1)
def _completion_rows() -> Any:
    """A won completion's other rows in ONE statement (PostgreSQL), after its CAS and its
    ledger commit: the final cost when it was not known at the CAS, then
    :func:`completion_inserts`."""
    from sqlalchemy import BigInteger, Boolean, bindparam

    jobs = table_of(Job)
    job_id = bindparam("c_job_id", type_=jobs.c.id.type)
    cost_value = bindparam("c_cost", type_=BigInteger())
    cost = (update(jobs)
            .where(jobs.c.id == job_id, jobs.c.status == Status.COMPLETED.value,
                   bindparam("c_set_cost", type_=Boolean()))
            .values(credits_actual=cost_value, display_cost=cost_value).cte("cost"))
    asset_rows, event_row = completion_inserts(
        job_id, bindparam("c_user_id", type_=jobs.c.user_id.type))
    return event_row.add_cte(cost, asset_rows.cte("assets"))


def write_completion(session: Session, job: Job, *, cost: int | None,
                     assets: list[tuple[int, str, str | None]], is_public: bool,
                     watermarked: bool, event: JobEvent, now: datetime) -> JobEvent:
    """A won completion's other rows, after its CAS and its ledger commit, in the same
    transaction: the final cost (``cost``; None: the CAS wrote it already), the assets
    ``(index, storage key, media type)`` and the ``event`` (built by ``events.new_event``, not in
    any session; its id is set here). One statement on PostgreSQL; the ORM's rows elsewhere. A
    second completion's assets break ``uq_reconcile_assets_job_id_index`` (IntegrityError), as
    the ORM's flush would."""
    if session.get_bind().dialect.name != "postgresql":
        if cost is not None:
            record_cost(session, job.id, cost)
        for index, key, media_type in assets:
            session.add(Asset(id=uuid.uuid4(), job_id=job.id, user_id=job.user_id, index=index,
                              storage_key=key, media_type=media_type, is_public=is_public,
                              watermarked=watermarked, created_at=now))
        session.add(event)
        return event
    event.id = session.execute(_completion_rows(), {
        "c_cost": cost, "c_set_cost": cost is not None, "c_job_id": job.id,
        "c_user_id": job.user_id, **completion_binds(assets, is_public=is_public,
                                                     watermarked=watermarked, event=event,
                                                     now=now),
    }).scalar_one()
    if cost is not None:  # the caller's row object says what was written (no flush: committed)
        set_committed_value(job, "credits_actual", cost)
        set_committed_value(job, "display_cost", cost)
    return event


def record_cost(session: Session, job_id: uuid.UUID, credits_actual: int) -> bool:
    """A completed job's final cost, when it was not known at the completion CAS."""
    return _cas(session, Job.id == job_id, Job.status == Status.COMPLETED,
                credits_actual=credits_actual, display_cost=credits_actual) is not None


def settled(session: Session, job_id: uuid.UUID, credits_actual: int) -> bool:
    return _cas(session, Job.id == job_id, Job.credits_actual.is_(None),
                credits_actual=credits_actual, next_poll_at=None) is not None


def settle_failed(session: Session, job_id: uuid.UUID, retry_at: datetime) -> bool:
    """A settlement attempt failed: retry at ``retry_at``, one more attempt counted. False: the
    job is settled already (or gone)."""
    result = session.execute(update(Job).where(Job.id == job_id, Job.credits_actual.is_(None))
                             .values(next_poll_at=retry_at, settle_attempts=Job.settle_attempts + 1))
    return rowcount(result) == 1
