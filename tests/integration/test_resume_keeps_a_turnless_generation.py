"""Attack on "a resume keeps a turnless generation" (jobstore.start_new_chain's CASE).

A resume of a generation that never took a turn (poll_seq 0) keeps it and re-sends (g, 0);
copies are fenced by the turn's CAS on poll_seq. Each test interleaves a resume (the sweep,
the webhook's resume_chain, the create retry guard) with the chain's own steps, batch claims,
adoption and the embedded SQLite default, and checks: at most one live chain, one completion,
one settlement, no chain left without a message and a sweep path.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from reconcile import jobstore, lifecycle
from reconcile.db.models import CreditTransaction, Job, JobEvent
from reconcile.lifecycle import batch as batch_poll
from reconcile.testing.simulator import Script, Simulator
from tests.integration._sweep_helpers import FOREVER, INSTANT, World

KIND = "kie-standard"
LATER = ((0.0, "queued"), (1.0, "running"), (30.0, "succeeded"))


@pytest.fixture
def world(db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> World:
    return World(db, simulator, tmp_path)


def _completions(w: World, job_id: uuid.UUID) -> int:
    with w.db() as s:
        return s.execute(select(func.count()).select_from(JobEvent).where(
            JobEvent.job_id == job_id, JobEvent.type == "completed")).scalar_one()


def _txns(w: World, job_id: uuid.UUID) -> dict[str, int]:
    with w.db() as s:
        rows = s.execute(select(CreditTransaction.type, func.count()).where(
            CreditTransaction.job_id == job_id).group_by(CreditTransaction.type)).all()
    return {t: n for t, n in rows}


def _run_all(w: World, job_id: uuid.UUID, limit: int = 50) -> list[tuple[tuple[int, int], str]]:
    """Run every queued poll message of ``job_id`` (and what they enqueue) in FIFO order."""
    ran: list[tuple[tuple[int, int], str]] = []
    while w.q.polls and len(ran) < limit:
        jid, g, s = w.q.polls.popleft()
        assert jid == job_id
        ran.append(((g, s), lifecycle.poll_step(w.rt, jid, g, s)))
    return ran


def _lease_past(w: World, job_id: uuid.UUID) -> None:
    lease = w.job(job_id).poll_lease_expires_at
    assert lease is not None
    w.clock.now = max(w.clock.now, lease) + timedelta(seconds=1)


# ------------------------------------------------------------------ 1: the chain vs the sweep

def test_a_resume_during_the_first_steps_read_starts_a_new_generation_and_fences_the_chain(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first turn is taken (seq 1); during its read the lease runs out and the sweep
    resumes: the row is no longer turnless, so a new generation — the step's own next message
    is fenced, exactly one chain goes on."""
    w = world
    job_id = w.accept(KIND, Script(timeline=FOREVER))
    g = w.job(job_id).poll_generation
    def sweep_past_the_lease() -> Any:
        _lease_past(w, job_id)
        return w.tick()

    resumed = _once_during_a_read(w, monkeypatch, sweep_past_the_lease)
    assert lifecycle.poll_step(w.rt, job_id, g, 0) == "in_flight"
    assert [(a.action, a.outcome) for a in resumed()[0].actions] == [("resume", "resumed")]
    assert list(w.q.polls) == [(job_id, g + 1, 0), (job_id, g, 1)]
    ran = [_run_all(w, job_id, limit=1)[0]]
    ran += [_run_all(w, job_id, limit=1)[0]]
    assert ran == [((g + 1, 0), "in_flight"), ((g, 1), "fenced")]
    assert list(w.q.polls) == [(job_id, g + 1, 1)]  # one chain


def test_a_resume_between_two_copies_of_the_first_turn_keeps_one_chain(world: World) -> None:
    """Original (g,0) late, the sweep re-sends (g,0) twice (two lease expiries), then a
    webhook-style resume re-sends it once more: four copies of (g,0); exactly one takes the
    turn and exactly one (g,1) is ever sent."""
    w = world
    job_id = w.accept(KIND, Script(timeline=FOREVER))
    g = w.job(job_id).poll_generation
    w.q.polls.append((job_id, g, 0))  # the late original
    for _ in range(2):
        _lease_past(w, job_id)
        w.tick()
    assert lifecycle.resume_chain(w.rt, job_id)  # the webhook's resume (no lease check)
    assert list(w.q.polls) == [(job_id, g, 0)] * 4
    assert w.job(job_id).poll_generation == g
    ran = _run_all(w, job_id, limit=4)
    assert [o for _, o in ran] == ["in_flight", "fenced", "fenced", "fenced"]
    assert list(w.q.polls) == [(job_id, g, 1)]


def test_a_resume_committed_between_the_steps_turn_and_its_enqueue(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """The step took (g,0) and read; before it enqueues (g,1) the sweep resumes (the lease
    gone): a new generation. The step's (g,1) then loses and the resumed chain alone polls."""
    w = world
    job_id = w.accept(KIND, Script(timeline=FOREVER))
    g = w.job(job_id).poll_generation
    real_enqueue = w.rt.enqueue_poll

    def enqueue(jid: uuid.UUID, gen: int, seq: int, countdown: float) -> None:
        if (gen, seq) == (g, 1):
            _lease_past(w, job_id)
            w.rt.enqueue_poll = real_enqueue
            w.tick()
        real_enqueue(jid, gen, seq, countdown)

    monkeypatch.setattr(w.rt, "enqueue_poll", enqueue)
    assert lifecycle.poll_step(w.rt, job_id, g, 0) == "in_flight"
    assert list(w.q.polls) == [(job_id, g + 1, 0), (job_id, g, 1)]
    ran = _run_all(w, job_id, limit=2)
    assert [o for _, o in ran] == ["in_flight", "fenced"]
    assert list(w.q.polls) == [(job_id, g + 1, 1)]


def _once_during_a_read(w: World, monkeypatch: pytest.MonkeyPatch,
                        action: Callable[[], Any]) -> Callable[[], list[Any]]:
    """The next status read of the kind's client runs ``action`` after the provider answered
    (once). Returns a function giving ``action``'s results so far and putting the real read
    back."""
    client = w.rt.client(w.rt.kind(KIND))
    real = client.poll
    results: list[Any] = []
    started: list[bool] = []  # set before ``action`` runs: its own reads pass straight through

    def read(task_id: str, model: str | None = None) -> Any:
        result = real(task_id, model=model)
        if not started:
            started.append(True)
            results.append(action())
        return result

    monkeypatch.setattr(client, "poll", read)

    def done() -> list[Any]:
        monkeypatch.setattr(client, "poll", real)
        return results

    return done


def _late_original_during_the_sweeps_read(w: World, monkeypatch: pytest.MonkeyPatch,
                                           job_id: uuid.UUID, g: int) -> Callable[[], list[Any]]:
    """The next sweep tick's read runs the late original first turn (g, 0) in the middle."""
    return _once_during_a_read(w, monkeypatch, lambda: lifecycle.poll_step(w.rt, job_id, g, 0))


def test_the_sweeps_poll_and_resume_row_racing_the_late_first_turn_completes_once(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """Row 10 with the lease gone (poll + resume) on a turnless generation: the sweep keeps
    the generation and reads; during its read the late original (g,0) runs — it is NOT
    fenced now (same generation, seq 0) — and completes. The sweep's own finalize loses; one
    completion, one commit, no refund; the sweep's re-sent (g,0) is fenced by status."""
    w = world
    job_id = w.accept(KIND, Script(timeline=INSTANT))
    g = w.job(job_id).poll_generation
    w.clock.advance(minutes=10)  # past the threshold and the lease
    inner = _late_original_during_the_sweeps_read(w, monkeypatch, job_id, g)
    report = w.tick()
    assert inner() == ["completed"]
    assert [(a.action, a.outcome) for a in report.actions] == [("poll", "lost")]
    assert _completions(w, job_id) == 1
    assert _txns(w, job_id).get("REFUND", 0) == 0 and _txns(w, job_id).get("COMMIT", 0) <= 1
    assert w.job(job_id).status == "completed"
    assert [o for _, o in _run_all(w, job_id)] in ([], ["fenced"])
    assert w.audit() == []


def test_webhook_resume_racing_the_original_and_a_sweep_resume(world: World) -> None:
    """3: a SUCCEEDED webhook's resume_chain, the sweep's resume and the late original, all on
    one turnless generation: one turn, one completion, one commit; nothing left polling."""
    w = world
    job_id = w.accept(KIND, Script(timeline=INSTANT))
    g = w.job(job_id).poll_generation
    w.q.polls.append((job_id, g, 0))  # the original, late
    _lease_past(w, job_id)
    w.tick()  # the sweep re-sends (g,0)
    assert lifecycle.resume_chain(w.rt, job_id)
    assert list(w.q.polls) == [(job_id, g, 0)] * 3
    ran = _run_all(w, job_id)
    assert [o for _, o in ran] == ["completed", "fenced", "fenced"]
    assert _completions(w, job_id) == 1 and _txns(w, job_id).get("REFUND", 0) == 0
    assert w.audit() == []


def test_the_create_retry_guard_keeps_the_generation_only_once_the_lease_is_gone(
        world: World) -> None:
    """A redelivered create message (the retry guard: resume only if the lease expired): before
    the lease ends nothing is sent; after, the first turn is sent again under the same
    generation."""
    w = world
    job_id = w.accept(KIND, Script(timeline=FOREVER))
    g = w.job(job_id).poll_generation
    assert lifecycle.create_step(w.rt, job_id).action == "resumed"
    assert list(w.q.polls) == []
    _lease_past(w, job_id)
    assert lifecycle.create_step(w.rt, job_id).action == "resumed"
    assert list(w.q.polls) == [(job_id, g, 0)] and w.job(job_id).poll_generation == g
    assert [o for _, o in _run_all(w, job_id, limit=1)] == ["in_flight"]


def test_a_dead_chain_that_took_turns_is_always_resumed_and_never_dies(world: World) -> None:
    """Liveness: every message lost, again and again, at every position (first turn, later
    turns): each lease expiry the sweep sends a message that takes a turn."""
    w = world
    job_id = w.accept(KIND, Script(timeline=FOREVER))
    for _ in range(6):
        _lease_past(w, job_id)
        w.tick()
        assert len(w.q.polls) == 1, w.job(job_id)
        jid, g, s = w.q.polls.popleft()
        assert s == 0 and g == w.job(job_id).poll_generation
        assert lifecycle.poll_step(w.rt, jid, g, s) == "in_flight"
        w.lose_messages()  # its next message lost
        assert w.job(job_id).poll_seq == 1


# ------------------------------------------------------------------ 4 / 5: adoption, generation 0

def test_adoption_then_a_resume_keeps_the_adopted_generation(world: World) -> None:
    """4: an uncertain job adopted from evidence (a new generation, (g,0) sent) whose message
    is lost: the sweep's resume re-sends (g,0) — no generation past the adoption's."""
    w = world
    job_id = w.submit(KIND)
    w.sim.script(str(job_id), Script(timeline=FOREVER))
    with w.db.begin() as s:
        s.execute(Job.__table__.update().where(Job.id == job_id).values(
            submission_state="uncertain", status="pending", poll_generation=3, poll_seq=7))
    assert lifecycle.adopt_upstream_id(w.rt, job_id, "task-adopted", source="operator")
    job = w.job(job_id)
    assert (job.poll_generation, job.poll_seq) == (4, 0)
    assert list(w.q.polls) == [(job_id, 4, 0)]
    w.lose_messages()
    _lease_past(w, job_id)
    w.tick()
    assert list(w.q.polls) == [(job_id, 4, 0)]
    assert lifecycle.poll_step(w.rt, job_id, 3, 7) == "fenced"  # the pre-adoption chain
    assert [o for _, o in _run_all(w, job_id, limit=1)] == ["in_flight"]


def test_a_generation_zero_platform_row_becomes_generation_one(world: World) -> None:
    """5: a platform row with a task id and no chain (generation 0, seq 0): its first resume
    is generation 1, never (0, 0)."""
    w = world
    job_id = w.platform_row(provider_kind=KIND, provider_task_id="t-plat",
                            provider_call_started_at=w.clock.now, provider_model="m")
    w.sim.script("t-plat", Script(timeline=FOREVER))
    assert (w.job(job_id).poll_generation, w.job(job_id).poll_seq) == (0, 0)
    w.clock.advance(hours=3)
    w.tick()
    job = w.job(job_id)
    assert job.poll_generation == 1 and job.poll_seq == 0
    assert list(w.q.polls) == [(job_id, 1, 0)]
    assert lifecycle.poll_step(w.rt, job_id, 0, 0) == "fenced"


# ------------------------------------------------------------------ 6: SQLite and PostgreSQL

@pytest.mark.parametrize(("generation", "seq", "want"), [
    (0, 0, 1), (0, 3, 1), (1, 0, 1), (1, 1, 2), (5, 0, 5), (5, 9, 6)])
def test_the_case_update_on_both_databases(pg_and_sqlite: sessionmaker[Session], generation: int,
                                          seq: int, want: int) -> None:
    from datetime import UTC, datetime

    now = datetime(2026, 12, 1, 12, tzinfo=UTC)
    job_id = uuid.uuid4()
    factory = pg_and_sqlite
    with factory.begin() as s:
        s.add(Job(id=job_id, user_id=uuid.uuid4(), job_type="image", status="processing",
                  provider_kind=KIND, provider_task_id="t", poll_generation=generation,
                  poll_seq=seq, poll_due_at=now))
    with factory.begin() as s:
        fresh = jobstore.start_new_chain(s, job_id, now, timedelta(seconds=25))
        assert fresh is not None
        assert (fresh.poll_generation, fresh.poll_seq) == (want, 0)
        assert fresh.poll_due_at is None
    with factory() as s:
        row = s.get(Job, job_id)
        assert row is not None and (row.poll_generation, row.poll_seq) == (want, 0)
    with factory.begin() as s:  # a turn of the kept/new generation, then a resume: new gen
        assert jobstore.take_poll_turn(s, job_id, want, 0, now + timedelta(seconds=25))
        again = jobstore.start_new_chain(s, job_id, now, timedelta(seconds=25))
        assert again is not None and (again.poll_generation, again.poll_seq) == (want + 1, 0)


def test_a_sqlite_world_resumes_a_turnless_chain_once_and_completes(
        simulator: Simulator, tmp_path: Path) -> None:
    from reconcile.db.migrate import upgrade
    from reconcile.db.session import make_engine, make_sessionmaker

    url = f"sqlite:///{tmp_path}/reconcile.db"
    upgrade(url)
    w = World(make_sessionmaker(make_engine(url)), simulator, tmp_path)
    job_id = w.accept(KIND, Script(timeline=INSTANT))
    g = w.job(job_id).poll_generation
    w.q.polls.append((job_id, g, 0))
    _lease_past(w, job_id)
    w.tick()
    assert list(w.q.polls) == [(job_id, g, 0)] * 2
    assert [o for _, o in _run_all(w, job_id)] == ["completed", "fenced"]
    assert _completions(w, job_id) == 1


# ------------------------------------------------------------------ 2: batch mode

@pytest.fixture
def batch(db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> World:
    return World(db, simulator, tmp_path, poll_mode="batch", poll_batch_threads=1)


def test_batch_a_webhook_resume_on_a_turnless_due_row_keeps_it_claimable_once(
        batch: World) -> None:
    """A batch row at (g,0) due later; the webhook's resume makes it due now under the same
    generation. One claim wins ((g,1)); a second claimer gets nothing; a resume during the
    claim (seq 1) is a new generation and fences that claim (hold_claims and the write)."""
    w = batch
    job_id = w.accept(KIND, Script(timeline=FOREVER))
    job = w.job(job_id)
    g = job.poll_generation
    assert job.poll_seq == 0 and job.poll_due_at is not None and job.poll_due_at > w.clock.now
    assert lifecycle.resume_chain(w.rt, job_id)
    job = w.job(job_id)
    assert (job.poll_generation, job.poll_seq, job.poll_due_at) == (g, 0, w.clock.now)
    assert list(w.q.polls) == []
    (c,) = batch_poll.claim(w.rt)
    assert (c.generation, c.seq) == (g, 1)
    assert batch_poll.claim(w.rt) == []
    assert lifecycle.resume_chain(w.rt, job_id)  # during the claim: seq 1, a new generation
    assert w.job(job_id).poll_generation == g + 1
    with w.db.begin() as s:
        assert jobstore.hold_claims(s, [(job_id, c.generation, c.seq)],
                                    w.clock.now + timedelta(minutes=5)) == set()
    report = batch_poll.run_claims(w.rt, [c])
    assert report.fenced == 1
    (c2,) = batch_poll.claim(w.rt)
    assert (c2.generation, c2.seq) == (g + 1, 1)


def _switched_to_batch_with_a_late_first_turn(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path
) -> tuple[World, uuid.UUID, int]:
    """A chain-mode job at (g, 0), its first message late; then batch mode, where a webhook's
    resume keeps g and makes the row due. Returns the batch world, the job and g."""
    chain = World(db, simulator, tmp_path)
    job_id = chain.accept(KIND, Script(timeline=FOREVER))
    g = chain.job(job_id).poll_generation
    w = World(db, simulator, tmp_path, poll_mode="batch", poll_batch_threads=1)
    w.clock.now = chain.clock.now
    assert lifecycle.resume_chain(w.rt, job_id)
    return w, job_id, g


def test_batch_a_chain_message_from_before_the_switch_and_a_turnless_resume(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """chain → batch: a chain row at (g,0) whose first message is late; in batch mode the
    webhook's resume keeps g and makes it due; the batch poller claims it first, so the late
    chain message is refused — one reader, one schedule."""
    w, job_id, g = _switched_to_batch_with_a_late_first_turn(db, simulator, tmp_path)
    assert (w.job(job_id).poll_generation, w.job(job_id).poll_seq) == (g, 0)
    (c,) = batch_poll.claim(w.rt)  # the batch poller claims first
    assert lifecycle.poll_step(w.rt, job_id, g, 0) == "fenced"  # the late chain message
    assert batch_poll.run_claims(w.rt, [c]).outcomes == {"in_flight": 1}
    assert w.job(job_id).poll_seq == 1 and list(w.q.polls) == []


def test_batch_chain_message_first_then_the_batch_poller(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    w, job_id, g = _switched_to_batch_with_a_late_first_turn(db, simulator, tmp_path)
    assert lifecycle.poll_step(w.rt, job_id, g, 0) == "in_flight"  # the late chain message
    job = w.job(job_id)
    assert job.poll_seq == 1 and job.poll_due_at is not None and job.poll_due_at > w.clock.now
    assert batch_poll.claim(w.rt) == []  # rescheduled by the chain step: not due
    assert list(w.q.polls) == []


def test_batch_to_chain_a_turnless_due_row_is_resumed_as_a_chain(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """batch → chain: a batch row never claimed ((g,0), due) is resumed by the chain sweep
    once its lease is past: same generation, due time cleared, (g,0) sent; a batch poller
    still running finds nothing due."""
    b = World(db, simulator, tmp_path, poll_mode="batch", poll_batch_threads=1)
    job_id = b.accept(KIND, Script(timeline=FOREVER))
    g = b.job(job_id).poll_generation
    chain = World(db, simulator, tmp_path)
    chain.clock.now = b.clock.now
    _lease_past(chain, job_id)
    tick = chain.tick()
    assert [(a.action, a.outcome) for a in tick.actions] == [("resume", "resumed")]
    job = chain.job(job_id)
    assert (job.poll_generation, job.poll_seq, job.poll_due_at) == (g, 0, None)
    assert list(chain.q.polls) == [(job_id, g, 0)]
    b.clock.now = chain.clock.now + timedelta(hours=1)
    assert batch_poll.claim(b.rt) == []
    assert [o for _, o in _run_all(chain, job_id, limit=1)] == ["in_flight"]


def test_chain_batch_chain_with_a_turnless_row_ends_with_one_chain(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """chain (g,0) late → batch: the sweep's make_due bumps (g+1,0), due → back to chain before
    any claim: the chain sweep keeps g+1 (turnless), clears the due time and sends (g+1,0). The
    late (g,0) is fenced; one chain."""
    chain = World(db, simulator, tmp_path)
    job_id = chain.accept(KIND, Script(timeline=FOREVER))
    g = chain.job(job_id).poll_generation
    b = World(db, simulator, tmp_path, poll_mode="batch", poll_batch_threads=1)
    b.clock.now = chain.clock.now
    _lease_past(b, job_id)
    assert [(a.action, a.outcome) for a in b.tick().actions] == [("resume", "due")]
    assert (b.job(job_id).poll_generation, b.job(job_id).poll_seq) == (g + 1, 0)
    chain.clock.now = b.clock.now
    _lease_past(chain, job_id)
    assert [(a.action, a.outcome) for a in chain.tick().actions] == [("resume", "resumed")]
    job = chain.job(job_id)
    assert (job.poll_generation, job.poll_seq, job.poll_due_at) == (g + 1, 0, None)
    chain.q.polls.append((job_id, g, 0))  # the first, late message arrives last
    ran = _run_all(chain, job_id, limit=2)
    assert [o for _, o in ran] == ["in_flight", "fenced"]
    assert list(chain.q.polls) == [(job_id, g + 1, 1)]


def test_the_sweeps_poll_and_resume_row_racing_a_late_first_turn_on_a_failed_task(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """As the completion race, upstream failed: exactly one failure and one refund."""
    w = world
    job_id = w.accept(KIND, Script(timeline=((0.0, "queued"), (0.0, "failed"))))
    g = w.job(job_id).poll_generation
    w.clock.advance(minutes=10)
    inner = _late_original_during_the_sweeps_read(w, monkeypatch, job_id, g)
    w.tick()
    assert inner() == ["failed"]
    assert w.job(job_id).status == "failed"
    assert _txns(w, job_id).get("REFUND", 0) == 1 and _txns(w, job_id).get("COMMIT", 0) == 0
    with w.db() as s:
        failed = s.execute(select(func.count()).select_from(JobEvent).where(
            JobEvent.job_id == job_id, JobEvent.type == "failed")).scalar_one()
    assert failed == 1
    assert w.audit() == []


def test_the_sweeps_poll_and_resume_row_and_the_late_first_turn_leave_one_chain(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """Row 10 + resume on a turnless generation, the task still running: during the sweep's
    read the late original takes the turn and sends (g,1); the sweep then sends (g,0) again —
    fenced. One chain goes on."""
    w = world
    job_id = w.accept(KIND, Script(timeline=FOREVER))
    g = w.job(job_id).poll_generation
    w.clock.advance(minutes=10)
    inner = _late_original_during_the_sweeps_read(w, monkeypatch, job_id, g)
    report = w.tick()
    assert inner() == ["in_flight"]
    assert [(a.action, a.outcome) for a in report.actions] == [("poll", "in_flight")]
    assert list(w.q.polls) == [(job_id, g, 1), (job_id, g, 0)]
    assert [o for _, o in _run_all(w, job_id, limit=2)] == ["in_flight", "fenced"]
    assert list(w.q.polls) == [(job_id, g, 2)]
    assert w.job(job_id).reconcile_attempts == 1


def _turnless_row(db: sessionmaker[Session]) -> uuid.UUID:
    """An accepted job at generation 4 whose first turn has not run (seq 0)."""
    job_id = uuid.uuid4()
    with db.begin() as s:
        s.add(Job(id=job_id, user_id=uuid.uuid4(), job_type="image", status="processing",
                  provider_kind=KIND, provider_task_id="t", poll_generation=4, poll_seq=0))
    return job_id


def test_postgresql_a_resume_blocked_behind_the_first_turn_sees_the_turn(
        db: sessionmaker[Session]) -> None:
    """PostgreSQL, two real transactions: the first turn (0 → 1) holds the row; a resume's
    UPDATE waits on it. When the turn commits, the resume's CASE is evaluated on the row the
    turn left (seq 1): a new generation — never (g, 0) again after a turn (that would let a
    second (g, 0) copy take a second first turn: two chains)."""
    now = datetime(2026, 12, 1, 12, tzinfo=UTC)
    job_id = _turnless_row(db)
    turn = db()
    turn.begin()
    assert jobstore.take_poll_turn(turn, job_id, 4, 0, now) is not None  # holds the row lock
    out: list[Any] = []

    def resume() -> None:
        with db.begin() as s:
            fresh = jobstore.start_new_chain(s, job_id, now, timedelta(seconds=25))
            out.append(None if fresh is None else (fresh.poll_generation, fresh.poll_seq))

    t = threading.Thread(target=resume)
    t.start()
    t.join(timeout=1.0)
    assert t.is_alive()  # waiting on the turn's lock
    turn.commit()
    turn.close()
    t.join(timeout=10)
    assert out == [(5, 0)]
    with db.begin() as s:  # the other copy of (4, 0) is fenced
        assert jobstore.take_poll_turn(s, job_id, 4, 0, now) is None


def test_postgresql_a_first_turn_blocked_behind_a_kept_resume_still_takes_it_once(
        db: sessionmaker[Session]) -> None:
    now = datetime(2026, 12, 1, 12, tzinfo=UTC)
    job_id = _turnless_row(db)
    resume = db()
    resume.begin()
    kept = jobstore.start_new_chain(resume, job_id, now, timedelta(seconds=25))
    assert kept is not None and (kept.poll_generation, kept.poll_seq) == (4, 0)
    out: list[Any] = []

    def first_turn() -> None:
        with db.begin() as s:
            out.append(jobstore.take_poll_turn(s, job_id, 4, 0, now) is not None)

    t = threading.Thread(target=first_turn)
    t.start()
    t.join(timeout=1.0)
    assert t.is_alive()
    resume.commit()
    resume.close()
    t.join(timeout=10)
    assert out == [True]
    with db.begin() as s:  # the re-sent copy loses
        assert jobstore.take_poll_turn(s, job_id, 4, 0, now) is None
