"""The seeded chaos run, capped for ``make test`` (``make chaos N=…`` runs the full one).

The seed is fixed here so a red build replays exactly (``RECONCILE_CHAOS_SEED`` overrides it;
``make chaos`` draws a fresh one each time and prints it).
"""

from __future__ import annotations

import os

import pytest

from reconcile.testing.chaos import ChaosConfig, make_plan, run
from tests.conftest import PG_ADMIN_URL

pytestmark = pytest.mark.slow

SEED = int(os.environ.get("RECONCILE_CHAOS_SEED", "20261130"))
JOBS = int(os.environ.get("RECONCILE_CHAOS_JOBS", "300"))


def test_same_seed_same_schedule() -> None:
    """The fault schedule, the jobs and the simulator's knobs are the seed's: replayable."""
    a, b, c = make_plan(SEED, JOBS), make_plan(SEED, JOBS), make_plan(SEED + 1, JOBS)
    assert a == b and a.digest() == b.digest()
    assert a.digest() != c.digest()
    actions = [f.action for f in a.faults]
    assert {f.target for f in a.faults if f.action == "kill_worker"} == {0, 1}  # both workers
    assert actions.count("redis_restart") >= 1 and actions.count("pg_terminate") >= 2
    assert {s.kind for s in a.jobs} >= {"kie-standard", "kie-veo", "replicate-prediction",
                                        "elevenlabs-async", "fal-queue", "anthropic-sync"}


def test_chaos_run_keeps_every_invariant() -> None:
    """~150 jobs in chain mode (a message per poll; the default, batch, runs below), two
    workers SIGKILLed, Redis restarted, backends terminated, overlapping sweeps: 0 duplicate
    creates, 0 double settlements, nothing stuck but listed uncertain jobs, a clean audit,
    every asset's object present, one asset per output."""
    jobs = max(60, JOBS // 2)
    report = run(ChaosConfig(jobs=jobs, seed=SEED, pg_admin=PG_ADMIN_URL, rate=20.0, quiet=True,
                             poll_mode="chain"))
    print("\n" + report.text())
    assert report.ok(), report.text()
    assert report.kills >= 2 and report.redis_restarts >= 1 and report.pg_terminations >= 2
    assert report.completed > jobs // 2  # the run did real work, not only failures


def test_chaos_run_in_batch_mode_keeps_every_invariant() -> None:
    """The same faults in the default mode, ``RECONCILE_POLL_MODE=batch`` in every process, under a partial
    policy: no poll messages, the run sends beat's ``reconcile.poll_due`` ticks to the workers,
    which claim, read and write batches while they are SIGKILLed, the broker restarts and their
    backends are terminated. The polls are the batch poller's: most jobs finish through it."""
    jobs = max(60, JOBS // 2)
    report = run(ChaosConfig(jobs=jobs, seed=SEED + 1, pg_admin=PG_ADMIN_URL, rate=20.0,
                             quiet=True, policy="1/2,1/3"))
    print("\n" + report.text())
    assert report.ok(), report.text()
    assert report.kills >= 2 and report.pg_terminations >= 2
    assert report.poll_due_ticks > 0 and "--poll-mode" not in report.text()  # the default
    # more completions than webhooks delivered: the rest were read by the batch poller
    assert report.completed > max(jobs // 2, sum(report.webhook_answers.values()) // 2)
