"""The prepared CAS statements: the one stored-value difference the differential test
(test_attack_prepared_differential.py) found between the old per-call claim_create and the
prepared one. On SQLite, the old claim bound ``now`` inside ``COALESCE(provider_call_started_at,
now)`` as a plain ``DateTime`` literal (no column type: SQLAlchemy's SQLite DATETIME formats the
wall time and drops the offset), so an aware ``now`` in a non-UTC offset was stored as local
wall time; the prepared claim binds it typed as the column (UTCDateTime) and stores UTC. The
new behaviour is the right one (every other time column of the claim was already UTC): this
test pins it and shows the old statement's value."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

from sqlalchemy import text

from reconcile import jobstore
from reconcile.db.migrate import upgrade
from reconcile.db.models import Job
from reconcile.db.session import make_engine, make_sessionmaker
from reconcile.states import Submission
from tests.integration.test_attack_prepared_differential import old_claim_create

NOW = datetime(2026, 3, 1, 17, 0, tzinfo=timezone(timedelta(hours=5)))  # 12:00 UTC


def test_sqlite_claim_stores_call_start_in_utc_the_old_one_stored_local_wall_time(
        tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/r.db"
    upgrade(url)
    engine = make_engine(url)
    sessions = make_sessionmaker(engine)
    ids = [uuid.uuid4(), uuid.uuid4()]
    with sessions.begin() as s:
        for job_id in ids:
            s.add(Job(id=job_id, user_id=uuid.uuid4(), job_type="image", status="pending",
                      provider_kind="a", submission_state=Submission.NOT_STARTED))
    with sessions.begin() as s:
        assert old_claim_create(s, ids[0], "t", NOW, timedelta(minutes=1)) is not None
        assert jobstore.claim_create(s, ids[1], "t", NOW, timedelta(minutes=1)) is not None
    with engine.connect() as c:
        stored = [c.execute(text("SELECT provider_call_started_at, started_at FROM jobs "
                                 "WHERE id = :id"), {"id": j.hex}).one() for j in ids]
    engine.dispose()
    assert stored[0] == ("2026-03-01 17:00:00.000000", "2026-03-01 12:00:00.000000")  # old
    assert stored[1] == ("2026-03-01 12:00:00.000000", "2026-03-01 12:00:00.000000")  # new
    assert NOW.astimezone(UTC).hour == 12
