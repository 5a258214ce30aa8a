"""Internal: the compare-and-set every guarded write of ``jobs`` goes through, and the row load."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import bindparam, insert, select, update
from sqlalchemy.orm import Session

from ..db.models import Job, JobEvent, table_of


def load(session: Session, job_id: uuid.UUID, *, lock: bool = False) -> Job | None:
    stmt = select(Job).where(Job.id == job_id)
    if lock:
        stmt = stmt.with_for_update()
    return session.execute(stmt).scalar_one_or_none()


def _cas(session: Session, *where: Any, **values: Any) -> Job | None:
    """UPDATE jobs SET values WHERE where RETURNING the row (None: lost)."""
    stmt = update(Job).where(*where).values(**values).returning(Job)
    # populate_existing: the returned object carries the values just written, even when the
    # session had loaded the row before the UPDATE
    row = session.execute(
        stmt, execution_options={"synchronize_session": False, "populate_existing": True}
    ).scalar_one_or_none()
    return row


def _cas_with_event(session: Session, event: JobEvent, *where: Any, **values: Any) -> Job | None:
    """:func:`_cas`, and when it wins the outbox ``event`` (built by ``events.new_event``, not
    in any session) for the row it wrote: on PostgreSQL one statement (the event's
    ``INSERT … SELECT`` from the ``UPDATE … RETURNING``), elsewhere the CAS then the ORM's row.
    The event's ``job_id``, ``user_id`` and ``id`` are set from what was written."""
    if session.get_bind().dialect.name != "postgresql":
        row = _cas(session, *where, **values)
        if row is not None:
            event.job_id, event.user_id = row.id, row.user_id
            session.add(event)
        return row
    jobs, events = table_of(Job), table_of(JobEvent)
    saved = update(jobs).where(*where).values(**values).returning(*jobs.c).cte("saved")
    chosen = select(bindparam("e_event_id", type_=events.c.event_id.type), saved.c.id,
                    saved.c.user_id, bindparam("e_type", type_=events.c.type.type),
                    bindparam("e_payload", type_=events.c.payload.type),
                    bindparam("e_created_at", type_=events.c.created_at.type),
                    bindparam("e_published_at", type_=events.c.published_at.type))
    written = insert(events).from_select(
        ["event_id", "job_id", "user_id", "type", "payload", "created_at", "published_at"],
        chosen).returning(events.c.id).cte("written")
    event_id = select(written.c.id).scalar_subquery().label("event_row_id")
    main = select(*[c.label(c.name) for c in saved.c], event_id).add_cte(written)
    found = session.execute(
        select(Job, event_id).from_statement(main),
        {"e_event_id": event.event_id, "e_type": event.type, "e_payload": event.payload,
         "e_created_at": event.created_at, "e_published_at": event.published_at},
        execution_options={"synchronize_session": False, "populate_existing": True}).first()
    if found is None:
        return None
    row, event.id = found[0], found[1]
    event.job_id, event.user_id = row.id, row.user_id
    return row  # type: ignore[no-any-return]
