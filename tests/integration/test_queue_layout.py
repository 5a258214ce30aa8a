"""Creates never starve polls: the queue layout the library installs, checked on real Celery
apps, a real Redis broker and a real ``celery worker``.

Creates go to ``reconcile.create``, polls (the chain's and the batch poller's) to
``reconcile.poll``, the sweep and retention to ``reconcile.sweep``, the rest to ``reconcile``.
A worker consuming several of them takes from each in turn, so a burst of creates queued ahead
of a poll delays it by at most one message; a worker started with the layout from before the
split (``-Q reconcile,reconcile.sweep``) consumes the new queues too.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from celery import Celery

import reconcile
from reconcile import celery_install, tasks
from reconcile.celery_install import CREATE_QUEUE, POLL_QUEUE, QUEUE, QUEUES, SWEEP_QUEUE
from reconcile.worker import installed
from tests.integration.workers import Worker, wait_for

pytestmark = pytest.mark.slow

EXPECTED = {
    "reconcile.create": CREATE_QUEUE,
    "reconcile.poll": POLL_QUEUE,
    "reconcile.poll_due": POLL_QUEUE,
    "reconcile.sweep": SWEEP_QUEUE,
    "reconcile.prune": SWEEP_QUEUE,
    "reconcile.settle": QUEUE,
    "reconcile.reconcile_job": QUEUE,
    "reconcile.reconcile_jobs": QUEUE,
}


@pytest.fixture
def restore_installed() -> Iterator[None]:
    before = installed._app  # the app every enqueue goes through (reconcile.worker.installed)
    yield
    installed._app = before


def _routed(app: Celery, task: str) -> str:
    return str(app.amqp.router.route({}, task)["queue"].name)


def test_installed_app_routes_creates_polls_and_the_sweep_to_their_own_queues(
        restore_installed: None, redis_url: str) -> None:
    """A platform's own app (its own default queue and routes) after ``reconcile.install``."""
    app = Celery("acme", broker=redis_url)
    app.conf.update(task_default_queue="acme", task_routes={"acme.*": {"queue": "acme"}})
    reconcile.install(app)
    assert {task: _routed(app, task) for task in EXPECTED} == EXPECTED
    assert _routed(app, "acme.bill") == "acme"
    assert _routed(app, "unrelated.task") == "acme"


def test_the_standalone_app_and_the_settings_module_route_the_same() -> None:
    """``reconcile.celery_app`` (configured from ``reconcile.celery_settings``)."""
    from reconcile import celery_settings
    from reconcile.celery_app import app

    assert {task: _routed(app, task) for task in EXPECTED} == EXPECTED
    plain = Celery("plain", broker="memory://")
    plain.config_from_object(celery_settings)
    assert {task: _routed(plain, task) for task in EXPECTED} == EXPECTED


def test_single_layout_keeps_every_task_but_the_sweep_on_reconcile(
        restore_installed: None, redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``RECONCILE_QUEUE_LAYOUT=single``: the layout from before the split."""
    monkeypatch.setenv("RECONCILE_QUEUE_LAYOUT", "single")
    app = Celery("acme", broker=redis_url)
    reconcile.install(app)
    single = {task: (SWEEP_QUEUE if queue == SWEEP_QUEUE else QUEUE)
              for task, queue in EXPECTED.items()}
    assert {task: _routed(app, task) for task in EXPECTED} == single


def test_a_burst_of_creates_lands_on_another_queue_than_the_polls(
        restore_installed: None, redis_url: str) -> None:
    """The library's own enqueues: 200 creates and one poll, through the installed app."""
    client = redis.Redis.from_url(redis_url)
    client.delete(*QUEUES)
    reconcile.install(Celery("acme", broker=redis_url))
    for _ in range(200):
        tasks.enqueue_create(uuid.uuid4())
    job_id = uuid.uuid4()
    tasks.enqueue_poll(job_id, 3, 7, 0.0)
    assert client.llen(CREATE_QUEUE) == 200
    assert client.llen(POLL_QUEUE) == 1
    assert client.llen(QUEUE) == 0
    client.delete(*QUEUES)


_SENT = ("reconcile.create", "reconcile.poll")  # what the tests below send


def _received(log: str, names: tuple[str, ...] | None = None) -> list[str]:
    """The tasks the worker received, in order (only ``names``, when given: a worker also
    receives the ``reconcile.poll_due`` its own fallback tick sends when a row of the shared
    database is due)."""
    got = re.findall(r"Task (reconcile\.\w+)\[[0-9a-f-]+\] received", log)
    return got if names is None else [name for name in got if name in names]


@pytest.mark.parametrize("layout", ["split", "single"])
def test_a_poll_queued_behind_a_burst_of_creates_runs_next(
        pg_url: str, redis_url: str, tmp_path: Path, layout: str) -> None:
    """40 creates, then one poll, all queued before a one-process worker starts: in the split
    layout the poll is among the first two messages the worker takes; in the single layout it
    waits behind all 40 (what the split is for)."""
    client = redis.Redis.from_url(redis_url)
    client.delete(*QUEUES)
    sender = Celery("web", broker=redis_url)
    sender.conf.task_default_queue = QUEUE
    sender.conf.task_routes = celery_install.routes(layout)
    for _ in range(40):  # creates of unknown jobs: each exits at its claim
        sender.send_task("reconcile.create", args=[str(uuid.uuid4())])
    sender.send_task("reconcile.poll", args=[str(uuid.uuid4()), 1, 0])
    env = {"RECONCILE_DATABASE_URL": pg_url, "RECONCILE_BROKER_URL": redis_url,
           "RECONCILE_QUEUE_LAYOUT": layout}
    worker = Worker(env, tmp_path / "worker.log", concurrency=1)
    try:
        worker.wait_ready(timeout=60)
        assert wait_for(lambda: len(_received(worker.log_path.read_text(), _SENT)) == 41, 120), \
            worker.log_path.read_text()[-3000:]
    finally:
        worker.stop()
        client.delete(*QUEUES)
    order = _received(worker.log_path.read_text(), _SENT)
    assert order.count("reconcile.create") == 40
    if layout == "split":
        assert order.index("reconcile.poll") <= 1, order
    else:
        assert order.index("reconcile.poll") == 40, order


def test_a_worker_started_with_the_old_queue_names_consumes_the_new_queues(
        pg_url: str, redis_url: str, tmp_path: Path) -> None:
    """``-Q reconcile,reconcile.sweep`` (the layout before the split): the worker consumes
    ``reconcile.create`` and ``reconcile.poll`` as well, and runs what is queued there."""
    client = redis.Redis.from_url(redis_url)
    client.delete(*QUEUES)
    sender = Celery("web", broker=redis_url)
    sender.conf.task_routes = celery_install.routes()
    sender.send_task("reconcile.create", args=[str(uuid.uuid4())])
    sender.send_task("reconcile.poll", args=[str(uuid.uuid4()), 1, 0])
    env = {"RECONCILE_DATABASE_URL": pg_url, "RECONCILE_BROKER_URL": redis_url}
    worker = Worker(env, tmp_path / "worker.log", queues="reconcile,reconcile.sweep")
    try:
        worker.wait_ready(timeout=60)
        assert wait_for(lambda: len(_received(worker.log_path.read_text(), _SENT)) == 2, 60), \
            worker.log_path.read_text()[-3000:]
        log = worker.log_path.read_text()
        assert "reconcile_queue_layout" in log
        assert client.llen(CREATE_QUEUE) == 0 and client.llen(POLL_QUEUE) == 0
    finally:
        worker.stop()
        client.delete(*QUEUES)
