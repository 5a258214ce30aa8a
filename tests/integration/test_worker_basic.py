"""A real ``celery worker`` subprocess runs the create and poll tasks end to end."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from reconcile import lifecycle
from reconcile.db.models import Job
from reconcile.testing.simulator import Script, Simulator
from tests.integration.harness import fund, make_runtime
from tests.integration.test_worker_crash import TIME_SCALE, _env, _purge
from tests.integration.workers import Worker, make_sender, wait_for

pytestmark = pytest.mark.slow


def test_real_worker_on_redis_completes_jobs_once(db: sessionmaker[Session], pg_url: str,
                                                   simulator: Simulator, tmp_path: Path,
                                                   redis_url: str) -> None:
    """Three jobs through a prefork worker on Redis: all complete, one create each."""
    broker = redis_url  # this process's own db (test_worker_crash's db 13 may be in use)
    _purge(broker)
    sender = make_sender(broker)
    rt, _ = make_runtime(db, simulator, tmp_path, time_scale=TIME_SCALE)
    rt.enqueue_create = lambda jid, countdown=0.0: sender.send_task(
        "reconcile.create", args=[str(jid)], countdown=countdown or None)
    worker = Worker(_env(pg_url, broker, simulator, tmp_path), tmp_path / "w.log", concurrency=2)
    try:
        worker.wait_ready()
        user = uuid.uuid4()
        fund(db, user)
        simulator.script_default(Script(timeline=((0.0, "queued"), (0.3, "running"), (1.0, "succeeded"))))
        ids = [lifecycle.submit_job(rt, user, kind, model, {"prompt": "x"}, 10, job_type="image").job_id
               for kind, model in (("kie-standard", "m"), ("replicate-prediction", "o/m:v"),
                                   ("fal-queue", "fal-ai/flux/dev"))]

        def all_done() -> bool:
            with db() as s:
                return all(s.get(Job, j).status == "completed" for j in ids)  # type: ignore[union-attr]

        assert wait_for(all_done, 45), worker.log_path.read_text()[-3000:]
        assert [simulator.creates(str(j)) for j in ids] == [1, 1, 1]
        log = worker.log_path.read_text()
        assert "reconcile.create" in log and "reconcile.poll" in log
    finally:
        worker.stop()
