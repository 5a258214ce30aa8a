"""``reconcile`` in the peers benchmark, as its docs deploy it: ``celery -A reconcile.celery_app
worker`` (prefork, two pool processes) and ``celery -A reconcile.celery_app beat``, default
settings but the poll mode (``RECONCILE_POLL_MODE``: ``chain``, one broker message per poll, or
``batch``, due rows claimed by ``reconcile.poll_due`` on the beat's tick).

The web tier calls :func:`reconcile.api.submit` (validate, reserve, insert the job, enqueue its
create after the commit); the library does the rest: create, poll every 5 s (``kie-standard``),
download the output into storage, complete the job and commit its credits. A dead worker's poll
turns are resumed by the heartbeat of a live one (default ``RECONCILE_HEARTBEAT_*``).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import text

from .harness import CREDITS, GRANT, PYTHON, Proc, Setup, System, celery_worker
from .upstream import CALLBACK, MODEL

QUEUES = "reconcile.poll,reconcile.create,reconcile,reconcile.sweep"


class Reconcile(System):
    module = "reconcile_app"
    migrated = True  # a copy of the library's migrated template database
    table, task_column = "jobs", "provider_task_id"
    celery_app, family = "reconcile.celery_app", "reconcile"

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.name = f"reconcile-{mode}"

    def env(self, s: Setup) -> dict[str, str]:
        return {**super().env(s), **s.sim.env,
                "RECONCILE_DATABASE_URL": s.sa_url,
                "RECONCILE_BROKER_URL": s.broker,
                "RECONCILE_STORAGE_URL": f"file://{s.media}",
                # plants ?job_id= in the create (the simulator counts creates per job); the
                # script sends no webhook, so nothing is ever called there
                "RECONCILE_WEBHOOK_BASE_URL": CALLBACK.rsplit("/", 1)[0],
                "RECONCILE_POLL_MODE": self.mode}

    def prepare(self, s: Setup, users: list[uuid.UUID]) -> None:
        from reconcile import credits
        from reconcile.db.session import make_engine, make_sessionmaker

        engine = make_engine(s.sa_url)
        with make_sessionmaker(engine).begin() as session:
            for user in users:
                credits.grant(session, user, "sub", GRANT, f"bench-grant:{user}")
        engine.dispose()

    def start_workers(self, s: Setup, tag: str) -> list[Proc]:
        worker = celery_worker(self.celery_app, QUEUES, self.env(s),
                               s.logs / f"{tag}-worker.log")
        worker.wait_for("ready.")
        return [worker]

    def start_extras(self, s: Setup, tag: str) -> list[Proc]:
        """``celery beat``: the library's schedule (the sweep; batch mode's poll_due tick)."""
        return [Proc([str(Path(PYTHON).parent / "celery"), "-A", "reconcile.celery_app", "beat",
                      "-l", "info", "-s", str(s.logs / f"{tag}-beat-schedule")], self.env(s),
                     s.logs / f"{tag}-beat.log")]

    def jobs(self, engine: Any) -> list[Any]:
        with engine.connect() as conn:
            return list(conn.execute(text(
                "SELECT id, status, provider_task_id AS task_id, completed_at FROM jobs")).all())

    def ledger(self, engine: Any) -> dict[str, Any]:
        """Jobs per status; every audit discrepancy and every completed job whose commit is not
        its reservation (``problems``)."""
        from sqlalchemy.orm import Session

        from reconcile import credits
        from reconcile.settings import Settings

        with engine.connect() as conn:
            by_status = {r[0]: int(r[1]) for r in conn.execute(text(
                "SELECT status, count(*) FROM jobs GROUP BY status"))}
            bad = conn.execute(text(
            "SELECT count(*) FROM jobs j "
            "LEFT JOIN reconcile_credit_transactions u ON u.id = 'job-usage:' || j.id "
            "LEFT JOIN reconcile_credit_transactions c ON c.id = 'job-commit:' || j.id "
                "WHERE j.status = 'completed' AND (u.amount IS DISTINCT FROM c.amount "
                "OR u.amount IS DISTINCT FROM :credits OR EXISTS (SELECT 1 FROM "
                "reconcile_credit_transactions r WHERE r.job_id = j.id AND r.type = 'REFUND'))"),
                {"credits": CREDITS}).scalar_one()
        problems: dict[str, int] = {}
        if bad:
            problems["completed_commit_not_reservation"] = int(bad)
        with Session(bind=engine) as session, session.begin():
            for found in credits.audit(session, settings=Settings()):
                problems[found.kind] = problems.get(found.kind, 0) + 1
        return {"by_status": by_status, "problems": problems}


def web_submitter() -> Any:
    """The web tier's submit: :func:`reconcile.api.submit` (the create is enqueued after the
    commit, through the installed Celery app)."""
    import reconcile.celery_app  # noqa: F401 - installs the app every enqueue goes through
    from reconcile import api, tasks

    rt = tasks.get_runtime()
    with rt.sessions() as session:  # connected before the first request
        session.connection()

    def submit(user_id: uuid.UUID) -> None:
        status, body = api.submit(rt, user_id, "kie-standard", MODEL, {"prompt": "bench"},
                                  CREDITS, job_type="image")
        if status != 202:
            raise RuntimeError(f"submit answered {status}: {body}")

    return submit
