"""Internal: the poll turn — the fence of one poll run, with its lease by kind and age.

``take_poll_turn`` and ``_lease_by_kind`` moved here verbatim from the flat ``jobstore.py``
(issue 17), alone, so an edit of them ports as one file.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, case, func
from sqlalchemy.orm import Session

from ..db.models import Job
from ..states import IN_FLIGHT
from .cas import _cas

# kind name → [(age, lease until)]: the first step whose age the job has reached wins; an age
# of None always matches (the kind's base interval, last)
LeaseSteps = Mapping[str, Sequence[tuple[timedelta | None, datetime]]]


def take_poll_turn(session: Session, job_id: uuid.UUID, generation: int, seq: int,
                   lease_until: datetime | LeaseSteps, *, now: datetime | None = None) -> Job | None:
    """Fence a poll run: move ``poll_seq`` from ``seq`` to ``seq + 1`` for this generation.

    A duplicate run, a stale chain or a terminal job loses and must not call the provider.
    ``lease_until`` is a time, or (with ``now``) the lease by kind and age: then the turn is
    also the step's load (one ``UPDATE … RETURNING``), and a row of a kind not named loses.
    """
    where: list[Any] = []
    if isinstance(lease_until, Mapping):
        if now is None:
            raise ValueError("a lease by kind needs now")
        where.append(Job.provider_kind.in_(list(lease_until)))
        lease: Any = _lease_by_kind(lease_until, now)
    else:
        lease = lease_until
    return _cas(
        session,
        Job.id == job_id,
        Job.status.in_(IN_FLIGHT),
        Job.provider_task_id.is_not(None),
        Job.poll_generation == generation,
        Job.poll_seq == seq,
        *where,
        poll_seq=seq + 1,
        poll_lease_expires_at=lease,
    )


def _lease_by_kind(steps: LeaseSteps, now: datetime) -> Any:
    """SQL: the lease for the row's kind and age (``now − provider_call_started_at``, 0 when
    unset); kinds with the same steps share their branches."""
    groups: dict[tuple[tuple[timedelta | None, datetime], ...], list[str]] = {}
    for name, kind_steps in steps.items():
        groups.setdefault(tuple(kind_steps), []).append(name)
    started = func.coalesce(Job.provider_call_started_at, now)
    whens: list[Any] = []
    for kind_steps, names in groups.items():
        of_kind = Job.provider_kind.in_(names)
        for age, until in kind_steps:
            whens.append((of_kind if age is None else and_(of_kind, started <= now - age), until))
    if not whens:
        return Job.poll_lease_expires_at
    return case(*whens, else_=Job.poll_lease_expires_at)
