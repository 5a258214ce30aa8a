"""The peers benchmark's minimal ledger (``bench/peers/ledger.py``), which plain Celery and DBOS
settle with: reserve at submit, commit at completion, refund at failure, each at most once, and
its check finds what does not balance. If it were wrong, the benchmark would compare
``reconcile`` with peers that lose or double-count money."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from bench.peers import ledger


@pytest.fixture(scope="module")
def engine(pg_databases: Any) -> Iterator[Any]:
    engine = create_engine(pg_databases.create("peersledger"))
    with engine.begin() as conn:
        ledger.create_schema(conn)
    yield engine
    engine.dispose()


@pytest.fixture
def user(engine: Any) -> uuid.UUID:
    user_id = uuid.uuid4()
    with engine.begin() as conn:
        ledger.grant(conn, [user_id], 100)
    return user_id


def _balance(engine: Any, user_id: uuid.UUID) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT credits FROM peer_balances WHERE user_id = :u"),
                                {"u": user_id}).scalar_one())


def _entries(engine: Any, job_id: uuid.UUID) -> dict[str, int]:
    with engine.connect() as conn:
        return {r[0]: int(r[1]) for r in conn.execute(text(
            "SELECT kind, amount FROM peer_ledger WHERE job_id = :j"), {"j": job_id})}


def _problems(engine: Any) -> dict[str, int]:
    with engine.connect() as conn:
        return ledger.check(conn)["problems"]


def test_a_submit_reserves_once_and_a_replay_writes_nothing(engine: Any, user: uuid.UUID) -> None:
    job = uuid.uuid4()
    with engine.begin() as conn:
        assert ledger.submit(conn, job, user, 10)
    with engine.begin() as conn:
        assert not ledger.submit(conn, job, user, 10)
    assert _balance(engine, user) == 90
    assert _entries(engine, job) == {"reserve": 10}
    assert _problems(engine) == {}


def test_a_submit_past_the_balance_raises_and_its_transaction_leaves_nothing(
        engine: Any, user: uuid.UUID) -> None:
    job = uuid.uuid4()
    with pytest.raises(ledger.InsufficientCredits), engine.begin() as conn:
        ledger.submit(conn, job, user, 101)
    assert _balance(engine, user) == 100
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM peer_jobs WHERE id = :j"),
                            {"j": job}).scalar_one() == 0


def test_a_completion_commits_once_and_a_later_failure_refunds_nothing(
        engine: Any, user: uuid.UUID) -> None:
    job = uuid.uuid4()
    with engine.begin() as conn:
        ledger.submit(conn, job, user, 10)
        ledger.record_task(conn, job, "task-1")
        ledger.record_task(conn, job, "task-2")  # a second create's id never overwrites
    with engine.begin() as conn:
        assert ledger.complete(conn, job, "/media/out.png")
    with engine.begin() as conn:
        assert not ledger.complete(conn, job, "/media/again.png")
        assert not ledger.fail(conn, job, "late failure")
    with engine.connect() as conn:
        row = conn.execute(text("SELECT status, task_id, result FROM peer_jobs WHERE id = :j"),
                           {"j": job}).one()
    assert tuple(row) == ("completed", "task-1", "/media/out.png")
    assert _entries(engine, job) == {"reserve": 10, "commit": 10}
    assert _balance(engine, user) == 90
    assert _problems(engine) == {}


def test_a_failure_refunds_once_and_a_later_completion_commits_nothing(
        engine: Any, user: uuid.UUID) -> None:
    job = uuid.uuid4()
    with engine.begin() as conn:
        ledger.submit(conn, job, user, 10)
    for _ in range(2):
        with engine.begin() as conn:
            ledger.fail(conn, job, "upstream failed")
    with engine.begin() as conn:
        assert not ledger.complete(conn, job, "/media/out.png")
    assert _entries(engine, job) == {"reserve": 10, "refund": 10}
    assert _balance(engine, user) == 100
    assert _problems(engine) == {}


def test_the_check_finds_a_settled_job_in_flight_and_an_unbalanced_user(
        engine: Any, user: uuid.UUID) -> None:
    job = uuid.uuid4()
    with engine.begin() as conn:
        ledger.submit(conn, job, user, 10)
        conn.execute(text("INSERT INTO peer_ledger (job_id, kind, amount) "
                          "VALUES (:j, 'commit', 10)"), {"j": job})
        conn.execute(text("UPDATE peer_balances SET credits = credits + 5 WHERE user_id = :u"),
                     {"u": user})
    problems = _problems(engine)
    assert problems.get("settled_in_flight") == 1
    assert problems.get("unbalanced_users") == 1
    with engine.begin() as conn:  # leave the module's database balanced for the other tests
        conn.execute(text("DELETE FROM peer_ledger WHERE job_id = :j AND kind = 'commit'"),
                     {"j": job})
        conn.execute(text("UPDATE peer_balances SET credits = credits - 5 WHERE user_id = :u"),
                     {"u": user})
