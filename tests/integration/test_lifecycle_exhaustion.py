"""Issue 11 hole 2: whatever a step raises, no in-flight job outlives its kind's exhaustion
horizon (PostgreSQL, the simulator, an injected clock; the poll chain and the sweep both run).

Each case injects an exception at one step — the poll read, every finalize sub-step, the
platform's hooks, the ledger's commit — and drives the clock past the horizon (threshold +
18 attempts × 5 minutes). Every raise counts as an attempt with its code in
``reconcile_last_error``; at exhaustion the failure is saved first, then refunded. When the
ledger also refuses the refund, the job stays failed and unsettled with exactly one
``ledger_error`` anomaly, is listed by ``reconcile unsettled``, and settlement keeps retrying
with capped backoff.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import delete, select
from sqlalchemy.orm import Session, sessionmaker

from reconcile import credits, jobstore, lifecycle
from reconcile.cli import main
from reconcile.credits import inline
from reconcile.db.models import CreditTransaction, Job
from reconcile.errors import LedgerError
from reconcile.lifecycle import completion, finalize
from reconcile.media import fetch as media
from reconcile.states import MAX_ATTEMPTS, SETTLE_BACKOFF_MAX
from reconcile.testing.simulator import Script, Simulator
from tests.integration._sweep_helpers import World, assert_refunded
from tests.integration.harness import drain

KIND = "replicate-prediction"
THRESHOLD = timedelta(minutes=20)
HORIZON = THRESHOLD + MAX_ATTEMPTS * timedelta(minutes=5)  # 110 minutes
SUCCEEDS = Script(timeline=((0.0, "queued"), (0.0, "succeeded")))
FAILS = Script(timeline=((0.0, "queued"), (0.0, "failed")))


class Boom(RuntimeError):
    """The injected fault."""


def boom(*args: Any, **kwargs: Any) -> Any:
    raise Boom("injected")


@pytest.fixture
def world(db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> World:
    return World(db, simulator, tmp_path)


def _poll(w: World, mp: pytest.MonkeyPatch) -> None:
    mp.setattr(type(w.rt.client(w.rt.kind(KIND))), "poll", boom)  # type: ignore[arg-type]


def _fetch(w: World, mp: pytest.MonkeyPatch) -> None:
    w.sim.script_default(SUCCEEDS)  # outputs are URLs: the fetch runs
    mp.setattr(media, "safe_fetch", boom)


def _watermark(w: World, mp: pytest.MonkeyPatch) -> None:
    w.rt.watermark_hook = boom


def _store(w: World, mp: pytest.MonkeyPatch) -> None:
    mp.setattr(w.rt.storage, "put", boom)


def _pricing_raises(w: World, mp: pytest.MonkeyPatch) -> None:
    w.rt.pricing_hook = boom


def _pricing_refused(w: World, mp: pytest.MonkeyPatch) -> None:
    w.rt.pricing_hook = lambda job, result: 41  # more than the 40 reserved: LedgerError


def _complete_cas(w: World, mp: pytest.MonkeyPatch) -> None:
    mp.setattr(jobstore, "mark_completed", boom)
    mp.setattr(completion, "complete", boom)  # the CAS inside the one statement (PostgreSQL)


def _commit(w: World, mp: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> bool:
        raise LedgerError("injected: the ledger refuses the commit")
    mp.setattr(credits, "commit", refuse)
    # the commit inside the completion's one statement: its row read as a refusal
    mp.setattr(inline, "outcome", refuse)


def _completed_event(w: World, mp: pytest.MonkeyPatch) -> None:
    # the completion's event is built by new_event (written with the assets in one statement);
    # finalize_job_with_media looks it up in its own module
    real = finalize.new_event

    def new_event(job: Job, kind: str, *args: Any, **kwargs: Any) -> Any:
        if kind == "completed":
            raise Boom("injected")
        return real(job, kind, *args, **kwargs)
    mp.setattr(finalize, "new_event", new_event)


def _reopen(w: World, mp: pytest.MonkeyPatch) -> None:
    mp.setattr(finalize, "_reopen_workflow", boom)


def _completion_hook(w: World, mp: pytest.MonkeyPatch) -> None:
    w.rt.completion_hooks[KIND] = boom


STEPS: dict[str, Callable[[World, pytest.MonkeyPatch], None]] = {
    "poll": _poll, "fetch": _fetch, "watermark_hook": _watermark, "store": _store,
    "pricing_hook_raises": _pricing_raises, "pricing_hook_refused": _pricing_refused,
    "complete_cas": _complete_cas, "commit": _commit, "completed_event": _completed_event,
    "workflow_reopen": _reopen, "completion_hook": _completion_hook,
}


def drive(w: World, job_id: uuid.UUID, until: timedelta) -> None:
    """Every 5 simulated minutes (the attempt spacing): a few steps of the live poll chain,
    and a sweep tick."""
    start = w.clock.now
    while w.clock.now - start < until and w.job(job_id).status in ("pending", "processing"):
        w.clock.advance(minutes=5)
        drain(w.rt, w.q, max_steps=2)
        w.q.polls = type(w.q.polls)(list(w.q.polls)[-1:])  # keep the chain, drop the backlog
        w.tick()


def plant_refused_refund(w: World, job_id: uuid.UUID) -> None:
    """Ledger corruption the refund refuses (a refund id already taken while the log is still
    reserved): every refund of the job raises LedgerError until an operator repairs it."""
    with w.db.begin() as s:
        s.add(CreditTransaction(id=credits.refund_txn_id(job_id), user_id=w.user, job_id=job_id,
                                type="REFUND", amount=0, from_sub=0, from_topup=0,
                                created_at=w.clock.now))


def unsettled_ids(w: World) -> set[str]:
    url = w.db.kw["bind"].url.render_as_string(hide_password=False)
    result = CliRunner().invoke(main, ["--database-url", url, "unsettled", "--json"])
    assert result.exit_code == 0, result.output
    return {row["id"] for row in json.loads(result.stdout)}


@pytest.mark.parametrize("step", list(STEPS))
def test_a_raising_step_counts_attempts_and_the_job_fails_at_its_horizon(
        world: World, monkeypatch: pytest.MonkeyPatch, step: str) -> None:
    w = world
    w.sim.script_default(SUCCEEDS)
    job_id = w.submit(KIND, input={"prompt": "x"}, workflow_execution_id=None)
    STEPS[step](w, monkeypatch)
    assert lifecycle.create_step(w.rt, job_id).action == "accepted"
    drive(w, job_id, HORIZON + timedelta(minutes=15))
    job = assert_refunded(w, job_id, "INTERNAL")
    assert job.error_detail["attempts"] == MAX_ATTEMPTS
    expected = "cannot commit 41" if step == "pricing_hook_refused" else "injected"
    assert expected in job.error_detail["last_error"]
    assert w.anomalies(job_id) == ["reconcile_exhausted"]
    assert job.completed_at - job.provider_call_started_at <= HORIZON + timedelta(minutes=6)


def test_a_raising_create_client_is_uncertain_and_held_for_an_operator(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """The create step raises after the claim: whether it reached the provider is unknown, so
    the job is ``uncertain`` at once (held on purpose, never resubmitted), and after 18
    evidence checks it gets one ``uncertain_unresolved`` anomaly with its reservation kept."""
    w = world
    job_id = w.submit(KIND)
    monkeypatch.setattr(type(w.rt.client(w.rt.kind(KIND))), "create", boom)  # type: ignore[arg-type]
    assert lifecycle.create_step(w.rt, job_id).action == "uncertain"
    job = w.job(job_id)
    assert (job.status, job.submission_state) == ("pending", "uncertain")
    assert "Boom" in job.error_detail["exception"]
    drive(w, job_id, HORIZON + timedelta(minutes=15))
    assert w.job(job_id).submission_state == "uncertain" and w.log_status(job_id) == "reserved"
    assert w.anomalies(job_id) == ["uncertain_unresolved"]
    assert w.sim.creates(str(job_id)) == 0


def test_a_refused_refund_leaves_the_job_failed_unsettled_with_one_anomaly_and_retrying(
        world: World) -> None:
    """The provider reports failure; the ledger refuses the refund. The failure is saved
    first; the job stays failed with credits_actual NULL, one ``ledger_error`` anomaly, is
    listed by ``reconcile unsettled``, and retries with a backoff capped at an hour; once the
    ledger is repaired the next retry settles it."""
    w = world
    job_id = w.accept(KIND, FAILS)
    plant_refused_refund(w, job_id)
    assert lifecycle.resume_chain(w.rt, job_id)
    drain(w.rt, w.q, max_steps=3)
    job = w.job(job_id)
    assert (job.status, job.error_code, job.credits_actual) == ("failed", "UPSTREAM_FAILED", None)
    assert w.anomalies(job_id) == ["ledger_error"]
    assert str(job_id) in unsettled_ids(w)
    attempts = job.settle_attempts
    for _ in range(2 * 8):  # 8 simulated hours of sweeps, one every 30 minutes
        w.clock.advance(minutes=30)
        w.tick()
        job = w.job(job_id)
        assert job.next_poll_at - w.clock.now <= SETTLE_BACKOFF_MAX
    assert job.settle_attempts >= attempts + 8 and job.credits_actual is None
    assert w.anomalies(job_id) == ["ledger_error"]  # exactly one, whatever the retries
    with w.db.begin() as s:
        s.execute(delete(CreditTransaction).where(
            CreditTransaction.id == credits.refund_txn_id(job_id)))
    w.clock.now = job.next_poll_at + timedelta(minutes=1)
    w.tick()
    assert_refunded(w, job_id, "UPSTREAM_FAILED")
    assert str(job_id) not in unsettled_ids(w)


def test_a_refused_commit_then_a_refused_refund_fails_the_job_unsettled(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pricing hook's amount is refused at commit on every attempt, and at exhaustion the
    refund is refused too: the job is failed (never left in flight), unsettled, one
    ``ledger_error`` anomaly, listed by ``reconcile unsettled``."""
    w = world
    w.sim.script_default(SUCCEEDS)
    job_id = w.submit(KIND)
    _pricing_refused(w, monkeypatch)
    assert lifecycle.create_step(w.rt, job_id).action == "accepted"
    plant_refused_refund(w, job_id)
    drive(w, job_id, HORIZON + timedelta(minutes=15))
    job = w.job(job_id)
    assert (job.status, job.error_code, job.credits_actual) == ("failed", "INTERNAL", None)
    assert job.next_poll_at is not None and w.log_status(job_id) == "reserved"
    assert sorted(w.anomalies(job_id)) == ["ledger_error", "reconcile_exhausted"]
    assert str(job_id) in unsettled_ids(w)
    with w.db() as s:
        assert s.execute(select(Job.status).where(Job.id == job_id)).scalar_one() == "failed"
