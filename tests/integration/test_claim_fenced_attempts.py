"""A read that is no verdict counts, and fails a job at exhaustion, only under the poller's own
claim.

A poller reads "not found" (a transient miss) for a job with one attempt left. Before it
writes, its claim is taken over: the webhook's confirming read starts a new generation, or
the poller is reaped and another claims the row; meanwhile the upstream task succeeded. The
stale read must spend no attempt and fail nothing; the new poller completes the job once,
with no refund. Batch mode (the claim held, then taken over before the outcome) and chain mode
(the turn taken, then taken over before the count) alike.

PostgreSQL, the simulator and an injected clock (``World``).
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from reconcile import lifecycle
from reconcile.lifecycle import batch as batch_poll
from reconcile.states import MAX_ATTEMPTS
from reconcile.sweep.liveness import reap
from reconcile.testing.simulator import Script, Simulator
from tests.integration._sweep_helpers import FOREVER, World

KIND = "replicate-prediction"
THRESHOLD = timedelta(minutes=20)


def _last_attempt_miss(w: World, monkeypatch: pytest.MonkeyPatch,
                       taken_over: Any) -> tuple[uuid.UUID, str]:
    """A job past its stale threshold with one attempt left, whose next read says "not found"
    once; ``taken_over()`` runs inside that read, after the poller's claim or turn."""
    job_id = w.accept(KIND, Script(timeline=FOREVER))
    w.clock.now += THRESHOLD + timedelta(minutes=1)
    w.set(job_id, reconcile_attempts=MAX_ATTEMPTS - 1, reconcile_last_attempt_at=None)
    w.miss_once(monkeypatch, job_id, taken_over)
    task = w.task_id(job_id)
    return job_id, task


def _spent_nothing(w: World, job_id: uuid.UUID) -> None:
    job = w.job(job_id)
    assert job.status == "processing", (job.status, job.error_code)
    assert job.reconcile_attempts == MAX_ATTEMPTS - 1  # the stale read counted no attempt
    assert w.refunds(job_id) == 0


@pytest.mark.parametrize("takeover", ["webhook_resume", "reap_and_claim"])
def test_batch_a_claim_taken_over_after_its_hold_spends_no_attempt_and_fails_nothing(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, takeover: str) -> None:
    w = World(db, simulator, tmp_path, poll_mode="batch", poll_batch_threads=1,
              poll_batch_finalize_threads=1)
    w.rt.worker_id = "w-A"
    taken: list[batch_poll.Claim] = []
    real_observe = lifecycle.observe
    holder: dict[str, uuid.UUID] = {}

    def taken_over() -> None:
        holder["armed"] = holder["job"]  # the takeover runs after the round's hold

    job_id, _ = _last_attempt_miss(w, monkeypatch, taken_over)
    holder["job"] = job_id

    def observe(rt: Any, job: Any, *args: Any, **kw: Any) -> Any:
        if holder.pop("armed", None) == job.id:  # held already: now it is taken over
            if takeover == "webhook_resume":
                assert lifecycle.resume_chain(w.rt, job.id)
            else:
                w.lapse("w-A")
                assert reap(w.rt).workers == ["w-A"]
            w.rt.worker_id = "w-B"
            taken.extend(batch_poll.claim(w.rt))
            w.rt.worker_id = "w-A"
        return real_observe(rt, job, *args, **kw)

    monkeypatch.setattr(lifecycle, "observe", observe)
    claims = batch_poll.claim(w.rt)
    assert [c.job.id for c in claims] == [job_id]
    a = batch_poll.run_claims(w.rt, claims)
    monkeypatch.setattr(lifecycle, "observe", real_observe)
    assert a.outcomes == {"fenced": 1}, a.line()
    _spent_nothing(w, job_id)
    assert [c.job.id for c in taken] == [job_id]
    b = batch_poll.run_claims(w.rt, taken)
    assert b.outcomes == {"completed": 1}, b.line()
    assert w.job(job_id).status == "completed" and w.refunds(job_id) == 0
    assert w.audit() == []


def test_chain_a_turn_taken_over_before_its_count_spends_no_attempt_and_fails_nothing(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    w = World(db, simulator, tmp_path, poll_mode="chain")
    box: dict[str, uuid.UUID] = {}

    def taken_over() -> None:  # the sweep (or a webhook) resumes the chain: a new generation
        assert lifecycle.resume_chain(w.rt, box["job"])

    job_id, _ = _last_attempt_miss(w, monkeypatch, taken_over)
    box["job"] = job_id
    before = w.job(job_id)
    w.lose_messages()
    outcome = lifecycle.poll_step(w.rt, job_id, before.poll_generation, before.poll_seq)
    assert outcome == "in_flight", outcome  # no verdict, and nothing written under the turn
    _spent_nothing(w, job_id)
    resumed = w.job(job_id)
    assert resumed.poll_generation == before.poll_generation + 1
    # the resumed chain reads the task's success and completes it
    assert lifecycle.poll_step(w.rt, job_id, resumed.poll_generation, 0) == "completed"
    # the stale chain's next message is fenced
    assert lifecycle.poll_step(w.rt, job_id, before.poll_generation,
                               before.poll_seq + 1) == "fenced"
    assert w.job(job_id).status == "completed" and w.refunds(job_id) == 0
    assert w.audit() == []


def test_the_sweeps_read_counts_only_while_no_poller_claimed_the_row_since(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Batch mode: the sweep claims the last attempt of a due row and reads "not found"; during
    that read a batch poller claims the row (the task has succeeded). The sweep's read is no
    verdict and the row is the poller's now: the sweep fails nothing, the poller completes it.
    (A resume of a generation that never took a turn keeps its generation and seq; the fence
    sees it by the row's resume count: ``test_attack_fenced.py``'s first test.)"""
    from reconcile.sweep import reconcile_job

    w = World(db, simulator, tmp_path, poll_mode="batch", poll_batch_threads=1,
              poll_batch_finalize_threads=1)
    taken: list[batch_poll.Claim] = []

    def taken_over() -> None:
        taken.extend(batch_poll.claim(w.rt))  # the poller's claim: seq + 1

    job_id, _ = _last_attempt_miss(w, monkeypatch, taken_over)
    assert reconcile_job(w.rt, job_id) in ("lost", "in_flight"), w.job(job_id).status
    _spent_nothing_but_the_sweeps_claim(w, job_id)
    assert [c.job.id for c in taken] == [job_id]
    assert batch_poll.run_claims(w.rt, taken).outcomes == {"completed": 1}
    assert w.job(job_id).status == "completed" and w.refunds(job_id) == 0
    assert w.audit() == []


def _spent_nothing_but_the_sweeps_claim(w: World, job_id: uuid.UUID) -> None:
    job = w.job(job_id)
    assert job.status == "processing", (job.status, job.error_code)
    assert job.reconcile_attempts == MAX_ATTEMPTS  # the sweep's own claim of an attempt
    assert w.refunds(job_id) == 0
