"""Issue 24 finding 1: once a submit has committed the job and its reservation, every answer
names the job (real PostgreSQL).

An inline submit whose create the provider accepted, then a database blip while the task id is
saved, the broker down at the first poll's enqueue, or a raising hook: the answer used to be
``500 INTERNAL`` without a ``job_id``, and the client's retry created and paid a second job.
Now it is 202 with the job id, or 502 ``UPSTREAM_SUBMISSION_UNCERTAIN`` with it (README: The
gateway; an unknown outcome is never retried blindly), and a retry with the same
idempotency key makes no second job, reservation or upstream create.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from reconcile import Runtime, api, jobstore
from reconcile.sweep import sweep
from reconcile.testing.processes import celery_sender, enqueuers, free_port
from reconcile.testing.simulator import Script, Simulator
from tests.integration.harness import Clock, Queues, clocked_runtime, fund
from tests.integration.test_api import KIE, KIE_MODEL, RUNNING, T0, TEXT, as_json, balance, load
from tests.integration.test_submit_idempotency import counts

UNCERTAIN = {"error": {
    "type": "upstream_error", "code": "UPSTREAM_SUBMISSION_UNCERTAIN",
    "message": "Upstream submission outcome is unknown. Do not resubmit; check the job.",
    "job_id": TEXT}}


@pytest.fixture
def env(db: sessionmaker[Session], simulator: Simulator,
        tmp_path: Path) -> tuple[Runtime, Queues, Clock]:
    simulator.script_default(Script(timeline=RUNNING))
    return clocked_runtime(db, simulator, tmp_path, T0)


def submit(rt: Runtime, user: uuid.UUID, key: str | None = "order-1") -> tuple[int, Any]:
    return as_json(api.submit(rt, user, KIE, KIE_MODEL, {"prompt": "a cat"}, 40,
                              job_type="image", inline=True, idempotency_key=key))


def _job_id(body: dict[str, Any]) -> str:
    return body["job_id"] if "job_id" in body else body["error"]["job_id"]


def _blip(*_: Any) -> None:
    raise OperationalError("COMMIT", {}, Exception("server closed the connection unexpectedly"))


@pytest.mark.parametrize("saved", [False, True], ids=["statement_lost", "answer_lost"])
def test_a_database_blip_saving_the_task_id_answers_with_the_job_id(
        env, db, simulator, monkeypatch: pytest.MonkeyPatch, saved: bool) -> None:
    """The provider accepted the create; the connection fails as its task id is saved. The save
    is one statement that commits itself, so either it never ran — the row still holds the
    create's claim with no id (the claim expires into ``uncertain``): 502 UNCERTAIN naming the
    job — or it ran and only its answer was lost — the row holds the id: 202 with the job id.
    Either way the same key's retry answers it again: one job, one charge, one create."""
    rt, queues, _ = env
    user = uuid.uuid4()
    fund(db, user)
    real = jobstore.save_task_id

    def save_then_blip(session: Session, *args: Any, **kwargs: Any) -> Any:
        if saved:
            real(session, *args, **kwargs)
        _blip()

    monkeypatch.setattr(jobstore, "save_task_id", save_then_blip)
    status, body = submit(rt, user)
    job_id = _job_id(body)
    job = load(db, job_id)
    if saved:
        assert (status, body) == (202, {"job_id": TEXT, "state": "queued"})
        assert (job.status, job.submission_state) == ("processing", "accepted")
        assert job.provider_task_id
    else:
        assert (status, body) == (502, UNCERTAIN)
        assert (job.status, job.submission_state, job.provider_task_id) == \
            ("pending", "submitting", None)
    assert simulator.creates(job_id) == 1 and not queues.polls

    monkeypatch.setattr(jobstore, "save_task_id", real)  # the database is back
    assert submit(rt, user) == (status, body)
    assert counts(db, user) == (1, 1) and balance(db, user) == 960
    assert simulator.creates(job_id) == 1


def test_the_broker_down_at_the_first_poll_answers_202_with_the_job_id(env, db, simulator) -> None:
    """The task id is saved, the first poll cannot be published (kombu's OperationalError from a
    Redis port nobody listens on): 202 with the job id; the sweep resumes the chain once the
    poll lease has expired; the same key's retry is the same answer, one create upstream."""
    rt, queues, clock = env
    user = uuid.uuid4()
    fund(db, user)
    dead = celery_sender(f"redis://127.0.0.1:{free_port()}/0")
    dead.conf.broker_connection_timeout = 1
    _, rt.enqueue_poll = enqueuers(dead)
    status, body = submit(rt, user)
    assert (status, body) == (202, {"job_id": TEXT, "state": "queued"})
    job_id = body["job_id"]
    job = load(db, job_id)
    assert (job.status, job.submission_state) == ("processing", "accepted")
    assert job.provider_task_id and job.poll_lease_expires_at is not None

    rt.enqueue_poll = queues.enqueue_poll  # the broker is back
    assert submit(rt, user) == (status, body)
    assert counts(db, user) == (1, 1) and balance(db, user) == 960
    assert simulator.creates(job_id) == 1
    clock.now = job.poll_lease_expires_at
    clock.advance(seconds=1)
    sweep(rt)
    assert [str(p[0]) for p in queues.polls] == [job_id]


@pytest.mark.parametrize("point, expected", [
    ("before_claim", (202, {"job_id": TEXT, "state": "queued"})),  # nothing sent
    ("after_accept", (502, UNCERTAIN)),  # accepted upstream, no id saved
    ("after_id_saved", (202, {"job_id": TEXT, "state": "queued"})),
])
def test_a_hook_raising_after_the_commit_answers_with_the_job_id(
        env, db, simulator, point: str, expected: tuple[int, Any]) -> None:
    """A hook of the create step raises: the answer says what the row says, with its id."""
    rt, queues, _ = env
    user = uuid.uuid4()
    fund(db, user)

    def hook(name: str) -> None:
        if name == point:
            raise RuntimeError(f"hook raised at {name}")

    rt.crash_hook = hook
    answer = submit(rt, user, key=None)
    assert answer == expected
    job_id = _job_id(answer[1])
    assert counts(db, user) == (1, 1) and balance(db, user) == 960
    assert simulator.creates(job_id) == (0 if point == "before_claim" else 1)
    if point == "before_claim":  # never claimed: its create is enqueued (else the sweep's)
        assert [str(j) for j in queues.creates] == [job_id]
        assert load(db, job_id).submission_state == "not_started"


def test_a_failed_event_publish_after_the_commit_still_answers_202(
        env, db, monkeypatch: pytest.MonkeyPatch) -> None:
    """Publishing the ``queued`` event after the commit fails (the outbox row stays unpublished
    for the sweep): the queued submit still answers 202 with the job id."""
    rt, queues, _ = env
    user = uuid.uuid4()
    fund(db, user)
    monkeypatch.setattr("reconcile.lifecycle.submit.publish_events", _blip)
    status, body = as_json(api.submit(rt, user, KIE, KIE_MODEL, {"prompt": "a cat"}, 40,
                                      job_type="image"))
    assert (status, body) == (202, {"job_id": TEXT, "state": "queued"})
    assert [str(j) for j in queues.creates] == [body["job_id"]]
    assert counts(db, user) == (1, 1) and balance(db, user) == 960
