"""Another user's job id (real PostgreSQL + the simulator): snapshot and cancel answer 404
JOB_NOT_FOUND for it (and for a malformed id), and nothing changes.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from reconcile import api
from reconcile.testing.simulator import Simulator
from tests.integration.harness import fund
from tests.reliability._bad_input_helpers import submit
from tests.reliability.support import money_snapshot, runtime

# --------------------------------------------------------------------------- another user's job


def test_another_users_job_id_is_not_found(db: sessionmaker[Session], simulator: Simulator,
                                           tmp_path: Path) -> None:
    """snapshot and cancel with another user's job id → 404 JOB_NOT_FOUND; nothing changes.
    A malformed id is also 404."""
    rt, _ = runtime(db, simulator, tmp_path)
    owner, stranger = uuid.uuid4(), uuid.uuid4()
    fund(db, stranger, 100)
    job_id = submit(rt, db, "kie-standard", user=owner)  # not_started: cancelable by its owner
    before = money_snapshot(db)
    not_found = {"error": {"type": "not_found_error", "code": "JOB_NOT_FOUND",
                           "message": "No such job."}}
    for call in (api.snapshot, api.cancel):
        for ident in (job_id, str(job_id), str(job_id).upper(), "not-a-uuid", "", "../" * 8,
                      str(uuid.uuid4())):
            assert call(rt, stranger, ident) == (404, not_found), (call.__name__, ident)
    assert money_snapshot(db) == before
    assert api.snapshot(rt, owner, job_id)[0] == 200  # the owner still sees it
