"""Internal: worker liveness — the heartbeat rows (``reconcile_workers``) and the end of a dead
worker's claims.

A worker process registers a row and renews it every heartbeat interval; its claims carry its
id (``jobs.claimed_by``). A row past its ``expires_at`` is a dead process: whoever notices takes
the row (:func:`take_lapsed_workers`, one taker per row) and ends that process's claims now
(:func:`end_claims_of`) — the claim's lease is moved to now, nothing else is written. What
follows is what follows any expired lease: the sweep's decision table (``reconcile_job``) turns
an expired create claim into ``uncertain`` (``mark_uncertain``) and resumes an expired poll
chain (``start_new_chain``); an expired batch claim is simply due again and the next claimer
takes it (its ``poll_seq`` bump fences the dead one).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from ..db.models import Job, WorkerHeartbeat
from ..db.session import rowcount
from ..states import IN_FLIGHT, Status, Submission

# a lease moved to "now" ends just before it, so every comparison with the deciding tick's time
# (``<`` for a create claim, ``<=`` for a poll lease) sees it expired, even on a frozen clock
_ENDED = timedelta(microseconds=1)


def register_worker(session: Session, worker_id: str, hostname: str, pid: int, now: datetime,
                    timeout: timedelta) -> None:
    """A new live worker process (its first beat)."""
    session.add(WorkerHeartbeat(worker_id=worker_id, hostname=hostname, pid=pid, started_at=now,
                                beat_at=now, expires_at=now + timeout))


def renew_worker(session: Session, worker_id: str, now: datetime, timeout: timedelta) -> bool:
    """One beat: the row lives ``timeout`` longer. False: the row is gone — it lapsed and its
    claims were ended (the process must register again under a new id)."""
    result = session.execute(update(WorkerHeartbeat).where(WorkerHeartbeat.worker_id == worker_id)
                             .values(beat_at=now, expires_at=now + timeout))
    return rowcount(result) == 1


def remove_worker(session: Session, worker_id: str) -> None:
    """A worker process that stops cleanly (its claims, if any, end at their lease)."""
    session.execute(delete(WorkerHeartbeat).where(WorkerHeartbeat.worker_id == worker_id))


def take_lapsed_workers(session: Session, now: datetime, limit: int = 20) -> list[str]:
    """Delete up to ``limit`` rows past their ``expires_at`` and return their ids: the caller
    ends their claims in the same transaction (:func:`end_claims_of`). Rows another taker holds
    are skipped, so each dead worker is taken once."""
    lapsed = (select(WorkerHeartbeat.worker_id).where(WorkerHeartbeat.expires_at < now)
              .order_by(WorkerHeartbeat.expires_at).limit(limit))
    if session.get_bind().dialect.name == "postgresql":
        lapsed = lapsed.with_for_update(skip_locked=True)
    ids = list(session.execute(lapsed).scalars())
    if ids:
        session.execute(delete(WorkerHeartbeat).where(WorkerHeartbeat.worker_id.in_(ids),
                                                      WorkerHeartbeat.expires_at < now))
    return ids


def end_claims_of(session: Session, workers: Sequence[str], now: datetime
                  ) -> tuple[list[uuid.UUID], int]:
    """End now every live claim the dead ``workers`` hold, as if its lease ran out:

    * a create claim (``submitting``, no task id, its claim alive): ``claim_expires_at``;
    * a poll chain's lease (a turn, or the create's first poll lease; chain mode, alive):
      ``poll_lease_expires_at``;
    * a batch claim (``poll_due_at`` still equal to the claim's lease, in the future): both.

    Returns the ids of the first two kinds, rows the sweep's decision table must now decide
    (``reconcile_job``: uncertain, or a resumed chain), and how many batch claims were released
    (a batch row needs nobody: it is due).
    """
    if not workers:
        return [], 0
    ended = now - _ENDED
    mine = (Job.claimed_by.in_(list(workers)), Job.status.in_(IN_FLIGHT))
    creates = session.execute(
        update(Job).where(*mine, Job.status == Status.PENDING,
                          Job.submission_state == Submission.SUBMITTING,
                          Job.provider_task_id.is_(None), Job.claim_expires_at > now)
        .values(claim_expires_at=ended).returning(Job.id)).scalars().all()
    chains = session.execute(
        update(Job).where(*mine, Job.provider_task_id.is_not(None), Job.poll_due_at.is_(None),
                          Job.poll_lease_expires_at > now)
        .values(poll_lease_expires_at=ended).returning(Job.id)).scalars().all()
    released = rowcount(session.execute(update(Job).where(*live_batch_claims(workers, now))
                                        .values(poll_due_at=ended, poll_lease_expires_at=ended)))
    return [*creates, *chains], released


def live_batch_claims(workers: Sequence[str], now: datetime) -> tuple[Any, ...]:
    """A batch claim one of ``workers`` holds at ``now``: in flight with a task id, claimed by
    it, due again exactly when the claim's lease ends (a read written back moves
    ``poll_due_at`` off the lease), and that lease still running."""
    return (Job.claimed_by.in_(list(workers)), Job.status.in_(IN_FLIGHT),
            Job.provider_task_id.is_not(None), Job.poll_due_at.is_not(None),
            Job.poll_due_at > now, Job.poll_due_at == Job.poll_lease_expires_at)
