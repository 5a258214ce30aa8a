"""The shared predicates' SQL and their Python twins agree (SQLite, no PostgreSQL needed), and
the in-flight / unsettled texts stay the partial indexes' own."""

from __future__ import annotations

import itertools
import uuid
from datetime import UTC, datetime, timedelta

from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session

from reconcile import jobstore
from reconcile.db.models import Job

NOW = datetime(2030, 1, 1, tzinfo=UTC)


def test_the_python_twins_agree_with_the_sql() -> None:
    engine = create_engine("sqlite://")
    Job.__table__.create(engine)
    rows = []
    for status, actual, retry in itertools.product(
            ("pending", "processing", "completed", "failed", "cancelled"), (None, 0),
            (None, NOW - timedelta(minutes=1), NOW + timedelta(minutes=1))):
        rows.append(Job(id=uuid.uuid4(), user_id=uuid.uuid4(), job_type="image", status=status,
                        credits_actual=actual, next_poll_at=retry, created_at=NOW))
    with Session(engine) as s:
        s.add_all(rows)
        s.flush()
        pending = set(s.execute(select(Job.id).where(jobstore.settlement_pending())).scalars())
        due = set(s.execute(select(Job.id).where(jobstore.settlement_due(NOW))).scalars())
        flight = set(s.execute(select(Job.id).where(jobstore.in_flight())).scalars())
        assert pending == {j.id for j in rows if jobstore.is_settlement_pending(j)}
        assert due == {j.id for j in rows if jobstore.is_settlement_due(j, NOW)}
        assert flight == {j.id for j in rows if j.status in ("pending", "processing")}
        assert 0 < len(due) < len(pending) < len(rows)


def test_the_index_predicates_are_literal() -> None:
    assert str(jobstore.in_flight()) == "jobs.status IN ('pending', 'processing')"
    assert "jobs.status IN ('failed', 'cancelled')" in str(jobstore.settlement_pending())
