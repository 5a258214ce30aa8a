"""Issue 18: a submit that survives its broker, and an idempotent submit (real PostgreSQL).

* a broker that is down after the job and reservation commit: 202 with the job id, the failure
  logged, and the sweep's not-started row enqueues the create later;
* ``idempotency_key``: same key + same request → the original answer (one job, one
  reservation), also for concurrent duplicates in separate sessions; same key + another
  request → 409 IDEMPOTENCY_KEY_REUSED; keys are forgotten after the retention period.
"""

from __future__ import annotations

import logging
import threading
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from reconcile import Runtime, api, idempotency
from reconcile.db.models import CreditTransaction, IdempotencyKey, Job
from reconcile.states import NOT_STARTED_AGE
from reconcile.sweep import sweep
from reconcile.testing.processes import celery_sender, enqueuers, free_port
from reconcile.testing.simulator import Script, Simulator
from tests.integration.harness import Clock, Queues, clocked_runtime, fund
from tests.integration.test_api import KIE, KIE_MODEL, T0, TEXT, as_json, balance

PROMPT = {"prompt": "a cat"}


@pytest.fixture
def env(db: sessionmaker[Session], simulator: Simulator,
        tmp_path: Path) -> tuple[Runtime, Queues, Clock]:
    return clocked_runtime(db, simulator, tmp_path, T0)


def submit(rt: Runtime, user: uuid.UUID, key: str | None, *, input: Any = PROMPT,
           credits_: int = 40, inline: bool = False) -> tuple[int, Any]:
    return as_json(api.submit(rt, user, KIE, KIE_MODEL, input, credits_, job_type="image",
                              inline=inline, idempotency_key=key))


def counts(db: sessionmaker[Session], user: uuid.UUID) -> tuple[int, int]:
    """(jobs, reservations) of ``user``."""
    with db() as s:
        jobs = s.execute(select(func.count()).select_from(Job)
                         .where(Job.user_id == user)).scalar_one()
        reserves = s.execute(select(func.count()).select_from(CreditTransaction).where(
            CreditTransaction.user_id == user, CreditTransaction.type == "USAGE")).scalar_one()
    return int(jobs), int(reserves)


# ----------------------------------------------------------------------------- broker down


def test_submit_with_the_broker_down_answers_202_and_the_sweep_enqueues_it(
        env, db, caplog: pytest.LogCaptureFixture) -> None:
    """The enqueue publishes to a Redis port nobody listens on: still 202 with the job id
    (a client that retried a 500 would create and pay a second job); the failure is logged;
    once the job is NOT_STARTED_AGE old the sweep enqueues its create."""
    rt, queues, clock = env
    user = uuid.uuid4()
    fund(db, user)
    dead = celery_sender(f"redis://127.0.0.1:{free_port()}/0")
    dead.conf.broker_connection_timeout = 1
    rt.enqueue_create, _ = enqueuers(dead)
    with caplog.at_level(logging.ERROR, logger="reconcile.lifecycle"):
        status, body = as_json(api.submit(rt, user, KIE, KIE_MODEL, PROMPT, 40, job_type="image"))
    assert (status, body) == (202, {"job_id": TEXT, "state": "queued"})
    assert any("create_enqueue_failed" in r.getMessage() and body["job_id"] in r.getMessage()
               for r in caplog.records)
    assert counts(db, user) == (1, 1) and balance(db, user) == 960
    rt.enqueue_create = queues.enqueue_create  # the broker is back
    clock.advance(seconds=NOT_STARTED_AGE.total_seconds() - 1)
    sweep(rt)
    assert list(queues.creates) == []  # too young: a create message may still be on its way
    clock.advance(seconds=2)
    sweep(rt)
    assert [str(j) for j in queues.creates] == [body["job_id"]]


# ----------------------------------------------------------------------------- idempotency


def test_same_key_same_request_replays_the_original_job(env, db) -> None:
    rt, queues, _ = env
    user = uuid.uuid4()
    fund(db, user)
    first = submit(rt, user, "order-1")
    again = submit(rt, user, "order-1")
    assert first == again and first[0] == 202
    assert counts(db, user) == (1, 1) and balance(db, user) == 960
    assert len(queues.creates) == 1  # the replay enqueues nothing either


def test_same_key_another_request_is_409(env, db) -> None:
    rt, _, _ = env
    user = uuid.uuid4()
    fund(db, user)
    status, body = submit(rt, user, "order-1")
    assert status == 202
    for changed in ({"input": {"prompt": "a dog"}}, {"credits_": 41}):
        assert submit(rt, user, "order-1", **changed) == (409, {"error": {
            "type": "conflict_error", "code": "IDEMPOTENCY_KEY_REUSED", "message": TEXT,
            "job_id": None}})
    assert counts(db, user) == (1, 1) and balance(db, user) == 960


def test_keys_are_per_user_and_optional(env, db) -> None:
    rt, _, _ = env
    alice, bob = uuid.uuid4(), uuid.uuid4()
    fund(db, alice)
    fund(db, bob)
    a, b = submit(rt, alice, "k"), submit(rt, bob, "k")
    assert a[1]["job_id"] != b[1]["job_id"]
    assert submit(rt, alice, None)[1]["job_id"] != submit(rt, alice, None)[1]["job_id"]
    assert counts(db, alice) == (3, 3) and counts(db, bob) == (1, 1)


def test_a_key_that_is_too_long_is_400(env, db) -> None:
    rt, _, _ = env
    user = uuid.uuid4()
    fund(db, user)
    status, body = submit(rt, user, "x" * 256)
    assert status == 400 and body["error"]["param"] == "idempotency_key"
    assert counts(db, user) == (0, 0)


def test_an_inline_failure_is_replayed_as_the_same_answer(env, db, simulator) -> None:
    """The original answer, not a fresh one: a rejected inline create replays its 502 (and the
    provider is not asked again)."""
    rt, _, _ = env
    user = uuid.uuid4()
    fund(db, user)
    simulator.script_model(KIE_MODEL, Script(create="reject_invalid"))
    first = submit(rt, user, "order-9", inline=True)
    assert first[0] == 502 and first[1]["error"]["code"] == "UPSTREAM_SUBMISSION_FAILED"
    assert submit(rt, user, "order-9", inline=True) == first
    assert simulator.attempts(first[1]["error"]["job_id"]) == 1
    assert counts(db, user) == (1, 1)


def test_keys_are_forgotten_after_the_retention_period(env, db) -> None:
    rt, _, clock = env
    user = uuid.uuid4()
    fund(db, user)
    first = submit(rt, user, "order-1")
    clock.advance(seconds=(idempotency.RETENTION - timedelta(seconds=1)).total_seconds())
    assert submit(rt, user, "order-1") == first
    clock.advance(seconds=2)
    second = submit(rt, user, "order-1", input={"prompt": "another day"})
    assert second[0] == 202 and second[1]["job_id"] != first[1]["job_id"]
    # the sweep purges expired keys of everyone else
    other = uuid.uuid4()
    fund(db, other)
    submit(rt, other, "old")
    clock.advance(seconds=idempotency.RETENTION.total_seconds() + 1)
    sweep(rt)
    with db() as s:
        assert s.execute(select(func.count()).select_from(IdempotencyKey)).scalar_one() == 0


def test_concurrent_duplicates_make_one_job_and_one_reservation(env, db) -> None:
    """Eight threads, each its own session and connection, submit the same key at once: the
    primary key serialises them; one job, one reservation, every answer names that job."""
    rt, _, _ = env
    user = uuid.uuid4()
    fund(db, user)
    barrier = threading.Barrier(8)
    answers: list[tuple[int, Any]] = []
    lock = threading.Lock()

    def client() -> None:
        barrier.wait()
        answer = submit(rt, user, "double-click")
        with lock:
            answers.append(answer)

    threads = [threading.Thread(target=client) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(answers) == 8
    assert {status for status, _ in answers} == {202}
    assert len({body["job_id"] for _, body in answers}) == 1
    assert counts(db, user) == (1, 1) and balance(db, user) == 960
