"""RECONCILE_POLL_MODE=batch end to end: a real ``celery worker`` and ``celery beat`` on Redis;
beat's ``reconcile.poll_due`` tick claims and reads the due rows — no ``reconcile.poll`` message
is ever sent — and every job completes once."""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from reconcile import lifecycle
from reconcile.db.models import Job
from reconcile.testing.simulator import Script, Simulator
from tests.integration.harness import fund, make_runtime
from tests.integration.test_worker_crash import TIME_SCALE, _env, _purge
from tests.integration.workers import CELERY, ROOT, Worker, make_sender, wait_for

pytestmark = pytest.mark.slow

BATCH_ENV = {"RECONCILE_POLL_MODE": "batch", "RECONCILE_POLL_BATCH_INTERVAL": "4",  # 0.2 s
             "RECONCILE_POLL_BATCH_THREADS": "4"}


@contextmanager
def batch_rig(db: sessionmaker[Session], pg_url: str, simulator: Simulator, tmp_path: Path,
              redis_url: str, logs: tuple[str, ...]) -> Iterator[tuple[Any, list[Worker]]]:
    """A batch-mode runtime whose creates go to Redis, one ``celery worker`` (two pool
    processes) per name in ``logs``, ready, and ``celery beat``; everything is stopped after."""
    _purge(redis_url)
    sender = make_sender(redis_url)
    rt, _ = make_runtime(db, simulator, tmp_path, time_scale=TIME_SCALE, poll_mode="batch")
    rt.enqueue_create = lambda jid, countdown=0.0: sender.send_task(
        "reconcile.create", args=[str(jid)], countdown=countdown or None)
    env = {**os.environ, **_env(pg_url, redis_url, simulator, tmp_path, **BATCH_ENV)}
    workers = [Worker(env, tmp_path / name, concurrency=2) for name in logs]
    beat_log = open(tmp_path / "beat.log", "ab")  # noqa: SIM115 - closed below
    beat = subprocess.Popen([CELERY, "-A", "reconcile.celery_app", "beat", "-l", "info",
                             "-s", str(tmp_path / "beat-schedule")], cwd=ROOT, env=env,
                            stdout=beat_log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        for worker in workers:
            worker.wait_ready()
        yield rt, workers
    finally:
        try:
            os.killpg(beat.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        beat.wait(timeout=10)
        beat_log.close()
        for worker in workers:
            worker.stop()


def test_real_worker_and_beat_complete_jobs_in_batch_mode(
        db: sessionmaker[Session], pg_url: str, simulator: Simulator, tmp_path: Path,
        redis_url: str) -> None:
    with batch_rig(db, pg_url, simulator, tmp_path, redis_url, ("w.log",)) as (rt, [worker]):
        user = uuid.uuid4()
        fund(db, user)
        simulator.script_default(Script(timeline=((0.0, "queued"), (0.3, "running"),
                                                  (1.5, "succeeded"))))
        ids = [lifecycle.submit_job(rt, user, kind, model, {"prompt": "x"}, 10,
                                    job_type="image").job_id
               for kind, model in (("kie-standard", "m"), ("replicate-prediction", "o/m:v"),
                                   ("fal-queue", "fal-ai/flux/dev"), ("kie-standard", "m"))]

        def all_done() -> bool:
            with db() as s:
                return all(s.get(Job, j).status == "completed" for j in ids)  # type: ignore[union-attr]

        assert wait_for(all_done, 60), worker.log_path.read_text()[-3000:]
        assert [simulator.creates(str(j)) for j in ids] == [1, 1, 1, 1]
        with db() as s:
            for j in ids:
                job = s.get(Job, j)
                assert job is not None and job.credits_actual == 10 and job.poll_seq >= 1
        log = worker.log_path.read_text()
        assert "Task reconcile.poll_due[" in log and "poll_due batches=" in log
        assert "Task reconcile.poll[" not in log  # no per-poll message in batch mode
        assert "reconcile-poll-due" in (tmp_path / "beat.log").read_text()


def test_xb_two_real_workers_poll_side_by_side_and_one_dies_mid_run(
        db: sessionmaker[Session], pg_url: str, simulator: Simulator, tmp_path: Path,
        redis_url: str) -> None:
    """Auditor X2: two ``celery worker`` processes (two pool processes each) and beat in batch
    mode, slow status reads (simulator latency) so poll_due runs overlap; the first worker is
    SIGKILLed while jobs are in flight. Every job completes exactly once (one create, one
    charge), only through poll_due; the ledger audit is clean."""
    from sqlalchemy import func, select

    from reconcile.db.models import JobEvent
    from tests.integration.harness import audit

    with batch_rig(db, pg_url, simulator, tmp_path, redis_url, ("w1.log", "w2.log")) as (
            rt, [doomed, survivor]):
        try:
            user = uuid.uuid4()
            fund(db, user)
            simulator.configure(latency_range=(0.05, 0.3))
            simulator.script_default(Script(timeline=((0.0, "queued"), (0.5, "running"),
                                                      (4.0, "succeeded"))))
            ids = [lifecycle.submit_job(rt, user, "kie-standard", "m", {"prompt": str(n)}, 10,
                                        job_type="image").job_id for n in range(12)]

            def status() -> list[str]:
                with db() as s:
                    return [s.get(Job, j).status for j in ids]  # type: ignore[union-attr]

            def polled_by_doomed() -> bool:
                return "poll_due batches=" in doomed.log_path.read_text()

            def all_created() -> bool:  # a create the doomed worker held would wait out its claim
                with db() as s:
                    return all(s.get(Job, j).provider_task_id for j in ids)  # type: ignore[union-attr]

            assert wait_for(all_created, 60), status()
            assert wait_for(polled_by_doomed, 30), doomed.log_path.read_text()[-3000:]
            doomed.kill_group()  # mid-run: its claimed rows are due again after one batch lease
            assert wait_for(lambda: all(s == "completed" for s in status()), 90), (
                status(), survivor.log_path.read_text()[-3000:])
            assert [simulator.creates(str(j)) for j in ids] == [1] * len(ids)
            with db() as s:
                completions = s.execute(select(JobEvent.job_id, func.count()).where(
                    JobEvent.job_id.in_(ids), JobEvent.type == "completed")
                    .group_by(JobEvent.job_id)).all()
                assert sorted(n for _, n in completions) == [1] * len(ids)
                assert all(s.get(Job, j).credits_actual == 10 for j in ids)  # type: ignore[union-attr]
                assert audit(s) == []
            for log in (doomed.log_path, survivor.log_path):
                assert "Task reconcile.poll[" not in log.read_text()
        finally:
            simulator.configure(latency_range=None)
