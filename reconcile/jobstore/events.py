"""Internal: the library's own mechanics, not an import path for platforms (may move).

The ``job_events`` outbox: written with the state change, published after commit.

Publishing is at least once: a row is marked published only after its transaction committed
and every publisher took it, and the sweep republishes rows left unpublished for more than 30 s.
Consumers dedupe on ``event_id``. Publishers: the runtime's in-process hooks and, when
``RECONCILE_EVENTS_REDIS_URL`` is set, Redis pub/sub on ``reconcile:job:{job_id}`` and
``reconcile:user:{user_id}``.

With no publisher configured the row is still written (``follow_job`` and the SSE stream read
the outbox) but already marked published: there is nobody to hand it to, so nothing is queried
or updated after the commit. With a publisher, a step hands its own events over after its
commit (:func:`publish_events`) and marks them published in ONE UPDATE.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from ..db.models import Job, JobEvent

if TYPE_CHECKING:
    from ..core.runtime_view import RuntimeView

log = logging.getLogger("reconcile.events")


def has_publisher(rt: RuntimeView) -> bool:
    """Whether anything takes published events (in-process hooks or Redis pub/sub)."""
    return bool(rt.event_hooks) or bool(rt.settings.events_redis_url)


def add_event(session: Session, job: Job, type_: str, now: datetime,
              payload: dict[str, Any] | None = None, *, rt: RuntimeView | None = None) -> JobEvent:
    """Queue one event in the caller's transaction.

    With ``rt`` and no publisher configured, the row is written already published (``now``);
    otherwise it is unpublished until :func:`publish_events` (after the commit) or the sweep's
    republish hands it over.
    """
    event = new_event(job, type_, now, payload, rt=rt)
    session.add(event)
    return event


def new_event(job: Job, type_: str, now: datetime, payload: dict[str, Any] | None = None, *,
              rt: RuntimeView | None = None) -> JobEvent:
    """:func:`add_event`'s row, not added to any session (a caller that writes it with its own
    statement: ``jobstore.write_completion``)."""
    published_at = now if rt is not None and not has_publisher(rt) else None
    return JobEvent(event_id=str(uuid.uuid4()), job_id=job.id, user_id=job.user_id, type=type_,
                    payload=payload or {}, created_at=now, published_at=published_at)


def record_cancel_request(rt: RuntimeView, job_id: uuid.UUID) -> bool:
    """The user's cancel, recorded before the provider is asked to cancel: a
    ``cancel_requested`` event written only while the job is in flight, under its row lock, so
    a terminal state written after it (a poll, a webhook or the sweep reading the upstream
    ``canceled`` first) is settled as the user's cancel (:func:`cancel_requested`,
    :func:`reconcile.settlement.settlement_cause`). False: the job is no longer in flight."""
    from ..settlement import CANCEL_REQUESTED_EVENT
    from ..states import IN_FLIGHT

    now = rt.now()
    with rt.sessions.begin() as session:
        job = session.execute(select(Job).where(Job.id == job_id).with_for_update()).scalar_one_or_none()
        if job is None or job.status not in IN_FLIGHT:
            return False
        event = add_event(session, job, CANCEL_REQUESTED_EVENT, now, {}, rt=rt)
    publish_events(rt, [event])
    return True


def cancel_requested(session: Session, job_id: uuid.UUID) -> bool:
    """Whether the user asked to cancel the job while it was in flight (its
    ``cancel_requested`` event: :func:`record_cancel_request`)."""
    from ..settlement import CANCEL_REQUESTED_EVENT

    return session.execute(select(JobEvent.id).where(
        JobEvent.job_id == job_id, JobEvent.type == CANCEL_REQUESTED_EVENT).limit(1)).first() is not None


def as_message(event: JobEvent) -> dict[str, Any]:
    return {"event_id": event.event_id, "job_id": str(event.job_id), "type": event.type,
            "payload": event.payload or {}, "created_at": event.created_at.isoformat()}


@lru_cache(maxsize=4)
def _redis(url: str) -> Any:
    import redis

    return redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)


def publish_events(rt: RuntimeView, events: Sequence[JobEvent | None]) -> int:
    """After the commit that wrote ``events``: hand them to the publishers and mark the ones
    taken published in one UPDATE. Nothing at all (no query) without a publisher or when the
    events were written already published; returns how many were published."""
    pending = [e for e in events if e is not None and e.published_at is None]
    if not pending or not has_publisher(rt):
        return 0
    return _deliver(rt, pending)


def publish(rt: RuntimeView, *, job_id: uuid.UUID | None = None,
            older_than: timedelta | None = None, limit: int = 500) -> int:
    """Publish unpublished events (of one job, or all older than ``older_than``); returns count.

    Without a publisher this does nothing (no query): the rows stay unpublished until a
    publisher is configured (events written meanwhile are written published).
    """
    if not has_publisher(rt):
        return 0
    now = rt.now()
    with rt.sessions() as session:
        stmt = select(JobEvent).where(JobEvent.published_at.is_(None)).order_by(JobEvent.id).limit(limit)
        if job_id is not None:
            stmt = stmt.where(JobEvent.job_id == job_id)
        if older_than is not None:
            stmt = stmt.where(JobEvent.created_at < now - older_than)
        events = list(session.execute(stmt).scalars())
    return _deliver(rt, events) if events else 0


def _deliver(rt: RuntimeView, events: Sequence[JobEvent]) -> int:
    """Every publisher takes each event (in order); the taken ones are marked in ONE UPDATE."""
    taken: list[int] = []
    for event in events:
        message = as_message(event)
        try:
            for hook in rt.event_hooks:
                hook(message)
            if rt.settings.events_redis_url:
                client = _redis(rt.settings.events_redis_url)
                data = json.dumps(message)
                client.publish(f"reconcile:job:{event.job_id}", data)
                client.publish(f"reconcile:user:{event.user_id}", data)
        except Exception:  # a publisher down: leave it unpublished for the sweep
            log.warning("event_publish_failed event_id=%s job_id=%s", event.event_id, event.job_id,
                        exc_info=True)
            continue
        taken.append(event.id)
    if taken:
        with rt.sessions.begin() as session:
            session.execute(update(JobEvent)
                            .where(JobEvent.id.in_(taken), JobEvent.published_at.is_(None))
                            .values(published_at=rt.now()))
    return len(taken)


def read_since(rt: RuntimeView, user_id: uuid.UUID, job_id: uuid.UUID,
               after: int = 0) -> tuple[list[dict[str, Any]], int, bool]:
    """One short read of a job's event stream: its events after the cursor ``after`` (as
    messages, in order), the cursor to pass next, and whether the stream is over (the job is
    terminal, or it is not this user's job: nothing is shown). One home of what a follower
    sees; :func:`follow_job` loops over it, an async server awaits it in a thread between
    sleeps (the example gateway: it never holds a thread while it waits)."""
    from ..states import TERMINAL

    with rt.sessions() as session:
        job = session.get(Job, job_id)
        if job is None or job.user_id != user_id:
            return [], after, True
        rows = list(session.execute(
            select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.id > after)
            .order_by(JobEvent.id)).scalars())
        terminal = job.status in TERMINAL
    return [as_message(row) for row in rows], (rows[-1].id if rows else after), terminal


def follow_job(rt: RuntimeView, user_id: uuid.UUID, job_id: uuid.UUID, *, interval: float = 1.0,
               timeout: float | None = None, sleep: Any = None) -> Iterator[dict[str, Any]]:
    """Yield a job's events in order (for an SSE endpoint) until the job is terminal.

    Reads the outbox, so it works on every database and needs no broker; another user's job
    yields nothing. It sleeps between reads in the calling thread: a server streaming many
    followers should await :func:`read_since` instead (README, The gateway).
    """
    import time

    sleep = sleep or time.sleep
    cursor = 0
    waited = 0.0
    while True:
        messages, cursor, over = read_since(rt, user_id, job_id, cursor)
        yield from messages
        if over or (timeout is not None and waited >= timeout):
            return
        sleep(interval)
        waited += interval
