"""RECONCILE_POLL_MODE=batch under races: late writes of a poller whose
claim was taken over, writers landing between the claim and the write, mode switches with jobs
in flight, bad reads inside a batch, exhaustion parity with the chain path.

PostgreSQL, the simulator and an injected clock (``World``); a second poller is simulated by a
nested ``poll_due`` run from inside the first poller's read (``poll_batch_threads=1``: the reads
run in the test's thread, in claim order).
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from reconcile import lifecycle
from reconcile.db.models import JobEvent
from reconcile.errors import ErrorCode
from reconcile.lifecycle import batch as batch_poll
from reconcile.lifecycle.cancel import cancel_job
from reconcile.providers import PollResult, PollStatus
from reconcile.states import ATTEMPT_SPACING, MAX_ATTEMPTS
from reconcile.testing.simulator import Script, Simulator
from tests.integration._sweep_helpers import FOREVER, INSTANT, World

KIND = "replicate-prediction"
INTERVAL = timedelta(seconds=3)
THRESHOLD = timedelta(minutes=20)
FAILS = ((0.0, "queued"), (0.0, "failed"))


@pytest.fixture
def world(db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> World:
    return World(db, simulator, tmp_path, poll_mode="batch", poll_batch_threads=1)


def _completions(w: World, job_id: uuid.UUID) -> int:
    with w.db() as s:
        return s.execute(select(func.count()).select_from(JobEvent).where(
            JobEvent.job_id == job_id, JobEvent.type == "completed")).scalar_one()


def _task_ids(w: World, ids: list[uuid.UUID]) -> dict[str, uuid.UUID]:
    return {w.job(j).provider_task_id or "": j for j in ids}


def _twin(w: World, db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
          **settings: Any) -> World:
    """A second runtime on the same database and clock (a worker restarted with other
    settings): the same user, the same time."""
    other = World(db, simulator, tmp_path / f"twin-{uuid.uuid4().hex[:6]}", **settings)
    other.clock = w.clock
    other.rt.clock = w.clock
    other.user = w.user
    return other


# ----------------------------------------------------------------------------- 1. takeover


def test_xb_takeover_mid_read_late_writes_of_the_first_poller_are_refused(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """Poller A claims three rows (one succeeds, one fails, one still runs); during A's first
    read its lease passes and poller B claims and finishes the same rows. A's late writes
    (completion, failure, still-running UPDATE) are all refused: one completion, one refund."""
    w = world
    done = w.accept(KIND, Script(timeline=INSTANT))
    failed = w.accept(KIND, Script(timeline=FAILS))
    running = w.accept(KIND, Script(timeline=FOREVER))
    w.clock.now += INTERVAL
    client = w.rt.client(w.rt.kind(KIND))
    real = client.poll
    nested: list[batch_poll.BatchReport] = []
    started: list[int] = []

    def slow_then_taken_over(task_id: str, model: str | None = None) -> PollResult:
        result = real(task_id, model=model)
        if not started:  # A's first read stalls past its lease; B runs meanwhile
            started.append(1)
            w.clock.now += batch_poll.claim_lease(w.rt)
            nested.append(batch_poll.poll_due(w.rt, budget=60))
        return result

    monkeypatch.setattr(client, "poll", slow_then_taken_over)
    first = batch_poll.poll_due(w.rt, budget=60)
    (second,) = nested
    assert second.claimed == 3 and second.fenced == 0, second.line()
    assert second.outcomes == {"completed": 1, "failed": 1, "in_flight": 1}, second.line()
    assert first.fenced == 3 and first.observed == 0 and first.running == 0, first.line()
    assert w.job(done).status == "completed" and _completions(w, done) == 1
    assert w.job(failed).status == "failed" and w.refunds(failed) == 1
    job = w.job(running)
    # B's reschedule stands: A's still-running write would have put its own due time
    assert job.status == "processing" and job.poll_due_at == w.clock.now + INTERVAL
    assert job.poll_seq == 2
    assert w.audit() == []


def test_xb_takeover_a_raising_read_of_the_first_poller_counts_no_attempt(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the threshold, A's read raises after its lease passed and B re-claimed the row
    and counted the attempt: A's exception is refused (no second attempt, no error noted)."""
    w = world
    job_id = w.accept(KIND, Script(timeline=FOREVER))
    w.clock.now += THRESHOLD
    client = w.rt.client(w.rt.kind(KIND))
    real = client.poll
    calls: list[int] = []

    def raising_after_takeover(task_id: str, model: str | None = None) -> PollResult:
        calls.append(1)
        if len(calls) == 1:
            w.clock.now += batch_poll.claim_lease(w.rt)
            batch_poll.poll_due(w.rt, budget=60)  # B: a normal read, one attempt counted
            raise RuntimeError("A's socket died late")
        return real(task_id, model=model)

    monkeypatch.setattr(client, "poll", raising_after_takeover)
    first = batch_poll.poll_due(w.rt, budget=60)
    assert first.fenced == 1 and first.observed == 0, first.line()
    job = w.job(job_id)
    assert job.reconcile_attempts == 1
    assert "RuntimeError" not in (job.reconcile_last_error or "")


def test_xb_two_concurrent_pollers_claim_disjoint_rows_and_finish_each_once(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """B runs while A holds its claim (inside A's first read, A's claim committed): B gets only
    the rows A did not take; every job completes once."""
    w = world
    ids = [w.accept(KIND, Script(timeline=INSTANT)) for _ in range(6)]
    w.clock.now += INTERVAL
    client = w.rt.client(w.rt.kind(KIND))
    real = client.poll
    nested: list[batch_poll.BatchReport] = []
    started: list[int] = []

    def with_a_second_poller(task_id: str, model: str | None = None) -> PollResult:
        if not started:
            started.append(1)
            nested.append(batch_poll.poll_due(w.rt, budget=60, limit=10))
        return real(task_id, model=model)

    monkeypatch.setattr(client, "poll", with_a_second_poller)
    first = batch_poll.poll_due(w.rt, budget=60, limit=3)
    (second,) = nested
    assert first.claimed + second.claimed == 6 and first.fenced == second.fenced == 0
    assert [_completions(w, j) for j in ids] == [1] * 6
    assert w.audit() == []


# ----------------------------------------------------------------------------- 2. writers between


@pytest.mark.parametrize("writer", ["webhook", "cancel", "operator_fail", "sweep_resume"])
def test_xb_a_writer_between_the_claim_and_the_write(world: World, writer: str) -> None:
    """A claim is taken; then a webhook completes the job, the user cancels, an operator
    fails it or the sweep starts a new generation; then the batch writes what it read."""
    w = world
    job_id = w.accept(KIND, Script(timeline=INSTANT))
    w.clock.now += INTERVAL
    (c,) = batch_poll.claim(w.rt)
    result = lifecycle.read_status(w.rt, c.job, c.kind)  # succeeded, read under the claim
    if writer == "webhook":
        assert lifecycle.finalize_job_with_media(w.rt, job_id, result, source="webhook")
    elif writer == "cancel":
        cancel_job(w.rt, w.user, job_id)
    elif writer == "operator_fail":
        assert lifecycle.fail_job(w.rt, job_id, ErrorCode.UPSTREAM_FAILED, "operator", {})
    else:
        assert lifecycle.resume_chain(w.rt, job_id)
    report = batch_poll.BatchReport()
    outcome = batch_poll._one(w.rt, c, result, report)
    assert outcome == "fenced" and report.fenced == 1
    job = w.job(job_id)
    if writer == "webhook":
        assert job.status == "completed" and _completions(w, job_id) == 1
    elif writer == "sweep_resume":
        assert job.status == "processing" and _completions(w, job_id) == 0
        (fresh,) = batch_poll.claim(w.rt)  # the new generation is due now and completes once
        assert batch_poll.run_claims(w.rt, [fresh]).outcomes == {"completed": 1}
        assert _completions(w, job_id) == 1
    else:
        assert job.status in ("failed", "cancelled") and _completions(w, job_id) == 0
        assert w.refunds(job_id) == 1
    assert w.audit() == []


def test_xb_a_still_running_read_after_a_webhook_completion_writes_nothing(world: World) -> None:
    w = world
    job_id = w.accept(KIND, Script(timeline=INSTANT))
    w.clock.now += INTERVAL
    (c,) = batch_poll.claim(w.rt)
    assert lifecycle.finalize_job_with_media(
        w.rt, job_id, lifecycle.read_status(w.rt, c.job, c.kind), source="webhook")
    before = w.job(job_id)
    report = batch_poll.BatchReport()
    import reconcile.jobstore as jobstore

    with w.db.begin() as s:
        assert jobstore.reschedule_claimed(
            s, [(job_id, c.generation, c.seq, w.clock.now + INTERVAL, 70)]) == 0
    after = w.job(job_id)
    assert (after.poll_due_at, after.progress, after.status) == (
        before.poll_due_at, before.progress, "completed")
    w.clock.now += timedelta(hours=1)
    assert batch_poll.claim(w.rt) == []  # a terminal row is never due again
    assert report.fenced == 0


# ----------------------------------------------------------------------------- 3. mode switches


def test_xb_batch_to_chain_switch_leaves_no_job_without_a_live_path(
        world: World, db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """Batch rows (due on the row, no message) after the platform switches back to chain mode
    and restarts: the chain-mode sweep gives each a chain and the chain completes them."""
    w = world
    ids = [w.accept(KIND, Script(timeline=FOREVER)) for _ in range(2)]
    w.clock.now += INTERVAL
    assert batch_poll.poll_due(w.rt, budget=60).running == 2  # rescheduled on the row
    chain = _twin(w, db, simulator, tmp_path)  # RECONCILE_POLL_MODE=chain, workers restarted
    for j in ids:
        simulator.set_state(w.job(j).provider_task_id or "", "succeeded")
    resumed: set[uuid.UUID] = set()
    for _ in range(40):  # sweep ticks, 30 s apart: some tick must resume both
        w.clock.now += timedelta(seconds=30)
        chain.tick()
        resumed |= {uuid.UUID(str(args[0])) for args in _poll_args(chain)}
        if resumed >= set(ids):
            break
    assert resumed >= set(ids), "a batch row got no chain after the switch to chain mode"
    for args in list(_poll_args(chain)):
        lifecycle.poll_step(chain.rt, uuid.UUID(str(args[0])), int(args[1]), int(args[2]))
    assert [w.job(j).status for j in ids] == ["completed", "completed"]
    assert [_completions(w, j) for j in ids] == [1, 1]
    assert w.audit() == []


def _poll_args(w: World) -> list[tuple[Any, ...]]:
    return [tuple(item) for item in w.q.polls]


def test_xb_chain_to_batch_switch_lost_and_live_chains_both_reach_the_poller(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """Chain mode: one job whose message is lost, one whose message is still queued. The
    platform switches to batch: the sweep makes the first due, the queued message hands the
    second to the poller; both complete once through poll_due."""
    chain = World(db, simulator, tmp_path)
    lost = chain.accept(KIND, Script(timeline=INSTANT))  # accept() loses the messages
    live = chain.submit(KIND)
    simulator.script(str(live), Script(timeline=FOREVER))
    assert lifecycle.create_step(chain.rt, live).action == "accepted"
    (queued,) = _poll_args(chain)
    batch = _twin(chain, db, simulator, tmp_path, poll_mode="batch", poll_batch_threads=1)
    chain.clock.now += INTERVAL
    assert lifecycle.poll_step(batch.rt, live, int(queued[1]), int(queued[2])) == "in_flight"
    assert list(batch.q.polls) == []
    simulator.set_state(batch.job(live).provider_task_id or "", "succeeded")
    done: dict[uuid.UUID, int] = {}
    for _ in range(40):
        chain.clock.now += timedelta(seconds=30)
        batch.tick()
        batch_poll.poll_due(batch.rt, budget=60)
        done = {j: _completions(batch, j) for j in (lost, live)}
        if all(done.values()):
            break
    assert done == {lost: 1, live: 1}
    assert list(batch.q.polls) == []
    assert batch.audit() == []


# ----------------------------------------------------------------------------- 4. bad reads


@pytest.mark.parametrize("garbage", ["50%", float("nan"), float("inf")])
def test_xb_one_garbage_read_does_not_poison_the_batch(
        world: World, monkeypatch: pytest.MonkeyPatch, garbage: Any) -> None:
    """A (plugin) provider answers "running" with a progress that is no number for one task:
    the other rows of the batch are still written, and the bad row is an error as the chain
    path makes it (noted, rescheduled), not an exception out of poll_due."""
    w = world
    ids = [w.accept(KIND, Script(timeline=FOREVER)) for _ in range(3)]
    by_task = _task_ids(w, ids)
    bad = ids[1]
    client = w.rt.client(w.rt.kind(KIND))

    def poll(task_id: str, model: str | None = None) -> PollResult:
        progress = garbage if by_task[task_id] == bad else 30
        return PollResult(PollStatus.RUNNING, progress=progress, raw_status="processing")

    monkeypatch.setattr(client, "poll", poll)
    w.clock.now += INTERVAL
    report = batch_poll.poll_due(w.rt, budget=60)
    assert report.running == 2 and report.observed == 1, report.line()
    for j in ids:
        job = w.job(j)
        assert job.status == "processing" and job.poll_due_at == w.clock.now + INTERVAL
    assert {w.job(j).progress for j in ids if j != bad} == {30}
    assert "INTERNAL" in (w.job(bad).reconcile_last_error or "")
    # the chain path makes the same read an error, not a crash
    chain_job = w.job(bad)
    assert lifecycle.observe(w.rt, chain_job, w.rt.kind(KIND), via="poll") == "error"


def test_xb_a_raising_read_among_good_ones_counts_one_attempt_past_the_threshold(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    w = world
    ids = [w.accept(KIND, Script(timeline=FOREVER)) for _ in range(3)]
    by_task = _task_ids(w, ids)
    bad = ids[0]
    client = w.rt.client(w.rt.kind(KIND))
    real = client.poll

    def poll(task_id: str, model: str | None = None) -> PollResult:
        if by_task[task_id] == bad:
            raise KeyError("garbage body")
        return real(task_id, model=model)

    monkeypatch.setattr(client, "poll", poll)
    w.clock.now += THRESHOLD
    report = batch_poll.poll_due(w.rt, budget=60)
    assert report.claimed == 3 and report.fenced == 0, report.line()
    assert [w.job(j).reconcile_attempts for j in ids] == [1, 1, 1]
    assert (w.job(bad).reconcile_last_error or "").startswith("INTERNAL: KeyError")
    # due again one interval after the read, less at most one tick (the rows were long overdue:
    # batch_poll.next_due counts from the claimed due time, clamped so it never bursts)
    tick = min(w.rt.settings.scaled(timedelta(seconds=w.rt.settings.poll_batch_interval)),
               INTERVAL / 2)
    assert all(w.job(j).poll_due_at == w.clock.now + INTERVAL - tick for j in ids), \
        [w.job(j).poll_due_at for j in ids]


# ----------------------------------------------------------------------------- 5. parity


@pytest.mark.parametrize("failure", ["raises", "not_found", "unknown"])
def test_xb_exhaustion_code_and_attempts_equal_the_chain_path(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, failure: str) -> None:
    """The same persistent bad read, driven to exhaustion once by the chain and once by the
    batch poller at the same times: same error code, same attempts, one refund each."""
    outcomes = {}
    for mode in ("chain", "batch"):
        w = World(db, simulator, tmp_path / mode, poll_mode=mode, poll_batch_threads=1)
        job_id = w.accept(KIND, Script(timeline=FOREVER))
        client = w.rt.client(w.rt.kind(KIND))

        def poll(task_id: str, model: str | None = None) -> PollResult:
            if failure == "raises":
                raise RuntimeError("boom")
            if failure == "not_found":
                return PollResult(PollStatus.NOT_FOUND)
            return PollResult(PollStatus.UNKNOWN, raw_status="weird")

        monkeypatch.setattr(client, "poll", poll)
        w.clock.now += THRESHOLD
        reads = 0
        while w.job(job_id).status == "processing" and reads < 3 * MAX_ATTEMPTS:
            reads += 1
            if mode == "chain":
                job = w.job(job_id)
                w.lose_messages()
                lifecycle.poll_step(w.rt, job_id, job.poll_generation, job.poll_seq)
            else:
                w.set(job_id, poll_due_at=w.clock.now)
                batch_poll.poll_due(w.rt, budget=60)
            w.clock.now += ATTEMPT_SPACING
        job = w.job(job_id)
        outcomes[mode] = (job.status, job.error_code, job.reconcile_attempts, reads,
                          w.refunds(job_id))
        assert w.anomalies(job_id, "reconcile_exhausted") == ["reconcile_exhausted"]
    assert outcomes["batch"] == outcomes["chain"], outcomes
    assert outcomes["batch"][2] == MAX_ATTEMPTS


def test_xb_terminal_rows_keep_no_claimable_due_time(world: World) -> None:
    w = world
    done = w.accept(KIND, Script(timeline=INSTANT))
    failed = w.accept(KIND, Script(timeline=FAILS))
    w.clock.now += INTERVAL
    batch_poll.poll_due(w.rt, budget=60)
    for j in (done, failed):
        assert w.job(j).status in ("completed", "failed")
        assert not batch_poll.make_due(w.rt, j)
    w.clock.now += timedelta(days=2)
    assert batch_poll.claim(w.rt) == []
    assert w.tick().actions is not None
    assert batch_poll.claim(w.rt) == []


def test_xb_a_row_whose_write_raises_does_not_stop_the_rest_of_the_batch(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three rows that all need the per-job path (failed upstream); the round's one hold of
    their claims hits a database error, and then so does the first one's own claim check: the
    two others are still failed and refunded in this run, and the broken row is due again
    after its lease (as a dead poller's)."""
    from sqlalchemy.exc import OperationalError

    import reconcile.jobstore as jobstore

    w = world
    ids = [w.accept(KIND, Script(timeline=FAILS)) for _ in range(3)]
    w.clock.now += INTERVAL
    claims = batch_poll.claim(w.rt)
    broken = claims[0].job.id
    real, real_all = jobstore.hold_claim, jobstore.hold_claims_with_status
    lost = OperationalError("UPDATE jobs", {}, Exception("server closed the connection"))
    grouped: list[int] = []

    def hold_all(session: Session, rows: Any, until: Any, **kw: Any) -> Any:
        grouped.append(len(rows))
        raise lost

    def hold(session: Session, job_id: uuid.UUID, *args: Any, **kw: Any) -> Any:
        if job_id == broken:
            raise lost
        return real(session, job_id, *args, **kw)

    monkeypatch.setattr(jobstore, "hold_claims_with_status", hold_all)
    monkeypatch.setattr(jobstore, "hold_claim", hold)
    report = batch_poll.run_claims(w.rt, claims)
    assert grouped == [3]  # the round's hold was tried once, for the three
    assert report.outcomes.get("failed") == 2, report.line()
    assert sorted(w.job(j).status for j in ids) == ["failed", "failed", "processing"]
    monkeypatch.setattr(jobstore, "hold_claim", real)
    monkeypatch.setattr(jobstore, "hold_claims_with_status", real_all)
    w.clock.now += batch_poll.claim_lease(w.rt)
    assert batch_poll.poll_due(w.rt, budget=60).outcomes == {"failed": 1}
    assert [w.refunds(j) for j in ids] == [1, 1, 1]
    assert w.audit() == []


def test_xb_slow_legal_reads_make_every_batch_fenced_livelock(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """X2 finding 3 (a strict xfail until the batch read in rounds): each read takes 0.6 lease
    (inside one read's deadline), three rounds per batch (threads=1, 3 rows); beat's next tick
    claims whatever is due while the batch still reads. The lease covered one read, so the tick
    re-claimed every row before the batch wrote it, and every poller's writes were fenced in
    turn (no completion, no attempt). Each round now extends the claims it has not written:
    three pollers in a row, at least one job completes."""
    w = world
    ids = [w.accept(KIND, Script(timeline=INSTANT)) for _ in range(3)]
    w.clock.now += INTERVAL
    lease = batch_poll.claim_lease(w.rt)
    client = w.rt.client(w.rt.kind(KIND))
    real = client.poll
    waiting: list[list[batch_poll.Claim]] = []
    reads = [0]

    def slow(task_id: str, model: str | None = None) -> PollResult:
        result = real(task_id, model=model)
        w.clock.now += lease * 0.6
        reads[0] += 1
        if reads[0] % 3 == 2:  # the next tick, one lease after this batch's claim
            waiting.append(batch_poll.claim(w.rt))
        return result

    monkeypatch.setattr(client, "poll", slow)
    claims = batch_poll.claim(w.rt)
    for _ in range(3):
        report = batch_poll.run_claims(w.rt, claims)
        claims = waiting.pop() if waiting else batch_poll.claim(w.rt)
        if not claims:
            break
    assert any(_completions(w, j) for j in ids), report.line()


def test_xb_rounds_extend_the_claims_not_yet_written_and_drop_a_taken_over_one(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three rows, one thread: three rounds. Before rounds 2 and 3 the unwritten claims are
    extended by one lease in one statement each; a row whose claim another writer took in
    between (a webhook's new generation) is dropped, never written by this batch."""
    w = world
    ids = [w.accept(KIND, Script(timeline=FOREVER)) for _ in range(3)]
    w.clock.now += INTERVAL
    lease = batch_poll.claim_lease(w.rt)
    claims = batch_poll.claim(w.rt)
    assert [c.job.id for c in claims] == ids
    client = w.rt.client(w.rt.kind(KIND))
    real = client.poll
    due_seen: list[list[Any]] = []

    def slow(task_id: str, model: str | None = None) -> PollResult:
        result = real(task_id, model=model)
        w.clock.now += lease * 0.6  # two reads take longer than one lease
        due_seen.append([w.job(j).poll_due_at for j in ids])
        if len(due_seen) == 1:  # during round 1: a new generation for the third row
            with w.db.begin() as s:
                from reconcile import jobstore
                assert jobstore.start_new_chain(s, ids[2], w.clock.now, lease,
                                                poll_due_at=w.clock.now + INTERVAL) is not None
        return result

    monkeypatch.setattr(client, "poll", slow)
    report = batch_poll.run_claims(w.rt, claims)
    assert report.running == 2 and report.fenced == 1, report.line()
    # round 2 read the second row under a claim extended one lease past round 1's end
    assert due_seen[1][1] == w.clock.now - lease * 0.6 + lease
    assert len(due_seen) == 2  # the third row was never read by this batch
    third = w.job(ids[2])
    assert third.poll_seq == 0 and third.poll_generation == claims[2].generation + 1


@pytest.mark.parametrize("writer", ["webhook_resume", "reap_and_claim"])
def test_xb_a_claim_taken_over_without_waiting_for_its_lease_is_fenced_at_its_turn(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, writer: str) -> None:
    """Job 2 has one attempt left and poller A's read of it said NOT_FOUND (a transient miss).
    While A finishes job 1, the task succeeds and job 2's claim is taken over at once — the
    webhook's confirming read starts a new generation, or A stalls, is reaped and poller B
    claims — long before A's lease ends. A's turn for job 2 must hold its claim then, find it
    gone and be refused; B completes the job. A hold of the whole round before its outcomes
    (trusted for half a lease) let A count the last attempt and fail, and refund, a job whose
    task had succeeded."""
    from reconcile.states import MAX_ATTEMPTS
    from reconcile.sweep.liveness import reap

    w = World(db, simulator, tmp_path, poll_mode="batch", poll_batch_threads=1,
              poll_batch_finalize_threads=1)
    w.rt.worker_id = "w-A"
    first = w.accept(KIND, Script(timeline=INSTANT))
    second = w.accept(KIND, Script(timeline=FOREVER))
    w.clock.now += THRESHOLD + timedelta(minutes=1)  # past the stale threshold
    w.set(second, reconcile_attempts=MAX_ATTEMPTS - 1, reconcile_last_attempt_at=None)
    task2 = w.task_id(second)
    client = w.rt.client(w.rt.kind(KIND))
    real_poll = client.poll
    misses = [1]

    def poll(task_id: str, model: str | None = None) -> PollResult:
        if task_id == task2 and misses:
            misses.pop()
            return PollResult(PollStatus.NOT_FOUND)
        return real_poll(task_id, model=model)

    monkeypatch.setattr(client, "poll", poll)
    claims = batch_poll.claim(w.rt)
    assert [c.job.id for c in claims] == [first, second]
    lease = batch_poll.claim_lease(w.rt)
    real_observe = lifecycle.observe
    taken: list[batch_poll.Claim] = []

    def observe(rt: Any, job: Any, *args: Any, **kw: Any) -> Any:
        out = real_observe(rt, job, *args, **kw)
        if job.id == first:
            w.clock.now += lease * 0.1
            simulator.set_state(task2, "succeeded")
            if writer == "webhook_resume":
                assert lifecycle.resume_chain(w.rt, second)
            else:
                w.lapse("w-A")
                assert reap(w.rt).workers == ["w-A"]
            w.rt.worker_id = "w-B"
            taken.extend(batch_poll.claim(w.rt))  # B's claim; B reads after A's turn
            w.rt.worker_id = "w-A"
        return out

    monkeypatch.setattr(lifecycle, "observe", observe)
    a = batch_poll.run_claims(w.rt, claims)
    monkeypatch.setattr(lifecycle, "observe", real_observe)
    assert a.outcomes == {"completed": 1, "fenced": 1}, a.line()
    b = batch_poll.run_claims(w.rt, taken)
    assert b.outcomes == {"completed": 1}, b.line()
    assert w.job(second).status == "completed" and _completions(w, second) == 1
    assert w.refunds(second) == 0 and w.audit() == []


def test_xb_hold_claims_extends_only_the_claims_that_still_hold(world: World) -> None:
    from reconcile import jobstore

    w = world
    ids = [w.accept(KIND, Script(timeline=FOREVER)) for _ in range(3)]
    w.clock.now += INTERVAL
    claims = batch_poll.claim(w.rt)
    until = w.clock.now + timedelta(minutes=7)
    lease = batch_poll.claim_lease(w.rt)
    with w.db.begin() as s:  # the second row: a new generation (a webhook, the sweep)
        assert jobstore.start_new_chain(s, ids[1], w.clock.now, lease,
                                        poll_due_at=w.clock.now + timedelta(hours=1)) is not None
        # the third: due again at once, so another poller re-claims it
        assert jobstore.make_due_at(s, ids[2], w.clock.now)
    assert [c.job.id for c in batch_poll.claim(w.rt)] == [ids[2]]
    with w.db.begin() as s:
        held = jobstore.hold_claims(s, [(c.job.id, c.generation, c.seq) for c in claims], until)
    assert held == {ids[0]}
    assert w.job(ids[0]).poll_due_at == until and w.job(ids[0]).poll_seq == claims[0].seq
    assert w.job(ids[1]).poll_due_at != until and w.job(ids[2]).poll_due_at != until
    with w.db.begin() as s:
        assert jobstore.hold_claims(s, [], until) == set()
