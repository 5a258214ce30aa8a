"""RECONCILE_POLL_MODE=batch (issue 16): poll-due times on the rows, claimed and read in batches
(``reconcile.lifecycle.batch``), on PostgreSQL with the simulator and an injected clock.

Claims are exclusive across concurrent claimers (FOR UPDATE SKIP LOCKED), a result read under a
claim that was taken over is refused, a dead poller's rows are due again after one lease, and
progress / completion / failure / exhaustion go the way the chain takes them.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select, text, update
from sqlalchemy.orm import Session, sessionmaker

from reconcile import jobstore, lifecycle
from reconcile.db.models import CreditTransaction, Job, JobEvent
from reconcile.lifecycle import batch as batch_poll
from reconcile.providers import PollResult, PollStatus
from reconcile.states import ATTEMPT_SPACING, MAX_ATTEMPTS
from reconcile.testing.simulator import Script, Simulator
from tests.integration._sweep_helpers import FOREVER, INSTANT, World

KIND = "replicate-prediction"
INTERVAL = timedelta(seconds=3)  # replicate's poll interval
THRESHOLD = timedelta(minutes=20)
FAILS = ((0.0, "queued"), (0.0, "failed"))


@pytest.fixture
def world(db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> World:
    return World(db, simulator, tmp_path, poll_mode="batch", poll_batch_threads=4)


def _accepted(w: World, timeline: Any = FOREVER, n: int = 1) -> list[uuid.UUID]:
    ids = []
    for _ in range(n):
        ids.append(w.accept(KIND, Script(timeline=timeline)))
    return ids


def _completions(w: World, job_id: uuid.UUID) -> int:
    with w.db() as s:
        return s.execute(select(func.count()).select_from(JobEvent).where(
            JobEvent.job_id == job_id, JobEvent.type == "completed")).scalar_one()


def _txns(w: World, job_id: uuid.UUID, type_: str) -> int:
    with w.db() as s:
        return s.execute(select(func.count()).select_from(CreditTransaction).where(
            CreditTransaction.job_id == job_id, CreditTransaction.type == type_)).scalar_one()


def test_an_accepted_create_is_due_on_its_row_and_sends_no_poll_message(world: World) -> None:
    w = world
    job_id = w.submit(KIND)
    w.sim.script(str(job_id), Script(timeline=FOREVER))
    assert lifecycle.create_step(w.rt, job_id).action == "accepted"
    assert list(w.q.polls) == []
    job = w.job(job_id)
    assert job.poll_due_at == w.clock.now + INTERVAL
    assert (job.status, job.poll_seq) == ("processing", 0)


def test_two_concurrent_claimers_never_claim_the_same_row(world: World) -> None:
    """Two sessions claim at once: the second skips the rows the first holds locked."""
    w = world
    ids = set(_accepted(w, n=10))
    w.clock.now += INTERVAL
    lease = batch_poll.claim_lease(w.rt)
    first, second = w.db(), w.db()
    try:
        first.begin()
        a = {j.id for j in jobstore.claim_due(first, w.clock.now, lease, 6)}  # locked, uncommitted
        second.begin()
        second.execute(text("SET LOCAL lock_timeout = '5s'"))  # waiting on a lock fails the test
        b = {j.id for j in jobstore.claim_due(second, w.clock.now, lease, 10)}
        second.commit()
        first.commit()
    finally:
        first.close()
        second.close()
    assert len(a) == 6 and len(b) == 4
    assert a.isdisjoint(b) and a | b == ids
    for job_id in ids:  # each claimed once: one seq bump, due one lease ahead
        job = w.job(job_id)
        assert job.poll_seq == 1 and job.poll_due_at == w.clock.now + lease
    assert batch_poll.claim(w.rt) == []  # nothing due any more


def test_a_poller_claims_only_the_kinds_it_can_read(world: World) -> None:
    """A due row of a kind this process does not know (registered only in another
    deployment's workers, or gone) is not claimed: it stays due, untouched, for a poller that
    knows it — it used to be claimed and dropped as ``lost`` every lease."""
    from dataclasses import replace

    from reconcile import register_kind
    from reconcile.db.models import Job
    from reconcile.kinds import unregister_kind

    w = world
    known, foreign = _accepted(w, n=2)
    with w.db.begin() as s:
        s.execute(update(Job).where(Job.id == foreign).values(provider_kind="elsewhere-video"))
    w.clock.now += INTERVAL
    before = w.job(foreign)
    claims = batch_poll.claim(w.rt)
    assert [c.job.id for c in claims] == [known]
    after = w.job(foreign)
    assert (after.poll_due_at, after.poll_seq) == (before.poll_due_at, before.poll_seq)
    # a process that knows the kind claims it
    register_kind(replace(w.rt.kind(KIND), name="elsewhere-video"))
    try:
        assert [c.job.id for c in batch_poll.claim(w.rt)] == [foreign]
    finally:
        unregister_kind("elsewhere-video")


def test_the_claim_takes_the_oldest_due_first_and_only_due_rows(world: World) -> None:
    w = world
    early = _accepted(w)[0]
    w.clock.now += timedelta(seconds=1)
    late = _accepted(w)[0]
    w.clock.now += INTERVAL  # both due
    assert [c.job.id for c in batch_poll.claim(w.rt, limit=1)] == [early]
    assert [c.job.id for c in batch_poll.claim(w.rt, limit=5)] == [late]


def test_the_claim_uses_the_partial_index(world: World) -> None:
    w = world
    with w.db() as s:
        s.execute(text("SET enable_seqscan = off"))
        plan = "\n".join(s.execute(text(
            "EXPLAIN SELECT id FROM jobs WHERE status IN ('pending', 'processing') "
            "AND poll_due_at IS NOT NULL AND poll_due_at <= now() "
            "ORDER BY poll_due_at LIMIT 10 FOR UPDATE SKIP LOCKED")).scalars())
    assert "jobs_poll_due_idx" in plan, plan


def test_a_stale_claims_result_is_refused(world: World) -> None:
    """Claim 1 reads, its lease passes, claim 2 takes the row: claim 1's results (still running,
    or succeeded) are refused; claim 2's apply."""
    w = world
    job_id = _accepted(w, timeline=INSTANT)[0]
    w.clock.now += INTERVAL
    (stale,) = batch_poll.claim(w.rt)
    w.clock.now += batch_poll.claim_lease(w.rt)  # the first poller stalled past its lease
    (fresh,) = batch_poll.claim(w.rt)
    assert (fresh.generation, fresh.seq) == (stale.generation, stale.seq + 1)

    # a "still running" read under the stale claim: the set-based write skips the row
    running = PollResult(PollStatus.RUNNING, progress=50)
    due_before = w.job(job_id).poll_due_at
    with w.db.begin() as s:
        assert jobstore.reschedule_claimed(
            s, [(job_id, stale.generation, stale.seq, w.clock.now, 50)]) == 0
    assert (w.job(job_id).poll_due_at, w.job(job_id).progress) == (due_before, 0)
    # a succeeded read under the stale claim: refused, nothing finalized
    report = batch_poll.BatchReport()
    assert batch_poll._one(w.rt, stale, lifecycle.read_status(w.rt, stale.job, stale.kind),
                           report) == "fenced"
    assert report.fenced == 1 and w.job(job_id).status == "processing"
    assert running.status is PollStatus.RUNNING
    # the live claim completes it, once
    report = batch_poll.run_claims(w.rt, [fresh])
    assert report.outcomes == {"completed": 1}
    assert w.job(job_id).status == "completed" and _completions(w, job_id) == 1


def test_a_new_generation_fences_a_claim_in_progress(world: World) -> None:
    """A webhook's success resumes polling under a new generation: a claim taken before it is
    refused (the chain's generation fence, on the batch path)."""
    w = world
    job_id = _accepted(w)[0]
    w.clock.now += INTERVAL
    (c,) = batch_poll.claim(w.rt)
    assert lifecycle.resume_chain(w.rt, job_id)  # what the webhook's confirmed success does
    assert list(w.q.polls) == []  # no message: due now
    job = w.job(job_id)
    assert job.poll_due_at == w.clock.now and job.poll_generation == c.generation + 1
    report = batch_poll.run_claims(w.rt, [c])
    assert report.fenced == 1 and report.running == 0


def test_a_dead_pollers_rows_are_due_again_after_one_lease(world: World) -> None:
    w = world
    ids = set(_accepted(w, n=3))
    w.clock.now += INTERVAL
    assert {c.job.id for c in batch_poll.claim(w.rt)} == ids  # then the poller dies
    lease = batch_poll.claim_lease(w.rt)
    w.clock.now += lease - timedelta(seconds=1)
    assert batch_poll.claim(w.rt) == []
    tick = w.tick()  # the sweep starts no chain for them and sends nothing
    assert list(w.q.polls) == [] and not any(a.outcome == "due" for a in tick.actions)
    w.clock.now += timedelta(seconds=1)
    # due again, their chain-era lease long past (no poller ran): still no chain, no action
    w.clock.now += timedelta(minutes=5)
    generations = {w.job(j).poll_generation for j in ids}
    assert all(w.job(j).poll_lease_expires_at < w.clock.now for j in ids)
    assert [a for a in w.tick().actions if a.job_id in ids] == [] and list(w.q.polls) == []
    assert {w.job(j).poll_generation for j in ids} == generations
    again = batch_poll.claim(w.rt)
    assert {c.job.id for c in again} == ids
    assert all(c.seq == 2 for c in again)


def test_still_running_rows_are_rescheduled_in_one_statement_with_progress(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    w = world
    ids = _accepted(w, n=5)
    client = w.rt.client(w.rt.kind(KIND))
    monkeypatch.setattr(client, "poll", lambda task_id, model=None:
                        PollResult(PollStatus.RUNNING, progress=40, raw_status="processing"))
    w.clock.now += INTERVAL
    updates: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith(("UPDATE JOBS", "WITH LOCKED AS")):
            updates.append(statement)

    from sqlalchemy import event

    engine = w.db.kw["bind"]
    event.listen(engine, "before_cursor_execute", count)
    try:
        report = batch_poll.poll_due(w.rt, budget=60)
    finally:
        event.remove(engine, "before_cursor_execute", count)
    assert (report.claimed, report.running, report.fenced, report.batches) == (5, 5, 0, 1)
    # the claim (one statement: its locking read is a CTE of its update); five rows on four
    # threads read in two rounds, the claims extended once between them (one statement); then
    # one set-based write for all five
    assert len(updates) == 3, updates
    assert "FOR UPDATE SKIP LOCKED" in updates[0] and "UPDATE jobs SET" in updates[0]
    assert "poll_lease_expires_at" in updates[1] and "RETURNING jobs.id" in updates[1]
    assert "FROM unnest(" in updates[2] and "progress" in updates[2]
    for job_id in ids:
        job = w.job(job_id)
        assert job.progress == 40 and job.poll_due_at == w.clock.now + INTERVAL
        assert job.reconcile_attempts == 0 and job.reconcile_last_error is None
    # progress never goes down
    monkeypatch.setattr(client, "poll", lambda task_id, model=None:
                        PollResult(PollStatus.RUNNING, progress=10))
    w.clock.now += INTERVAL
    batch_poll.poll_due(w.rt, budget=60)
    assert {w.job(j).progress for j in ids} == {40}


def test_completion_and_failure_through_the_batch_path(world: World) -> None:
    w = world
    done = _accepted(w, timeline=INSTANT)[0]
    failed = _accepted(w, timeline=FAILS)[0]
    running = _accepted(w)[0]
    w.clock.now += INTERVAL
    report = batch_poll.poll_due(w.rt, budget=60)
    assert report.outcomes == {"completed": 1, "failed": 1, "in_flight": 1}, report.line()
    job = w.job(done)
    assert job.status == "completed" and _completions(w, done) == 1
    assert _txns(w, done, "COMMIT") + _txns(w, done, "USAGE") >= 1 and _txns(w, done, "REFUND") == 0
    job = w.job(failed)
    assert (job.status, job.error_code) == ("failed", "UPSTREAM_FAILED")
    assert job.credits_actual == 0 and w.refunds(failed) == 1
    assert w.job(running).status == "processing"
    assert w.audit() == []
    # a finished row is no longer due
    w.clock.now += timedelta(hours=1)
    assert {c.job.id for c in batch_poll.claim(w.rt)} == {running}


def test_a_failed_read_is_noted_and_the_row_stays_due(world: World,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from reconcile.errors import ProviderError

    w = world
    job_id = _accepted(w)[0]
    client = w.rt.client(w.rt.kind(KIND))

    def broken(task_id: str, model: str | None = None) -> PollResult:
        raise ProviderError("connection reset")

    monkeypatch.setattr(client, "poll", broken)
    w.clock.now += INTERVAL
    report = batch_poll.poll_due(w.rt, budget=60)
    assert report.observed == 1 and report.outcomes == {"in_flight": 1}
    job = w.job(job_id)
    assert job.status == "processing" and "read failed" in (job.reconcile_last_error or "")
    assert job.poll_due_at == w.clock.now + INTERVAL and job.reconcile_attempts == 0


def test_exhaustion_through_the_batch_path_as_the_chain_does_it(world: World) -> None:
    """Past the stale threshold each read counts one attempt per spacing; at MAX_ATTEMPTS the
    job fails UPSTREAM_TIMEOUT and is refunded (lifecycle._unfinished's own rules)."""
    w = world
    job_id = _accepted(w)[0]
    w.clock.now += THRESHOLD
    for attempt in range(1, MAX_ATTEMPTS + 1):
        report = batch_poll.poll_due(w.rt, budget=60)
        assert report.observed == 1, report.line()
        if attempt < MAX_ATTEMPTS:
            assert w.job(job_id).reconcile_attempts == attempt
            # a second read inside the spacing counts nothing
            w.clock.now += INTERVAL * 2
            batch_poll.poll_due(w.rt, budget=60)
            assert w.job(job_id).reconcile_attempts == attempt
            w.clock.now += ATTEMPT_SPACING
    job = w.job(job_id)
    assert (job.status, job.error_code) == ("failed", "UPSTREAM_TIMEOUT")
    assert job.reconcile_attempts == MAX_ATTEMPTS and w.refunds(job_id) == 1
    assert w.anomalies(job_id, "reconcile_exhausted") == ["reconcile_exhausted"]


def test_the_sweep_makes_a_dead_chain_row_due_instead_of_starting_a_chain(world: World) -> None:
    """A row from before the switch (no poll_due_at, its chain lost): the sweep's resume row
    gives it a new generation, due now — no poll message."""
    w = world
    job_id = _accepted(w)[0]
    w.set(job_id, poll_due_at=None, poll_lease_expires_at=w.clock.now)  # a chain-mode row
    generation = w.job(job_id).poll_generation
    w.clock.now += timedelta(seconds=1)
    tick = w.tick()
    assert [(a.action, a.outcome) for a in tick.actions] == [("resume", "due")]
    assert list(w.q.polls) == []
    job = w.job(job_id)
    assert job.poll_due_at == w.clock.now and job.poll_generation == generation + 1
    assert [c.job.id for c in batch_poll.claim(w.rt)] == [job_id]


def test_a_chain_message_from_before_the_switch_hands_the_row_to_the_batch_poller(
        world: World) -> None:
    w = world
    job_id = _accepted(w)[0]
    job = w.job(job_id)
    w.set(job_id, poll_due_at=None)
    w.clock.now += INTERVAL
    assert lifecycle.poll_step(w.rt, job_id, job.poll_generation, job.poll_seq) == "in_flight"
    assert list(w.q.polls) == []
    assert w.job(job_id).poll_due_at == w.clock.now + INTERVAL


def test_chain_mode_is_unchanged(db: sessionmaker[Session], simulator: Simulator,
                                 tmp_path: Path) -> None:
    w = World(db, simulator, tmp_path)
    job_id = w.submit(KIND)
    w.sim.script(str(job_id), Script(timeline=FOREVER))
    assert lifecycle.create_step(w.rt, job_id).action == "accepted"
    assert len(w.q.polls) == 1 and w.job(job_id).poll_due_at is None
    assert batch_poll.claim(w.rt) == []


def test_batch_mode_on_the_embedded_sqlite_default(simulator: Simulator, tmp_path: Path) -> None:
    """SQLite (no SKIP LOCKED, no UPDATE … FROM VALUES): the same claims and outcomes."""
    from reconcile.db.migrate import upgrade
    from reconcile.db.session import make_engine, make_sessionmaker

    url = f"sqlite:///{tmp_path}/reconcile.db"
    upgrade(url)
    w = World(make_sessionmaker(make_engine(url)), simulator, tmp_path, poll_mode="batch",
              poll_batch_threads=4)
    running = _accepted(w, n=3)
    done = _accepted(w, timeline=INSTANT)[0]
    assert list(w.q.polls) == []
    w.clock.now += INTERVAL
    report = batch_poll.poll_due(w.rt, budget=60)
    assert report.outcomes == {"completed": 1, "in_flight": 3}, report.line()
    assert w.job(done).status == "completed" and _completions(w, done) == 1
    for job_id in running:
        job = w.job(job_id)
        assert job.poll_due_at == w.clock.now + INTERVAL and job.poll_seq == 1
    w.clock.now += INTERVAL
    (stale,) = batch_poll.claim(w.rt, limit=1)
    w.clock.now += batch_poll.claim_lease(w.rt)
    fresh = batch_poll.claim(w.rt, limit=5)  # the stale claim's row and the two still due
    assert stale.job.id in {c.job.id for c in fresh} and len(fresh) == 3
    assert batch_poll.run_claims(w.rt, [stale]).fenced == 1
    # a batch larger than the pool reads in rounds; the SQLite branch of hold_claims extends
    # the claims still held (the stale one is refused)
    from reconcile import jobstore

    until = w.clock.now + timedelta(minutes=9)
    with w.rt.sessions.begin() as session:
        held = jobstore.hold_claims(session, [(c.job.id, c.generation, c.seq)
                                              for c in [stale, *fresh]], until)
    assert held == {c.job.id for c in fresh}
    assert {w.job(c.job.id).poll_due_at for c in fresh} == {until}


def test_back_to_chain_mode_the_sweep_resumes_batch_rows_as_chains(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """Batch mode switched off: a row still carrying a due time is resumed as a chain by the
    sweep once its lease is past, and its due time is cleared (no batch poller runs now)."""
    batch = World(db, simulator, tmp_path, poll_mode="batch")
    job_id = _accepted(batch)[0]
    batch.clock.now += INTERVAL
    assert len(batch_poll.claim(batch.rt)) == 1  # claimed, then the switch
    chain = World(db, simulator, tmp_path)
    chain.clock.now = batch.clock.now + batch_poll.claim_lease(batch.rt) + timedelta(seconds=1)
    tick = chain.tick()
    assert [(a.job_id, a.action, a.outcome) for a in tick.actions] == [(job_id, "resume", "resumed")]
    job = chain.job(job_id)
    assert job.poll_due_at is None
    assert list(chain.q.polls) == [(job_id, job.poll_generation, 0)]


def test_the_next_read_is_due_one_interval_after_the_claimed_due_time(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows are claimed only at ticks, so a read starts up to a tick after its due time: the
    next due time counts from the due time claimed, not from the read's end (figure 3 measured
    reads 6.0 s apart on a 5-s kind, one 1-s tick lost per turn, before this). A poller that
    fell further behind than a tick does not catch up in a burst: the next read is due at most
    one tick short of an interval after the read."""
    w = world
    tick = timedelta(seconds=w.rt.settings.poll_batch_interval) * w.rt.settings.time_scale
    assert timedelta(0) < tick < INTERVAL / 2
    on_time, late = _accepted(w, n=2)
    client = w.rt.client(w.rt.kind(KIND))
    monkeypatch.setattr(client, "poll", lambda task_id, model=None:
                        PollResult(PollStatus.RUNNING, progress=10))
    due = w.job(on_time).poll_due_at
    w.set(late, poll_due_at=due - 3 * tick)  # a poller three ticks behind for this row
    w.clock.now = due + tick * 0.75  # claimed most of a tick after the due time
    report = batch_poll.poll_due(w.rt, budget=60)
    assert (report.claimed, report.running) == (2, 2), report.line()
    assert w.job(on_time).poll_due_at == due + INTERVAL  # not now + INTERVAL
    assert w.job(late).poll_due_at == w.clock.now + INTERVAL - tick  # clamped, no burst
    # the schedule holds over turns: no tick lost per read
    w.clock.now = due + INTERVAL + tick * 0.5
    batch_poll.poll_due(w.rt, budget=60)
    assert w.job(on_time).poll_due_at == due + 2 * INTERVAL


def test_stalled_says_a_row_waits_unclaimed_past_two_ticks_and_a_claim_ends_it(world: World) -> None:
    """The worker's fallback tick (``reconcile.worker.ticker``) nudges only when a row this
    process could claim has been due for more than two poll_due ticks and nobody claimed it;
    ``stalled`` names the oldest such due time (the ticker's back-off compares it)."""
    w = world
    first, second = _accepted(w, n=2)
    due = w.job(first).poll_due_at
    assert due is not None
    with w.db.begin() as s:  # the second one falls due a second later
        s.execute(update(Job).where(Job.id == second)
                  .values(poll_due_at=due + timedelta(seconds=1)))
    every, _ = w.rt.settings.poll_due_tick
    w.clock.now = due
    assert batch_poll.stalled(w.rt) is None  # due now: beat's next tick takes it
    w.clock.now = due + timedelta(seconds=2 * every + 1)
    assert batch_poll.stalled(w.rt) == due  # the oldest waiting row
    assert len(batch_poll.claim(w.rt, limit=1)) == 1
    assert batch_poll.stalled(w.rt) == due + timedelta(seconds=1)  # the next one waits still
    assert len(batch_poll.claim(w.rt)) == 1
    assert batch_poll.stalled(w.rt) is None  # both claimed: due again one lease ahead
    w.clock.now += batch_poll.claim_lease(w.rt) + timedelta(seconds=2 * every)
    assert batch_poll.stalled(w.rt) is not None  # a dead poller's claims ran out: due again
    with w.db.begin() as s:  # a kind no process here can read is never this process's nudge
        s.execute(update(Job).values(provider_kind="nobody-knows-it"))
    assert batch_poll.stalled(w.rt) is None


def test_a_full_first_claim_calls_the_helper_once_and_a_short_one_never(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """The helper (the task sends another poll_due there) is called once, when the run's first
    claim comes back full: more rows may be due than one batch. A short first claim, or a full
    claim after the first, calls nothing; a helper that raises loses none of the claimed rows."""
    w = world
    _accepted(w, n=5)
    client = w.rt.client(w.rt.kind(KIND))
    monkeypatch.setattr(client, "poll", lambda task_id, model=None:
                        PollResult(PollStatus.RUNNING, progress=1, raw_status="processing"))
    w.clock.now += INTERVAL
    calls: list[int] = []
    report = batch_poll.poll_due(w.rt, budget=60, limit=2, helper=lambda: calls.append(1))
    assert (report.batches, report.claimed, report.running) == (3, 5, 5)  # full, full, short
    assert calls == [1]

    w.clock.now += INTERVAL  # the five are due again: a first claim of six is short
    report = batch_poll.poll_due(w.rt, budget=60, limit=6, helper=lambda: calls.append(2))
    assert (report.batches, report.claimed) == (1, 5)
    assert calls == [1]

    def broken() -> None:
        raise ConnectionError("broker down")

    w.clock.now += INTERVAL
    report = batch_poll.poll_due(w.rt, budget=60, limit=5, helper=broken)
    assert (report.claimed, report.running) == (5, 5)
