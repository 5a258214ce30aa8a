"""RECONCILE_POLL_MODE=batch and ``reconcile.install`` (auditor X2, item 6): the poll-due beat
entry exists only in batch mode, and ``reconcile.poll_due``'s re-enqueue goes through the
installed app, not Celery's thread-local current app. Each case runs in a fresh interpreter
(``celery_settings`` reads the settings at import; ``install`` sets a process-wide app)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROBE = r"""
import json
from types import SimpleNamespace
from celery import Celery
import reconcile
from reconcile import tasks
from reconcile.lifecycle import batch as batch_poll

platform = Celery("platform", broker="memory://")
reconcile.install(platform)
other = Celery("other", broker="memory://")
other.set_current()  # a thread-local current app that is not the installed one
sent = {"platform": 0, "other": 0}
for name, app in (("platform", platform), ("other", other)):
    task = app.tasks["reconcile.poll_due"]
    task.apply_async = (lambda n: lambda *a, **k: sent.__setitem__(n, sent[n] + 1))(name)
from datetime import UTC, datetime
from reconcile.settings import Settings
rt = SimpleNamespace(settings=Settings(), now=lambda: datetime.now(UTC))
tasks.get_runtime = lambda: rt
batch_poll.poll_due = lambda rt, **kw: batch_poll.BatchReport(claimed=1, batches=1, more=True)
ran = tasks.poll_due.run()
entry = platform.conf.beat_schedule.get("reconcile-poll-due")
print(json.dumps({"entry": entry and entry["task"], "sent": sent, "ran": ran.split()[0],
                  "loop": platform.conf.beat_max_loop_interval}))
"""


def _probe(mode: str | None) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECONCILE_")}
    if mode is not None:
        env["RECONCILE_POLL_MODE"] = mode
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("mode", [None, "batch"])  # None: the default is batch
def test_xb_batch_mode_installs_the_poll_due_entry_and_reenqueues_through_the_installed_app(
        mode: str | None) -> None:
    out = _probe(mode)
    assert out["entry"] == "reconcile.poll_due"
    assert out["sent"] == {"platform": 1, "other": 0}
    assert out["ran"] == "[reconcile]"
    assert float(out["loop"]) <= 1.0  # type: ignore[arg-type]


def test_xb_chain_mode_has_no_poll_due_entry_and_the_task_is_a_no_op() -> None:
    out = _probe("chain")
    assert out["entry"] is None
    assert out["sent"] == {"platform": 0, "other": 0} and out["ran"] == "off"


def test_the_beat_tick_has_one_home() -> None:
    """``Settings.poll_due_tick``: beat's schedule and the chaos run's beat thread both read it."""
    from reconcile.settings import Settings

    assert Settings(poll_batch_interval=1.0).poll_due_tick == (1.0, 1.0)
    assert Settings(poll_batch_interval=4.0, time_scale=0.5).poll_due_tick == (2.0, 2.0)
    assert Settings(poll_batch_interval=1.0, time_scale=0.01).poll_due_tick == (0.05, 1.0)
