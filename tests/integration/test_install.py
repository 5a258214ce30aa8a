"""``reconcile.install(app)`` into a platform's own Celery app (real Redis broker)."""

from __future__ import annotations

import json
import threading
import uuid
import warnings
import weakref
from collections.abc import Iterator

import pytest
import redis
from celery import Celery
from celery.signals import worker_process_init

import reconcile
from reconcile import celery_install, tasks
from reconcile.worker import installed


@pytest.fixture
def restore_installed() -> Iterator[None]:
    before = installed._app  # the app every enqueue goes through (reconcile.worker.installed)
    yield
    installed._app = before


def _platform_app(broker: str, **conf: object) -> Celery:
    app = Celery("acme", broker=broker)
    app.conf.update(task_default_queue="acme", **conf)
    return app


def test_install_merges_settings_routes_beat_and_the_engine_hook(
        restore_installed: None, redis_url: str) -> None:
    app = _platform_app(redis_url, task_routes={"acme.*": {"queue": "acme"}},
                        beat_schedule={"acme-nightly": {"task": "acme.nightly", "schedule": 86400}})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing conflicts: no warning
        assert reconcile.install(app) is app
    c = app.conf
    assert c.task_default_queue == "acme"  # the platform's own
    assert c.task_acks_late is True and c.worker_prefetch_multiplier == 1
    assert c.task_reject_on_worker_lost is True
    assert c.broker_transport_options["visibility_timeout"] >= 600
    assert c.task_routes["acme.*"] == {"queue": "acme"}
    assert c.task_routes["reconcile.sweep"] == {"queue": "reconcile.sweep"}
    assert c.task_routes["reconcile.*"] == {"queue": "reconcile"}
    # the default polling mode (batch) adds beat's poll_due tick
    assert set(c.beat_schedule) == {"acme-nightly", "reconcile-sweep", "reconcile-poll-due"}
    assert c.beat_schedule["reconcile-sweep"]["task"] == "reconcile.sweep"
    assert c.beat_schedule["reconcile-poll-due"]["task"] == "reconcile.poll_due"
    assert {"reconcile.create", "reconcile.poll", "reconcile.sweep"} <= set(app.tasks)
    assert app.tasks["reconcile.create"].app is app
    receivers = [r() if isinstance(r, weakref.ReferenceType) else r
                 for _, r in worker_process_init.receivers]
    assert celery_install.fresh_engines in receivers
    assert celery_install.installed_app() is app


def test_install_keeps_and_warns_about_the_platforms_conflicting_values(
        restore_installed: None, redis_url: str) -> None:
    app = _platform_app(redis_url, task_acks_late=False, worker_prefetch_multiplier=8,
                        broker_transport_options={"visibility_timeout": 60})
    with pytest.warns(celery_install.SettingConflict) as caught:
        reconcile.install(app)
    said = " ".join(str(w.message) for w in caught)
    assert "task_acks_late=False" in said
    assert "worker_prefetch_multiplier=8" in said
    assert "visibility_timeout" in said
    assert app.conf.task_acks_late is False
    assert app.conf.worker_prefetch_multiplier == 8
    assert app.conf.broker_transport_options["visibility_timeout"] == 60


def test_an_enqueue_from_another_thread_goes_through_the_installed_app(
        restore_installed: None, redis_url: str) -> None:
    """A web server's worker thread has Celery's default app as its current app; the library's
    enqueue still publishes to the installed app's broker and the ``reconcile.create`` queue."""
    client = redis.Redis.from_url(redis_url)
    client.delete("reconcile", "reconcile.create", "acme", "celery")
    app = _platform_app(redis_url)
    reconcile.install(app)
    job_id = uuid.uuid4()
    seen: list[object] = []

    def in_thread() -> None:
        from celery import current_app

        seen.append(current_app._get_current_object())
        tasks.enqueue_create(job_id)

    worker = threading.Thread(target=in_thread)
    worker.start()
    worker.join()
    assert seen and seen[0] is not app  # the thread's current app is not the platform's
    assert client.llen("reconcile.create") == 1
    assert client.llen("acme") == 0 and client.llen("celery") == 0
    assert client.llen("reconcile") == 0
    message = json.loads(client.lpop("reconcile.create"))
    assert message["headers"]["task"] == "reconcile.create"
    assert json.loads(__import__("base64").b64decode(message["body"]))[0] == [str(job_id)]


def test_importing_reconcile_celery_app_later_does_not_take_over_the_platforms_app(
        redis_url: str) -> None:
    """In a fresh process: the platform installs first; a later ``import reconcile.celery_app``
    (the CLI's enqueue path does it) leaves enqueues on the platform's app."""
    import subprocess
    import sys

    code = f"""
from celery import Celery
import reconcile
from reconcile import celery_install
app = Celery("acme", broker={redis_url!r})
reconcile.install(app)
import reconcile.celery_app
assert celery_install.installed_app() is app, celery_install.installed_app()
assert reconcile.celery_app.app is not app
print("ok")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
