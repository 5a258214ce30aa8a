"""Issue 11 hole 1: a create answer that arrives after its claim lease (PostgreSQL, simulator).

The worker's create is accepted upstream, but the answer reaches the worker only after the sweep
(or an operator) acted on the row: the ``after_accept`` crash point is the barrier between the
provider's answer and ``on_task_created``, and the injected clock moves past the claim lease
there. The late ``save_task_id`` then loses, and what it may do depends on the row it finds.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from reconcile import lifecycle
from reconcile.db.models import CreditAnomaly
from reconcile.testing.simulator import Script, Simulator
from tests.integration._sweep_helpers import World
from tests.integration.harness import drain

KIND = "replicate-prediction"  # has a provider listing (evidence) and a cancel endpoint
SUCCEEDS = Script(timeline=((0.0, "queued"), (0.0, "running"), (0.0, "succeeded")))
RUNS = Script(timeline=((0.0, "queued"), (0.0, "running"), (10.0**6, "succeeded")))


@pytest.fixture
def world(db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> World:
    return World(db, simulator, tmp_path)


def late_create(w: World, meanwhile: Callable[[uuid.UUID, str], None],
                script: Script = SUCCEEDS) -> tuple[uuid.UUID, str, str]:
    """Run one create whose answer is delivered only after ``meanwhile(job_id, task_id)`` ran
    with the clock past the claim lease. Returns (job id, upstream id, create outcome)."""
    job_id = w.submit(KIND)
    w.sim.script(str(job_id), script)
    seen: list[str] = []

    def barrier(name: str) -> None:
        if name == "after_accept" and not seen:
            [task] = w.sim.tasks_for(str(job_id))
            seen.append(task.task_id)
            w.clock.advance(minutes=3)  # the 2-minute claim lease is gone
            meanwhile(job_id, task.task_id)

    w.rt.crash_hook = barrier
    outcome = lifecycle.create_step(w.rt, job_id)
    w.rt.crash_hook = None
    assert seen, "the create never reached the provider"
    return job_id, seen[0], outcome.action


def anomalies(w: World, job_id: uuid.UUID) -> list[tuple[str, dict]]:  # type: ignore[type-arg]
    with w.db() as s:
        rows = s.execute(select(CreditAnomaly.kind, CreditAnomaly.detail)
                         .where(CreditAnomaly.job_id == job_id)).all()
    return [(kind, detail) for kind, detail in rows]


def test_late_answer_after_the_sweep_adopted_the_same_id_cancels_nothing(world: World) -> None:
    """Sweep: expired claim → uncertain → the listing names the task → adopted and polling.
    The late answer names the same task: success; nothing cancelled, nothing enqueued twice;
    the job completes and is charged."""
    w = world

    def sweep_adopts(job_id: uuid.UUID, task_id: str) -> None:
        w.tick()
        assert w.job(job_id).submission_state == "uncertain"
        w.clock.advance(minutes=6)  # the evidence check is due
        w.tick()
        adopted = w.job(job_id)
        assert (adopted.status, adopted.provider_task_id) == ("processing", task_id)

    job_id, task_id, action = late_create(w, sweep_adopts)
    assert action == "accepted"
    assert w.sim.state_of(task_id) != "canceled"
    assert len(w.q.polls) == 1  # the adopted chain only: the late answer enqueued nothing
    assert anomalies(w, job_id) == []
    drain(w.rt, w.q)
    job = w.job(job_id)
    assert (job.status, job.credits_actual) == ("completed", 40), (job.error_code, job.error_message)
    assert w.sim.creates(str(job_id)) == 1 and w.log_status(job_id) == "committed"
    assert w.audit() == []


def test_late_answer_after_operator_adopted_the_same_id_cancels_nothing(world: World) -> None:
    """``resolve --upstream-id`` with the right id while the worker's answer is late."""
    w = world

    def operator_adopts(job_id: uuid.UUID, task_id: str) -> None:
        assert lifecycle.adopt_upstream_id(w.rt, job_id, task_id, source="operator")

    job_id, task_id, action = late_create(w, operator_adopts)
    assert action == "accepted" and w.sim.state_of(task_id) != "canceled"
    assert anomalies(w, job_id) == []
    drain(w.rt, w.q)
    assert w.job(job_id).status == "completed"


def test_late_answer_naming_another_task_records_a_conflict_and_cancels_nothing(world: World) -> None:
    """An operator adopted a mistyped id: the late answer is the only proof of the real task,
    so it is not cancelled; one ``task_id_conflict`` anomaly names both ids."""
    w = world

    def operator_typo(job_id: uuid.UUID, task_id: str) -> None:
        assert lifecycle.adopt_upstream_id(w.rt, job_id, "typo-" + task_id, source="operator")

    job_id, task_id, action = late_create(w, operator_typo, RUNS)
    assert action == "lost"
    assert w.sim.state_of(task_id) != "canceled"
    [(kind, detail)] = anomalies(w, job_id)
    assert kind == "task_id_conflict"
    assert (detail["row_task_id"], detail["answered_task_id"]) == ("typo-" + task_id, task_id)
    assert w.job(job_id).provider_task_id == "typo-" + task_id  # the operator's call stands


def test_late_answer_for_a_job_resolved_not_submitted_cancels_upstream(world: World) -> None:
    """The row is terminal with no task id (resolved as not submitted, refunded): only then is
    the late task cancelled upstream, with an ``accepted_after_terminal`` anomaly."""
    w = world

    def operator_not_submitted(job_id: uuid.UUID, task_id: str) -> None:
        w.tick()  # expired claim → uncertain (a live claim is never resolved by an operator)
        assert lifecycle.resolve_not_submitted(w.rt, job_id)

    job_id, task_id, action = late_create(w, operator_not_submitted, RUNS)
    assert action == "lost"
    assert w.sim.state_of(task_id) == "canceled"
    assert [kind for kind, _ in anomalies(w, job_id)] == ["accepted_after_terminal"]
    job = w.job(job_id)
    assert (job.status, job.provider_task_id, job.credits_actual) == ("failed", None, 0)
    assert w.audit() == []
