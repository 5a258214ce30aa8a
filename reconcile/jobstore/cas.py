"""Internal: the compare-and-set every guarded write of ``jobs`` goes through, and the row load."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from functools import cache
from typing import Any

from sqlalchemy import Connection, Row, bindparam, insert, select, update
from sqlalchemy.orm import Session

from ..db.models import Job, JobEvent, table_of
from ..db.session import rowcount


def load(session: Session, job_id: uuid.UUID, *, lock: bool = False) -> Job | None:
    stmt = select(Job).where(Job.id == job_id)
    if lock:
        stmt = stmt.with_for_update()
    return session.execute(stmt).scalar_one_or_none()


def _cas(session: Session, *where: Any, **values: Any) -> Job | None:
    """UPDATE jobs SET values WHERE where RETURNING the row (None: lost)."""
    return _written_row(session, _returning(where, values), {})


def _written_row(session: Session, statement: Any, params: Mapping[str, Any]) -> Job | None:
    # populate_existing: the returned object carries the values just written, even when the
    # session had loaded the row before the UPDATE
    return session.execute(
        statement, dict(params),
        execution_options={"synchronize_session": False, "populate_existing": True}
    ).scalar_one_or_none()


# a prepared CAS's shape: () -> (where, values), written with bind parameters
Shape = Callable[[], tuple[tuple[Any, ...], dict[str, Any]]]
Build = Callable[[tuple[Any, ...], Mapping[str, Any]], Any]
_PREPARED: dict[tuple[Build, Shape], Any] = {}


def _prepared(build: Build, shape: Shape) -> Any:
    """``build(*shape())``, built once per (build, shape): a hot path's CAS, whose building and
    cache-keying cost more CPU than running it, is bound per call instead."""
    statement = _PREPARED.get((build, shape))
    if statement is None:
        statement = _PREPARED.setdefault((build, shape), build(*shape()))
    return statement


def _returning(where: tuple[Any, ...], values: Mapping[str, Any]) -> Any:
    return update(Job).where(*where).values(**values).returning(Job)


@cache  # one build per column set: _PREPARED keys on the build
def _returning_columns(columns: tuple[str, ...]) -> Build:
    """The build of a CAS that returns only ``columns`` of the row, as a Core row (no ORM).

    A hot path's caller that reads a few columns pays for neither the ORM's row loading nor
    the driver's description of all the row's columns (psycopg builds one object per column
    per statement), and its statement stays short: psycopg caches the parsing of a statement
    only up to 4,096 bytes, which a CAS with the event and every column passed."""
    def build(where: tuple[Any, ...], values: Mapping[str, Any]) -> Any:
        jobs = table_of(Job)
        return update(jobs).where(*where).values(**values).returning(
            *(jobs.c[name] for name in columns))
    return build


def _cas_columns(session: Session, shape: Shape, params: Mapping[str, Any],
                 columns: tuple[str, ...]) -> Row[Any] | None:
    """:func:`_cas_prepared` returning only ``columns`` of the row it wrote (a Core row whose
    attributes are those columns; None: lost). The session's objects are not refreshed: for a
    caller that holds none of the row's. It runs on the session's connection: through the
    session, an update whose conditions name the mapped class takes the ORM's bulk-update path
    (its pre- and post-execution steps), though it returns no object. So the session is not
    flushed first: changes the session holds unflushed (a row added, a column set) are not seen
    by the CAS (flush them before, as the create step's fresh sessions need not)."""
    return session.connection().execute(_prepared(_returning_columns(columns), shape),
                                        dict(params)).first()


def _plain(where: tuple[Any, ...], values: Mapping[str, Any]) -> Any:
    return update(Job).where(*where).values(**values)


def _cas_prepared(session: Session, shape: Shape, params: Mapping[str, Any]) -> Job | None:
    """:func:`_cas` with its ``where`` and ``values`` from ``shape()``, written with bind
    parameters (typed as their columns: :func:`bound`) and bound from ``params``."""
    return _written_row(session, _prepared(_returning, shape), params)


def _update_prepared(session: Session, shape: Shape, params: Mapping[str, Any]) -> int:
    """As :func:`_cas_prepared`, returning no row: the rows it wrote."""
    return rowcount(session.execute(_prepared(_plain, shape), dict(params),
                                    execution_options={"synchronize_session": False}))


def bound(name: str, column: str) -> Any:
    """A bind parameter typed as ``jobs.<column>`` (a prepared CAS's value)."""
    return bindparam(name, type_=table_of(Job).c[column].type)


def _cas_with_event_prepared(session: Session, event: JobEvent, shape: Shape,
                             params: Mapping[str, Any]) -> Job | None:
    """:func:`_cas_prepared`, and when it wins the outbox ``event`` (built by
    ``events.new_event``, not in any session) for the row it wrote: on PostgreSQL one
    statement (the event's ``INSERT … SELECT`` from the ``UPDATE … RETURNING``), elsewhere the
    CAS then the ORM's row. The event's ``job_id``, ``user_id`` and ``id`` are set from what
    was written."""
    if session.get_bind().dialect.name != "postgresql":
        row = _cas_prepared(session, shape, params)
        if row is not None:
            _add_event(session, event, row)
        return row
    return _run_with_event(session, event, _prepared(_with_event, shape), params)


def _cas_columns_with_event(session: Session, event: JobEvent, shape: Shape,
                            params: Mapping[str, Any],
                            columns: tuple[str, ...]) -> Row[Any] | None:
    """:func:`_cas_with_event_prepared` returning only ``columns`` of the row (as
    :func:`_cas_columns`); ``id`` and ``user_id`` are among them whatever ``columns`` says."""
    columns = tuple(dict.fromkeys(("id", "user_id", *columns)))
    if session.get_bind().dialect.name != "postgresql":
        row = _cas_columns(session, shape, params, columns)
        if row is not None:
            _add_event(session, event, row)
        return row
    found: Row[Any] | None = _execute_with_event(
        session.connection(), _prepared(_with_event_columns(columns), shape), params, event, {})
    if found is None:
        return None
    event.id = found.event_row_id
    _event_of(event, found)
    return found


def _event_of(event: JobEvent, row: Any) -> None:
    event.job_id, event.user_id = row.id, row.user_id


def _add_event(session: Session, event: JobEvent, row: Any) -> None:
    """The event of a CAS that won, outside PostgreSQL: the ORM's row, for the row written."""
    _event_of(event, row)
    session.add(event)


def _with_event(where: tuple[Any, ...], values: Mapping[str, Any]) -> Any:
    """The one statement of :func:`_cas_with_event_prepared` on PostgreSQL: the CAS, the
    event from its row."""
    jobs = table_of(Job)
    saved = update(jobs).where(*where).values(**values).returning(*jobs.c).cte("saved")
    event_id, written = _event_from(saved)
    main = select(*[c.label(c.name) for c in saved.c], event_id).add_cte(written)
    return select(Job, event_id).from_statement(main)


@cache  # one build per column set: _PREPARED keys on the build
def _with_event_columns(columns: tuple[str, ...]) -> Build:
    """:func:`_with_event` returning only ``columns`` of the row (a Core row)."""
    def build(where: tuple[Any, ...], values: Mapping[str, Any]) -> Any:
        jobs = table_of(Job)
        saved = update(jobs).where(*where).values(**values).returning(
            *(jobs.c[name] for name in columns)).cte("saved")
        event_id, written = _event_from(saved)
        return select(*[saved.c[name] for name in columns], event_id).add_cte(written)
    return build


def _event_from(saved: Any) -> tuple[Any, Any]:
    """:func:`event_insert` from a CAS's ``saved`` CTE, as the CTE ``written``, and the
    inserted event's id as a labelled scalar subquery."""
    written = event_insert(saved).cte("written")
    return select(written.c.id).scalar_subquery().label("event_row_id"), written


def event_insert(row: Any) -> Any:
    """The outbox event's ``INSERT … SELECT … RETURNING id`` for the job of ``row`` (a CTE with
    the job's ``id`` and ``user_id``: a CAS's or an insert's ``RETURNING``); the event's own
    values are the bind parameters ``e_*``."""
    events = table_of(JobEvent)
    chosen = select(bindparam("e_event_id", type_=events.c.event_id.type), row.c.id,
                    row.c.user_id, bindparam("e_type", type_=events.c.type.type),
                    bindparam("e_payload", type_=events.c.payload.type),
                    bindparam("e_created_at", type_=events.c.created_at.type),
                    bindparam("e_published_at", type_=events.c.published_at.type))
    return insert(events).from_select(
        ["event_id", "job_id", "user_id", "type", "payload", "created_at", "published_at"],
        chosen).returning(events.c.id)


def _run_with_event(session: Session, event: JobEvent, statement: Any,
                    params: Mapping[str, Any]) -> Job | None:
    """Run :func:`_with_event`'s statement: the row written, mapped (None: the CAS lost)."""
    found = _execute_with_event(session, statement, params, event,
                                {"synchronize_session": False, "populate_existing": True})
    if found is None:
        return None
    row, event.id = found[0], found[1]
    _event_of(event, row)
    return row  # type: ignore[no-any-return]


def _execute_with_event(on: Session | Connection, statement: Any, params: Mapping[str, Any],
                        event: JobEvent, options: Mapping[str, Any]) -> Any:
    """Run a CAS-with-event statement ``on`` a session or its connection; its first row (None:
    the CAS lost)."""
    return on.execute(
        statement,
        {**params, "e_event_id": event.event_id, "e_type": event.type,
         "e_payload": event.payload, "e_created_at": event.created_at,
         "e_published_at": event.published_at},
        execution_options=options).first()
