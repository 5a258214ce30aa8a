"""The ``job_events`` outbox: written with the state change, published after commit.

Publishing is at least once: a row is marked published only after every publisher took it, and
the sweep republishes rows left unpublished for more than 30 s. Consumers dedupe on
``event_id``. Publishers: the runtime's in-process hooks and, when
``RECONCILE_EVENTS_REDIS_URL`` is set, Redis pub/sub on ``reconcile:job:{job_id}`` and
``reconcile:user:{user_id}``.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from .db.models import Job, JobEvent

if TYPE_CHECKING:
    from .runtime import Runtime

log = logging.getLogger("reconcile.events")


def add_event(session: Session, job: Job, type_: str, now: datetime,
              payload: dict[str, Any] | None = None) -> JobEvent:
    """Queue one event in the caller's transaction."""
    event = JobEvent(event_id=str(uuid.uuid4()), job_id=job.id, user_id=job.user_id, type=type_,
                     payload=payload or {}, created_at=now)
    session.add(event)
    return event


def as_message(event: JobEvent) -> dict[str, Any]:
    return {"event_id": event.event_id, "job_id": str(event.job_id), "type": event.type,
            "payload": event.payload or {}, "created_at": event.created_at.isoformat()}


@lru_cache(maxsize=4)
def _redis(url: str) -> Any:
    import redis

    return redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)


def publish(rt: Runtime, *, job_id: uuid.UUID | None = None,
            older_than: timedelta | None = None, limit: int = 500) -> int:
    """Publish unpublished events (of one job, or all older than ``older_than``); returns count."""
    now = rt.now()
    with rt.sessions() as session:
        stmt = select(JobEvent).where(JobEvent.published_at.is_(None)).order_by(JobEvent.id).limit(limit)
        if job_id is not None:
            stmt = stmt.where(JobEvent.job_id == job_id)
        if older_than is not None:
            stmt = stmt.where(JobEvent.created_at < now - older_than)
        events = list(session.execute(stmt).scalars())
    published = 0
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
        with rt.sessions.begin() as session:
            session.execute(update(JobEvent).where(JobEvent.id == event.id)
                            .values(published_at=rt.now()))
        published += 1
    return published


def follow_job(rt: Runtime, user_id: uuid.UUID, job_id: uuid.UUID, *, interval: float = 1.0,
               timeout: float | None = None, sleep: Any = None) -> Iterator[dict[str, Any]]:
    """Yield a job's events in order (for an SSE endpoint) until the job is terminal.

    Reads the outbox, so it works on every database and needs no broker; another user's job
    yields nothing.
    """
    import time

    from .states import TERMINAL

    sleep = sleep or time.sleep
    last_id = 0
    waited = 0.0
    while True:
        with rt.sessions() as session:
            job = session.get(Job, job_id)
            if job is None or job.user_id != user_id:
                return
            events = list(session.execute(
                select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.id > last_id)
                .order_by(JobEvent.id)).scalars())
            terminal = job.status in TERMINAL
        for event in events:
            last_id = event.id
            yield as_message(event)
        if terminal or (timeout is not None and waited >= timeout):
            return
        sleep(interval)
        waited += interval
