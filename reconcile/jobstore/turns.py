"""Internal: the poll turn — the fence of one poll run, with its lease by kind and age.

The turn's ``UPDATE … RETURNING`` for a set of lease steps is built once (:func:`_turn_by_kind`);
each poll only binds its values. It also stores the provider's status the chain's previous
read saw (carried by the poll message): the chain's status write costs no statement of its own.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any

from sqlalchemy import Text, and_, bindparam, case, func, select, update
from sqlalchemy.orm import Session

from ..db.models import Job, table_of
from ..states import IN_FLIGHT
from .cas import _cas
from .predicates import stored_status

# kind name → [(age, lease)]: the first step whose age the job has reached wins; an age of None
# always matches (the kind's base interval, last). The lease is a duration: the turn writes
# ``now + lease``.
LeaseSteps = Mapping[str, Sequence[tuple[timedelta | None, timedelta]]]


def take_poll_turn(session: Session, job_id: uuid.UUID, generation: int, seq: int,
                   lease_until: datetime | LeaseSteps, *, now: datetime | None = None,
                   worker: str | None = None, status: object = None) -> Job | None:
    """Fence a poll run: move ``poll_seq`` from ``seq`` to ``seq + 1`` for this generation.

    A duplicate run, a stale chain or a terminal job loses and must not call the provider.
    ``lease_until`` is a time, or (with ``now``) the lease by kind and age: then the turn is
    also the step's load (one ``UPDATE … RETURNING``), and a row of a kind not named loses.
    That statement is built once per distinct set of steps (:func:`_turn_by_kind`); each poll
    only binds its values. ``worker``: the live worker process taking the turn (its heartbeat's
    id, recorded as the row's ``claimed_by``; None: no heartbeat, the lease alone ends it).
    ``status``: the provider's status the chain's previous read saw, stored as
    ``provider_status`` (bounded: :func:`~.predicates.stored_status`); None keeps the row's.
    """
    stored = stored_status(status)
    if not isinstance(lease_until, Mapping):
        keep = {} if stored is None else {"provider_status": stored}
        return _cas(
            session,
            Job.id == job_id,
            Job.status.in_(IN_FLIGHT),
            Job.provider_task_id.is_not(None),
            Job.poll_generation == generation,
            Job.poll_seq == seq,
            poll_seq=seq + 1,
            poll_lease_expires_at=lease_until,
            claimed_by=worker,
            **keep,
        )
    if now is None:
        raise ValueError("a lease by kind needs now")
    turn = _turn_by_kind(tuple((name, tuple(steps)) for name, steps in lease_until.items()))
    params: dict[str, Any] = {"turn_job": job_id, "turn_generation": generation,
                              "turn_seq": seq, "turn_next": seq + 1, "turn_now": now,
                              "turn_worker": worker, "turn_status": stored}
    for name, delta in turn.offsets:
        params[name] = now + delta
    return session.execute(
        turn.statement, params, execution_options={"populate_existing": True},
    ).scalar_one_or_none()


@dataclass(frozen=True)
class _Turn:
    statement: Any
    offsets: tuple[tuple[str, timedelta], ...]  # bind name → its value's offset from now


@lru_cache(maxsize=16)
def _turn_by_kind(steps: tuple[tuple[str, tuple[tuple[timedelta | None, timedelta], ...]], ...]
                  ) -> _Turn:
    """The poll turn's ``UPDATE … RETURNING`` for these lease steps, built once: the lease for
    the row's kind and age (``now − provider_call_started_at``, 0 when unset) is a ``CASE`` over
    the kinds (kinds with the same steps share their branches) whose times are bound per poll as
    ``now ± a fixed offset``. Building and compiling it per poll cost more CPU than the rest of
    the turn (issue 16)."""
    offsets: dict[timedelta, str] = {}

    def at(delta: timedelta) -> Any:
        if delta not in offsets:
            offsets[delta] = f"turn_at_{len(offsets)}"
        return bindparam(offsets[delta], type_=Job.poll_lease_expires_at.type)

    now = bindparam("turn_now", type_=Job.poll_lease_expires_at.type)
    groups: dict[tuple[tuple[timedelta | None, timedelta], ...], list[str]] = {}
    for name, kind_steps in steps:
        groups.setdefault(kind_steps, []).append(name)
    started = func.coalesce(Job.provider_call_started_at, now)
    whens: list[Any] = []
    for kind_steps, names in groups.items():
        of_kind = Job.provider_kind.in_(names)
        for age, lease in kind_steps:
            whens.append((of_kind if age is None else and_(of_kind, started <= at(-age)),
                          at(lease)))
    lease_sql: Any = case(*whens, else_=Job.poll_lease_expires_at) if whens \
        else Job.poll_lease_expires_at
    table = table_of(Job)
    core = (
        update(table)
        .where(
            Job.id == bindparam("turn_job"),
            Job.status.in_(IN_FLIGHT),
            Job.provider_task_id.is_not(None),
            Job.poll_generation == bindparam("turn_generation"),
            Job.poll_seq == bindparam("turn_seq"),
            Job.provider_kind.in_([name for name, _ in steps]),
        )
        .values({table.c.poll_seq: bindparam("turn_next"),
                 table.c.poll_lease_expires_at: lease_sql,
                 table.c.claimed_by: bindparam("turn_worker", type_=Job.claimed_by.type),
                 # the previous read's status, or (NULL: none carried) the row's own
                 table.c.provider_status: func.coalesce(bindparam("turn_status", type_=Text()),
                                                        table.c.provider_status)})
        .returning(*table.c)
    )
    # a Core UPDATE … RETURNING mapped onto Job: the same one statement and the same row object
    # as an ORM-enabled update(Job), without the ORM bulk-update bookkeeping run per execution
    # (about a fifth of the turn's CPU, measured in bench.poll_modes' chain mode)
    statement = select(Job).from_statement(core)
    return _Turn(statement, tuple((name, delta) for delta, name in offsets.items()))
