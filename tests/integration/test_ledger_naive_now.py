"""A naive ``now`` handed to the ledger is refused before anything is written, on PostgreSQL and
SQLite alike. The ORM columns always refused one (``UTCDateTime``); the PostgreSQL
one-statement paths (reserve, commit, refund) bound it to ``timestamptz`` as it was, so the
row's time was the naive value read in the session's time zone — hours off wherever that zone
is not UTC, while the same call on SQLite raised."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone

import pytest
from sqlalchemy import func, select, text, update
from sqlalchemy.orm import Session, sessionmaker

from reconcile import credits
from reconcile.db.models import CreditTransaction, Job, UsageLog

NAIVE = datetime(2026, 12, 1, 9, 0)  # no tzinfo
AWARE = NAIVE.replace(tzinfo=UTC)


def _funded(db: sessionmaker[Session]) -> uuid.UUID:
    user = uuid.uuid4()
    with db.begin() as s:
        credits.grant(s, user, "sub", 100, f"grant-{user}", now=AWARE)
    return user


def _reserved(db: sessionmaker[Session], user: uuid.UUID) -> uuid.UUID:
    job = uuid.uuid4()
    with db.begin() as s:
        # the job rows (a reservation without one is orphaned_reservation), the "reserve" call's too
        for jid in (job, uuid.uuid5(job, "r")):
            s.add(Job(id=jid, user_id=user, job_type="image", status="processing",
                      created_at=AWARE))
        s.flush()
        credits.reserve(s, user, job, 30, now=AWARE)
    return job


def _state(db: sessionmaker[Session], user: uuid.UUID) -> tuple[int, list[str]]:
    with db() as s:
        txns = s.execute(select(func.count()).select_from(CreditTransaction).where(
            CreditTransaction.user_id == user)).scalar_one()
        logs = list(s.execute(select(UsageLog.status).where(UsageLog.user_id == user)
                              .order_by(UsageLog.status)).scalars())
    return txns, logs


CALLS: dict[str, Callable[[Session, uuid.UUID, uuid.UUID, datetime], object]] = {
    "reserve": lambda s, user, job, now: credits.reserve(s, user, uuid.uuid5(job, "r"), 10,
                                                         now=now),
    "commit": lambda s, user, job, now: credits.commit(s, job, now=now),
    "commit_part": lambda s, user, job, now: credits.commit(s, job, 12, now=now),
    "refund": lambda s, user, job, now: credits.refund(s, job, now=now),
    "grant": lambda s, user, job, now: credits.grant(s, user, "topup", 5, f"g-{job}", now=now),
}


@pytest.mark.parametrize("call", sorted(CALLS))
def test_a_naive_now_is_refused_and_nothing_is_written(
        pg_and_sqlite: sessionmaker[Session], call: str) -> None:
    db = pg_and_sqlite
    user = _funded(db)
    job = _reserved(db, user)
    before = _state(db, user)
    with pytest.raises(ValueError, match="naive datetime"):
        with db.begin() as s:
            CALLS[call](s, user, job, NAIVE)
    assert _state(db, user) == before
    # the same call with an aware time writes (the refusal is about the value, not the call)
    with db.begin() as s:
        CALLS[call](s, user, job, AWARE)
    assert _state(db, user) != before
    settled = {"commit": "completed", "commit_part": "completed", "refund": "failed"}
    if call in settled:  # the job row as its settlement leaves it (else settled_job_in_flight)
        with db.begin() as s:
            s.execute(update(Job).where(Job.id == job).values(status=settled[call]))
    with db() as s:
        assert credits.audit(s, now=AWARE + timedelta(days=1), grace=timedelta(0)) == []


def test_an_aware_now_in_another_zone_is_stored_as_its_instant(db: sessionmaker[Session]) -> None:
    """PostgreSQL, a session whose time zone is not UTC: an aware ``now`` in UTC+5 is stored as
    that instant on the one-statement reserve path."""
    user = _funded(db)
    job = uuid.uuid4()
    at = datetime(2026, 12, 1, 14, 0, tzinfo=timezone(timedelta(hours=5)))  # 09:00 UTC
    with db.begin() as s:
        s.execute(text("SET LOCAL TIME ZONE 'America/New_York'"))
        credits.reserve(s, user, job, 10, now=at)
    with db() as s:
        created = s.execute(select(CreditTransaction.created_at).where(
            CreditTransaction.job_id == job)).scalar_one()
    assert created == AWARE
