"""Database round trips per job (issue 16): transactions and statements per lifecycle step.

One kie-standard happy-path job runs in-process on PostgreSQL (``submit_job`` → ``create_step``
→ ``poll_step`` …, the code a Celery task calls) against the simulator on a stepped clock, with
:class:`reconcile.testing.counting.Counting` (the counter of bench figure 5) on the engine.
Transactions are asserted exactly; statements exactly where they are the library's own (jobs,
assets, outbox) and with an upper bound where the ledger adds its own (``reserve``, ``commit``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session, sessionmaker

from reconcile import Runtime, lifecycle
from reconcile.db.contract import usage_log_ids_assigned
from reconcile.db.models import Job, JobEvent
from reconcile.errors import ProviderError
from reconcile.lifecycle import poll
from reconcile.providers import PollResult, PollStatus
from reconcile.storage import LocalStorage
from reconcile.testing.counting import Counting
from reconcile.testing.simulator import Script, Simulator
from tests.integration.harness import balance, fund

CREDITS = 40
RUNNING_POLLS = 3
# outside the polls: submit 2 (the job and its event: one statement; the ledger's reserve
# call), create 2 (claim; the id save and its event: one statement), finalize 2 (the storing
# mark with the turn's lease, one statement; and the completion's CAS, the ledger's commit
# call, the assets and the event: one statement, reconcile.lifecycle.completion)
STATEMENTS_OUTSIDE_POLLS_MAX = 6
# the ledger's statements: its tables, and its functions (reconcile_ledger_reserve, …)
LEDGER_TABLES = ("usage_logs", "reconcile_credit_", "reconcile_ledger_")


@dataclass
class World:
    rt: Runtime
    sim: Simulator
    clock: list[float]
    counting: Counting
    db: sessionmaker[Session]
    creates: list[uuid.UUID] = field(default_factory=list)
    polls: list[tuple[int, int]] = field(default_factory=list)


@pytest.fixture
def world(db: sessionmaker[Session], pg_engine: Engine, tmp_path: Path) -> Iterator[World]:
    clock = [0.0]
    with Simulator(clock=lambda: clock[0]) as sim:
        # the chain's turns are what these counts step (batch mode's: test_batch_poll)
        rt = Runtime(settings=sim.settings(webhook_base_url="https://platform.example/hooks",
                                           poll_mode="chain"),
                     sessions=db, storage=LocalStorage(tmp_path / "media"))
        # once per engine, at start-up in a process (Runtime.from_settings' table check): what
        # the database assigns on usage_logs.id is read before the per-job counts begin
        with pg_engine.connect() as conn:
            usage_log_ids_assigned(conn)
        with Counting(pg_engine, sample_width=100_000) as counting:
            w = World(rt, sim, clock, counting, db)
            rt.enqueue_create = lambda job_id, countdown=0.0: w.creates.append(job_id)
            rt.enqueue_poll = lambda job_id, g, s, countdown: w.polls.append((g, s))
            yield w


def _run_job(w: World, kind: str = "kie-standard", model: str = "m") -> tuple[uuid.UUID, list[str]]:
    """Submit, create, three in-flight polls and the final poll, each counted under its name."""
    user, job_id = uuid.uuid4(), uuid.uuid4()
    fund(w.db, user)
    w.sim.script(str(job_id), Script(timeline=((0.0, "queued"), (1.0, "running"),
                                               (10.0, "succeeded")), outputs=1))
    with w.counting.step_named("submit"):
        lifecycle.submit_job(w.rt, user, kind, model, {"prompt": "a cat"}, CREDITS,
                             job_type="image", job_id=job_id)
    w.clock[0] = 0.0
    with w.counting.step_named("create"):
        assert lifecycle.create_step(w.rt, w.creates.pop()).action == "accepted"
    polls = []
    for i, at in enumerate([2.0 + 2.0 * n for n in range(RUNNING_POLLS)] + [11.0]):
        w.clock[0] = at
        generation, seq = w.polls.pop()
        name = f"poll{i + 1}"
        with w.counting.step_named(name):
            outcome = lifecycle.poll_step(w.rt, job_id, generation, seq)
        assert outcome == ("completed" if i == RUNNING_POLLS else "in_flight"), (name, outcome)
        polls.append(name)
    return job_id, polls


def _texts(w: World, *steps: str) -> list[str]:
    return [t for step in steps for t in w.counting.texts(step)]


def _own(texts: list[str]) -> list[str]:
    """The library's own statements (not the ledger's, nor its savepoints)."""
    return [t for t in texts if "SAVEPOINT" not in t and not any(x in t for x in LEDGER_TABLES)]


def _job(w: World, job_id: uuid.UUID) -> Job:
    with w.db() as s:
        job = s.get(Job, job_id)
        assert job is not None
        return job


@pytest.mark.parametrize("amount", [None, 25], ids=["all_reserved", "pricing_hook"])
def test_happy_path_round_trips_without_a_publisher(world: World, amount: int | None) -> None:
    """Five transactions outside the polls (submit, claim, save id, the storing mark,
    finalize), one transaction and one statement per in-flight poll; the outbox rows are written published and never read
    or updated after the commit."""
    if amount is not None:
        world.rt.pricing_hook = lambda job, result: amount
    job_id, polls = _run_job(world)
    c = world.counting
    *running, final = polls

    assert c.of("submit")["transactions"] == 1
    assert c.of("create")["transactions"] == 2  # the claim, the id save
    for name in running:
        assert (c.of(name)["transactions"], c.of(name)["statements"]) == (1, 1), name
        assert c.texts(name)[0].startswith("UPDATE jobs SET poll_seq")  # the turn is the load
    assert c.of(final)["transactions"] == 3  # the turn, the storing mark, finalize
    assert c.texts(final)[1].startswith("UPDATE jobs SET poll_lease_expires_at") \
        and "storing_count=" in c.texts(final)[1], c.texts(final)
    outside_txns = (c.of("submit")["transactions"] + c.of("create")["transactions"]
                    + c.of(final)["transactions"] - 1)
    assert outside_txns == 5

    outside = (c.of("submit")["statements"] + c.of("create")["statements"]
               + c.of(final)["statements"] - 1)
    assert outside == STATEMENTS_OUTSIDE_POLLS_MAX
    assert c.of(final)["statements"] == 3  # the turn, the mark, the completion: ONE statement
    completion = c.texts(final)[2]
    assert completion.startswith("WITH j AS"), completion
    for part in ("FOR UPDATE", "JOIN LATERAL reconcile_ledger_commit(", "UPDATE jobs SET",
                 "INSERT INTO reconcile_assets", "INSERT INTO reconcile_job_events"):
        assert part in completion, (part, completion)
    ledger = [t for t in _texts(world, "submit", final) if "reconcile_ledger_" in t]
    assert [t.split("(")[0] for t in ledger] == [  # one round trip per ledger operation
        "SELECT * FROM reconcile_ledger_reserve", "WITH j AS "], ledger
    # the library's own: INSERT job + event (one statement); claim, save + event (one)
    own = _own(_texts(world, "submit", "create"))
    assert len(own) == 3, own
    assert own[0].startswith("WITH job AS (INSERT INTO jobs"), own[0]
    assert own[2].startswith("WITH saved AS (UPDATE jobs SET"), own[2]
    assert all("INSERT INTO reconcile_job_events" in own[i] for i in (0, 2)), own
    assert not any(t.startswith("SELECT jobs") for t in own), own  # no job row is re-read
    events = [t for t in _texts(world, "submit", "create", *polls) if "reconcile_job_events" in t]
    assert len(events) == 3, events
    assert events[:2] == [own[0], own[2]], events
    assert events[2] == completion

    job = _job(world, job_id)
    expected = CREDITS if amount is None else amount
    assert (job.status, job.credits_actual, job.display_cost) == ("completed", expected, expected)
    with world.db() as s:
        rows = list(s.execute(select(JobEvent).where(JobEvent.job_id == job_id)
                              .order_by(JobEvent.id)).scalars())
    assert [e.type for e in rows] == ["queued", "running", "completed"]
    assert all(e.published_at is not None for e in rows)
    assert rows[-1].payload["credits_actual"] == expected
    assert balance(world.db, job.user_id) == (1000 - expected, 0)


def test_with_an_event_hook_each_step_publishes_after_commit_in_one_update(world: World) -> None:
    """A publisher configured: each step hands its events over after its commit (the row is
    committed and still unpublished when the hook sees it) and marks them in ONE UPDATE; no
    step reads the outbox back."""
    seen: list[tuple[str, bool, bool]] = []

    def hook(message: dict[str, Any]) -> None:
        with world.counting.step_named("hook"), world.db() as s:  # another connection
            row = s.execute(select(JobEvent).where(
                JobEvent.event_id == message["event_id"])).scalar_one_or_none()
        seen.append((message["type"], row is not None, row is not None and row.published_at is None))

    world.rt.event_hooks.append(hook)
    job_id, polls = _run_job(world)
    c = world.counting
    *running, final = polls

    assert seen == [("queued", True, True), ("running", True, True), ("completed", True, True)]
    for step, txns in (("submit", 2), ("create", 3), (final, 4)):
        marks = [t for t in c.texts(step) if t.startswith("UPDATE reconcile_job_events")]
        reads = [t for t in c.texts(step) if t.startswith("SELECT reconcile_job_events")]
        assert (len(marks), reads) == (1, []), (step, c.texts(step))
        assert c.of(step)["transactions"] == txns, step
    for name in running:
        assert (c.of(name)["transactions"], c.of(name)["statements"]) == (1, 1), name
    with world.db() as s:
        rows = list(s.execute(select(JobEvent).where(JobEvent.job_id == job_id)).scalars())
    assert len(rows) == 3 and all(e.published_at is not None for e in rows)


def test_a_publisher_that_fails_leaves_the_event_for_the_sweep(world: World) -> None:
    """A hook that raises: nothing is marked (no UPDATE at all), the row stays unpublished."""
    def down(message: dict[str, Any]) -> None:
        raise ConnectionError("publisher down")

    world.rt.event_hooks.append(down)
    user = uuid.uuid4()
    fund(world.db, user)
    with world.counting.step_named("submit"):
        submitted = lifecycle.submit_job(world.rt, user, "kie-standard", "m", {"prompt": "x"},
                                         CREDITS, job_type="image")
    assert not [t for t in world.counting.texts("submit") if t.startswith("UPDATE reconcile_job")]
    with world.db() as s:
        row = s.execute(select(JobEvent).where(JobEvent.job_id == submitted.job_id)).scalar_one()
    assert row.published_at is None


def _patched_reads(mp: pytest.MonkeyPatch, answers: list[PollResult | ProviderError]) -> None:
    def read_status(rt: Runtime, job: Job, kind: Any) -> PollResult | ProviderError:
        return answers.pop(0)
    mp.setattr(poll, "read_status", read_status)  # _observe looks it up in its own module


def test_in_flight_polls_write_only_what_is_new(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """Progress and the last error are written when they change, else the poll is its turn."""
    user, job_id = uuid.uuid4(), uuid.uuid4()
    fund(world.db, user)
    world.sim.script(str(job_id), Script(timeline=((0.0, "running"),)))
    lifecycle.submit_job(world.rt, user, "kie-standard", "m", {"prompt": "x"}, CREDITS,
                         job_type="image", job_id=job_id)
    assert lifecycle.create_step(world.rt, world.creates.pop()).action == "accepted"
    _patched_reads(monkeypatch, [
        PollResult(PollStatus.RUNNING, progress=40), PollResult(PollStatus.RUNNING, progress=40),
        PollResult(PollStatus.RUNNING, progress=30),  # never backwards
        ProviderError("read timed out"), ProviderError("read timed out"),
        PollResult(PollStatus.RUNNING, progress=55),
    ])
    expected = [2, 1, 1, 2, 1, 2]  # transactions: the turn (+ one write when something is new)
    got = []
    for i, _ in enumerate(expected):
        generation, seq = world.polls.pop()
        with world.counting.step_named(f"p{i}"):
            assert lifecycle.poll_step(world.rt, job_id, generation, seq) == "in_flight"
        got.append(world.counting.of(f"p{i}")["transactions"])
        assert world.counting.of(f"p{i}")["statements"] == got[-1]
    assert got == expected
    job = _job(world, job_id)
    assert job.progress == 55 and job.reconcile_last_error == "read failed: read timed out"


@pytest.mark.parametrize("kind,model,age", [
    ("kie-standard", "m", timedelta(0)),
    ("kie-standard", "m", timedelta(minutes=3)),  # past KIE's backoff step: 15 s interval
    ("replicate-prediction", "o/m:v", timedelta(seconds=30)),
    ("fal-queue", "fal-ai/flux/dev", timedelta(minutes=5)),
])
def test_the_turn_sets_the_kinds_lease_for_the_jobs_age(world: World, kind: str, model: str,
                                                        age: timedelta) -> None:
    """The lease the one-statement turn picks in SQL is ``poll_lease(kind, age)``."""
    user, job_id = uuid.uuid4(), uuid.uuid4()
    fund(world.db, user)
    world.sim.script(str(job_id), Script(timeline=((0.0, "running"),)))
    lifecycle.submit_job(world.rt, user, kind, model, {"prompt": "x"}, CREDITS, job_type="image",
                         job_id=job_id)
    assert lifecycle.create_step(world.rt, world.creates.pop()).action == "accepted"
    now = world.rt.now()
    with world.db.begin() as s:
        s.execute(update(Job).where(Job.id == job_id).values(provider_call_started_at=now - age))
    generation, seq = world.polls.pop()
    world.rt.clock = lambda: now
    assert lifecycle.poll_step(world.rt, job_id, generation, seq) == "in_flight"
    kind_ = world.rt.kind(kind)
    assert kind_ is not None
    assert _job(world, job_id).poll_lease_expires_at == now + lifecycle.poll_lease(world.rt, kind_, age)


def test_a_lost_turn_still_says_fenced_or_lost(world: World) -> None:
    """Only a lost turn reads the row: a stale sequence is ``fenced``, an unknown job ``lost``."""
    user, job_id = uuid.uuid4(), uuid.uuid4()
    fund(world.db, user)
    world.sim.script(str(job_id), Script(timeline=((0.0, "running"),)))
    lifecycle.submit_job(world.rt, user, "kie-standard", "m", {"prompt": "x"}, CREDITS,
                         job_type="image", job_id=job_id)
    assert lifecycle.create_step(world.rt, world.creates.pop()).action == "accepted"
    generation, seq = world.polls.pop()
    assert lifecycle.poll_step(world.rt, job_id, generation, seq) == "in_flight"
    assert lifecycle.poll_step(world.rt, job_id, generation, seq) == "fenced"  # a duplicate
    assert lifecycle.poll_step(world.rt, uuid.uuid4(), 1, 0) == "lost"
    with world.db.begin() as s:  # a kind this process does not know
        s.execute(update(Job).where(Job.id == job_id).values(provider_kind="gone-kind"))
    assert lifecycle.poll_step(world.rt, job_id, generation, seq + 1) == "lost"
    assert _job(world, job_id).poll_seq == seq + 1  # the unknown kind's turn was not taken


BATCH_JOBS = 8


def test_batch_mode_round_trips(db: sessionmaker[Session], pg_engine: Engine,
                                tmp_path: Path) -> None:
    """Batch mode (the default), ``BATCH_JOBS`` kie-standard jobs polled together: a round of
    running reads costs 2 statements in 2 transactions for the whole batch (the claim: ONE
    statement, its locking read a CTE of its update; then one set-based reschedule); the round
    that completes them all costs the claim, ONE statement holding every claim for the round,
    and one statement in one transaction per job (the completion). Submit and create are the chain's (2 + 2 statements,
    1 + 2 transactions)."""
    from reconcile.jobstore import make_due_at
    from reconcile.lifecycle import batch as batch_poll

    clock = [0.0]
    with Simulator(clock=lambda: clock[0]) as sim, Counting(pg_engine, sample_width=200) as c:
        rt = Runtime(settings=sim.settings(webhook_base_url="https://platform.example/hooks",
                                           poll_mode="batch"),
                     sessions=db, storage=LocalStorage(tmp_path / "media"))
        with pg_engine.connect() as conn:
            usage_log_ids_assigned(conn)
        creates: list[uuid.UUID] = []
        rt.enqueue_create = lambda job_id, countdown=0.0: creates.append(job_id)
        ids = []
        for _ in range(BATCH_JOBS):
            user, job_id = uuid.uuid4(), uuid.uuid4()
            fund(db, user)
            sim.script(str(job_id), Script(timeline=((0.0, "queued"), (1.0, "running"),
                                                     (10.0, "succeeded")), outputs=1))
            with c.step_named("submit"):
                lifecycle.submit_job(rt, user, "kie-standard", "m", {"prompt": "a cat"},
                                     CREDITS, job_type="image", job_id=job_id)
            with c.step_named("create"):
                assert lifecycle.create_step(rt, creates.pop()).action == "accepted"
            ids.append(job_id)
        assert c.of("submit")["statements"] == 2 * BATCH_JOBS
        assert c.of("create")["statements"] == 2 * BATCH_JOBS
        for n, at in enumerate([2.0, 4.0, 6.0, 11.0]):
            clock[0] = at
            with db.begin() as s:  # every row due now
                for job_id in ids:
                    make_due_at(s, job_id, rt.now() - timedelta(seconds=1))
            with c.step_named(f"round{n}"):
                report = batch_poll.poll_due(rt, budget=60)
            got = (c.of(f"round{n}")["statements"], c.of(f"round{n}")["transactions"])
            if at < 10.0:
                assert report.outcomes == {"in_flight": BATCH_JOBS}, report.line()
                assert got == (2, 2), (n, got, c.texts(f"round{n}"))
                assert c.texts(f"round{n}")[0].startswith("WITH locked AS MATERIALIZED")
                assert "FROM unnest(" in c.texts(f"round{n}")[1]
            else:
                assert report.outcomes == {"completed": BATCH_JOBS}, report.line()
                assert got == (2 + BATCH_JOBS, 2 + BATCH_JOBS), (got, c.texts("round3"))
                texts = c.texts("round3")
                # the grouped hold: each completion's storing hold (claimed_by cleared) in it
                assert texts[1].startswith("UPDATE jobs SET poll_lease_expires_at=v.until") \
                    and "v.storing" in texts[1] and "coalesce(v.status" in texts[1], texts[1]
                assert [t.startswith("WITH j AS") for t in texts[2:]] == [True] * BATCH_JOBS
    with db() as s:
        assert set(s.scalars(select(Job.status).where(Job.id.in_(ids)))) == {"completed"}
