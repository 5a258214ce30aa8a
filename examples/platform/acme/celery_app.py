"""acme's own Celery app, with its own task and the library installed into it.

    celery -A acme.celery_app worker -Q acme,reconcile.poll,reconcile.create,reconcile,reconcile.sweep
    celery -A acme.celery_app beat       # one beat: acme's schedule and the library's sweep
"""

from __future__ import annotations

import uuid

from celery import Celery
from celery.signals import worker_process_init
from sqlalchemy.dialects.postgresql import insert

import reconcile

from . import settings

app = Celery("acme", broker=settings.broker_url())
app.conf.update(
    task_default_queue="acme",
    task_routes={"acme.*": {"queue": "acme"}},
    task_ignore_result=True,
    beat_schedule={},
)
# after the app is configured: the library's tasks, settings, routes, beat entry, engine hook
reconcile.install(app)


@app.task(name="acme.notify")
def notify(job_id: str, kind: str) -> None:
    """acme's own task: record a notification (idempotent per job)."""
    from reconcile.tasks import get_runtime

    from .models import Notification

    with get_runtime().sessions.begin() as session:
        session.execute(insert(Notification).values(job_id=uuid.UUID(job_id), kind=kind)
                        .on_conflict_do_nothing(index_elements=["job_id"]))


@worker_process_init.connect(weak=False)
def _acme_runtime(**_: object) -> None:
    """Each worker process builds acme's runtime (its hooks) after the library's engine reset,
    which ``reconcile.install`` connected first."""
    from .runtime import build

    build()
