"""Internal: the library's own mechanics, not an import path for platforms (may move).

Retention for the tables that grow with history: ``job_events`` and ``webhook_deliveries``.

``reconcile prune`` (and the beat's ``reconcile.prune`` entry when a retention is set) deletes,
in small batches (oldest ids first, so each batch stops early instead of scanning history):

* job events older than ``JOB_EVENTS_RETENTION_DAYS`` that were **published** — an unpublished
  event is the outbox's promise and is never removed;
* webhook deliveries older than ``WEBHOOK_DELIVERIES_RETENTION_DAYS`` whose job is **not in
  flight** — a delivery naming a pending/processing job (an uncertain submission's evidence, or
  a running job's dedupe record) is kept however old it is.

A retention below :data:`MIN_RETENTION` is refused: deliveries also dedupe replays, and a
replay older than a day fails the providers' timestamp checks anyway.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Select, and_, delete, exists, func, select
from sqlalchemy.orm import Session, sessionmaker

from ..db.models import Job, JobEvent, WebhookDelivery
from ..settings import MIN_RETENTION
from ..settlement import CANCEL_REQUESTED_EVENT
from ..states import IN_FLIGHT

log = logging.getLogger("reconcile.retention")

BATCH = 1000


@dataclass(frozen=True)
class PruneReport:
    events: int
    deliveries: int
    dry_run: bool

    def line(self) -> str:
        verb = "would delete" if self.dry_run else "deleted"
        return f"[reconcile] prune {verb} job_events={self.events} webhook_deliveries={self.deliveries}"


def _check(retention: timedelta | None) -> None:
    if retention is not None and retention < MIN_RETENTION:
        raise ValueError(f"a retention below {MIN_RETENTION} is refused (got {retention})")


def _events(cutoff: datetime):  # type: ignore[no-untyped-def]
    # a user's cancel request stays while its job is unsettled: its settlement reads it
    # (reconcile.settlement.settlement_cause: the job settles as the user's cancel)
    unsettled = exists().where(Job.id == JobEvent.job_id, Job.credits_actual.is_(None))
    return select(JobEvent.id).where(JobEvent.published_at.is_not(None),
                                     JobEvent.created_at < cutoff,
                                     ~and_(JobEvent.type == CANCEL_REQUESTED_EVENT, unsettled))


def _deliveries(cutoff: datetime) -> Select[int]:
    live = exists().where(Job.id == WebhookDelivery.job_id, Job.status.in_(IN_FLIGHT))
    return select(WebhookDelivery.id).where(WebhookDelivery.received_at < cutoff, ~live)


def _drain(sessions: sessionmaker[Session], model: type[JobEvent] | type[WebhookDelivery],
           ids: Select[int], dry_run: bool) -> int:
    if dry_run:
        with sessions() as session:
            return int(session.execute(select(func.count()).select_from(ids.subquery())).scalar_one())
    total = 0
    while True:
        with sessions.begin() as session:
            batch = list(session.execute(ids.order_by(model.id).limit(BATCH)).scalars())
            if batch:
                session.execute(delete(model).where(model.id.in_(batch)))
        total += len(batch)
        if len(batch) < BATCH:
            return total


def prune(sessions: sessionmaker[Session], *, now: datetime, events: timedelta | None,
          deliveries: timedelta | None, dry_run: bool = False) -> PruneReport:
    """Delete what is past its retention (None: keep that table whole)."""
    _check(events)
    _check(deliveries)
    n_events = (_drain(sessions, JobEvent, _events(_cutoff(now, events)), dry_run)
                if events else 0)
    n_deliveries = (_drain(sessions, WebhookDelivery, _deliveries(_cutoff(now, deliveries)),
                           dry_run) if deliveries else 0)
    report = PruneReport(n_events, n_deliveries, dry_run)
    log.info(report.line())
    return report


def _cutoff(now: datetime, retention: timedelta) -> datetime:
    """``now - retention``; a retention reaching past the calendar's start keeps everything."""
    try:
        return now - retention
    except OverflowError:
        return datetime.min.replace(tzinfo=now.tzinfo)


def days(value: float | None) -> timedelta | None:
    """A retention given in days (a setting, or the ``prune`` command's option), as a duration;
    :class:`ValueError` for a number that is no duration (NaN, infinite, too large)."""
    if value is None:
        return None
    if not math.isfinite(value):
        raise ValueError(f"a retention of {value} days is no duration")
    try:
        return timedelta(days=value)
    except OverflowError:
        raise ValueError(f"a retention of {value} days is longer than a duration can be") from None
