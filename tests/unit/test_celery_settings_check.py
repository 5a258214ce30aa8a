"""Issue 26: a worker serving the library's queues checks the effective Celery settings at
start-up, whether its app was configured by ``reconcile.install`` or by hand."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
from celery import Celery

import reconcile.tasks  # noqa: F401 - connects the start-up check, as a hand-configured app does
from reconcile import Settings
from reconcile.celery_install import QUEUE, check_broker_limits, install, library_settings
from reconcile.testing.processes import ROOT, free_port
from reconcile.worker import broker

UNSAFE = "worker_cancel_long_running_tasks_on_connection_loss"


def by_hand(**overrides: object) -> Celery:
    """The library's settings merged by hand (no ``install``), with ``overrides``."""
    app = Celery("platform", set_as_current=False)
    app.config_from_object({**library_settings(), "broker_url": "memory://", **overrides})
    return app


def start(app: Celery, *queues: str) -> None:
    """What ``worker_init`` sends: the worker (``-Q queues``), whose ``app`` is the platform's."""
    if queues:
        app.amqp.queues.select(list(queues))
    check_broker_limits(sender=SimpleNamespace(app=app))


def test_a_hand_configured_app_with_cancel_on_connection_loss_is_refused() -> None:
    with pytest.raises(SystemExit, match=UNSAFE):
        start(by_hand(**{UNSAFE: True}))
    start(by_hand())  # the library's own values pass


def test_an_installed_app_passes_and_keeps_the_platforms_unsafe_value_refused() -> None:
    app = Celery("platform", set_as_current=False, broker="memory://")
    install(app, replace=False)
    start(app, "celery", QUEUE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kept = Celery("platform", set_as_current=False, broker="memory://")
        kept.conf[UNSAFE] = True
        install(kept, replace=False)
    with pytest.raises(SystemExit, match=UNSAFE):
        start(kept, "celery", QUEUE)


def test_a_worker_that_serves_other_queues_only_is_not_checked() -> None:
    start(by_hand(**{UNSAFE: True, "task_default_queue": "celery"}))


def test_prefetch_counts_in_the_held_delivery() -> None:
    conf = SimpleNamespace(broker_url="redis://h/0", task_time_limit=600,
                           broker_transport_options={"visibility_timeout": 3600},
                           worker_prefetch_multiplier=6)
    assert any("prefetch 6" in p for p in broker.limit_problems(conf, Settings()))
    conf.worker_prefetch_multiplier = 0
    assert any("without bound" in p for p in broker.limit_problems(conf, Settings()))
    conf.worker_prefetch_multiplier = 1
    assert broker.limit_problems(conf, Settings()) == []


def test_a_real_hand_configured_worker_refuses_to_start(tmp_path: Path) -> None:
    """``celery worker`` of a platform app that merged the settings by hand and kept
    cancel-on-connection-loss on exits at start-up, naming the setting (it never reaches the
    broker: nothing listens there)."""
    (tmp_path / "handapp.py").write_text(
        "from celery import Celery\n"
        "import reconcile.tasks  # noqa: F401\n"
        "app = Celery('hand')\n"
        "app.config_from_object('reconcile.celery_settings')\n"
        f"app.conf.{UNSAFE} = True\n")
    env = {**os.environ, "RECONCILE_BROKER_URL": f"redis://127.0.0.1:{free_port()}/0",
           "RECONCILE_DATABASE_URL": "sqlite://",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "handapp", "worker", "--pool=solo",
         "--without-gossip", "--without-mingle", "--without-heartbeat"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert f"{UNSAFE}=True" in done.stdout + done.stderr
