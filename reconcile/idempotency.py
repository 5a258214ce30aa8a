"""Internal: Idempotent submits: an optional ``Idempotency-Key`` per user (as Stripe's).

* the first submit with a key inserts ``(user_id, key)`` in the SAME transaction as the job and
  its reservation, before the reservation: a concurrent duplicate blocks on the primary key until
  the first commits, then sees its row — one job, one reservation;
* a retry with the same key and the same request (:func:`fingerprint`) gets the original
  answer: the recorded ``(status, body)``, or 202 with the original ``job_id`` if none was
  recorded yet;
* the same key with a different request is refused: 409 ``IDEMPOTENCY_KEY_REUSED``;
* a key is kept :data:`RETENTION` (24 h); after that it is forgotten (the sweep purges it) and
  the key may be used again for a new job.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from .core.limits import storable_text
from .db.models import IdempotencyKey
from .db.session import rowcount
from .errors import Conflict, ErrorCode, InvalidParam

__all__ = [
    "MAX_KEY_LENGTH", "RETENTION",
]

RETENTION = timedelta(hours=24)
MAX_KEY_LENGTH = 255
PURGE_BATCH = 1000


@dataclass(frozen=True)
class Replay:
    """The original submit this key belongs to."""

    job_id: uuid.UUID
    status: int | None
    body: Any | None


def check_key(key: str | None) -> str | None:
    if key is None:
        return None
    if not isinstance(key, str) or not key.strip() or len(key) > MAX_KEY_LENGTH:
        raise InvalidParam(f"idempotency key must be 1–{MAX_KEY_LENGTH} characters",
                           param="idempotency_key")
    if not storable_text(key):  # the key is a row's text: PostgreSQL cannot hold these
        raise InvalidParam("idempotency key holds a NUL or an unpaired surrogate",
                           param="idempotency_key")
    return key


def fingerprint(request: dict[str, Any]) -> str:
    """sha256 of the request's canonical JSON (sorted keys; UUIDs as text)."""
    text = json.dumps(request, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def claim(session: Session, user_id: uuid.UUID, key: str, digest: str, job_id: uuid.UUID,
          now: datetime) -> Replay | None:
    """Take ``key`` for ``job_id`` in the caller's transaction. None: taken (go on and insert
    the job); a :class:`Replay`: the key already names a job with the same request. Raises
    :class:`Conflict` (``IDEMPOTENCY_KEY_REUSED``) for a different request."""
    session.execute(delete(IdempotencyKey).where(
        IdempotencyKey.user_id == user_id, IdempotencyKey.key == key,
        IdempotencyKey.created_at < now - RETENTION))
    inserted = session.execute(
        _insert(session).values(user_id=user_id, key=key, fingerprint=digest, job_id=job_id,
                                created_at=now)
        .on_conflict_do_nothing(index_elements=["user_id", "key"])
        .returning(IdempotencyKey.job_id)).scalar_one_or_none()
    if inserted is not None:
        return None
    # READ COMMITTED: this statement sees the row the conflicting transaction committed
    row = session.execute(select(IdempotencyKey).where(
        IdempotencyKey.user_id == user_id, IdempotencyKey.key == key)).scalar_one()
    if row.fingerprint != digest:
        raise Conflict(ErrorCode.IDEMPOTENCY_KEY_REUSED,
                       "This idempotency key was used with a different request.")
    return Replay(row.job_id, row.response_status, row.response_body)


def _insert(session: Session) -> Any:
    if session.get_bind().dialect.name == "postgresql":
        from sqlalchemy.dialects import postgresql

        return postgresql.insert(IdempotencyKey)
    from sqlalchemy.dialects import sqlite

    return sqlite.insert(IdempotencyKey)


def record_answer(session: Session, user_id: uuid.UUID, key: str, job_id: uuid.UUID,
                  status: int, body: Any) -> bool:
    """Remember the answer the first submit gave (only once, only for its own job)."""
    done = session.execute(update(IdempotencyKey).where(
        IdempotencyKey.user_id == user_id, IdempotencyKey.key == key,
        IdempotencyKey.job_id == job_id, IdempotencyKey.response_status.is_(None),
    ).values(response_status=status, response_body=body))
    return bool(rowcount(done))


def purge(session: Session, now: datetime, limit: int = PURGE_BATCH) -> int:
    """Forget keys older than :data:`RETENTION` (at most ``limit`` per call)."""
    old = select(IdempotencyKey.user_id, IdempotencyKey.key).where(
        IdempotencyKey.created_at < now - RETENTION).limit(limit)
    rows = session.execute(old).all()
    for user_id, key in rows:
        session.execute(delete(IdempotencyKey).where(
            IdempotencyKey.user_id == user_id, IdempotencyKey.key == key))
    return len(rows)
