"""Attacks on c1aa16f (``jobstore.unheld``: a reader without a turn of its own counts and
exhausts only while no poller holds the row; the poller's own exhaustion in ``_unfinished``).

PostgreSQL, the simulator and an injected clock (``World``). Each test states what must hold.

Liveness, new with c1aa16f (they pass on 316515c), fixed since (a reader's attempt beyond the
last one exhausts whoever holds the row: ``lifecycle.reader_claim``):
``test_a_task_that_never_finishes_is_failed_by_its_horizon[batch-crashloop]``,
``test_a_crash_looping_chain_with_heartbeats_does_not_outlive_the_horizon``.

Older than c1aa16f (they fail on 316515c too), strict xfails until a poller held the row while
storing its outputs (``lifecycle.storing_hold``, ``jobstore.hold_while_storing``): a poller
storing a success was taken for gone — its storing outlasted its turn's lease or its claim,
or its heartbeat lapsed while it was alive (the reaper ended its claim) — and a turnless
reader's stale read failed the job:
``test_chain_a_finalize_longer_than_the_poll_lease_is_not_failed_by_the_sweep``,
``test_batch_a_finalize_longer_than_the_claim_lease_is_not_failed_by_the_sweep``,
``test_batch_a_sweep_tick_after_the_reaper_released_a_slow_pollers_claim_fails_nothing[lapsed]``,
``test_batch_mode_the_reapers_own_resume_of_a_chain_row_fails_nothing``.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from reconcile import jobstore, lifecycle
from reconcile.db.models import Job, JobEvent
from reconcile.jobstore import horizon
from reconcile.lifecycle import batch as batch_poll
from reconcile.providers import PollResult, PollStatus
from reconcile.states import ATTEMPT_SPACING, MAX_ATTEMPTS
from reconcile.testing.simulator import Script, Simulator
from tests.integration._sweep_helpers import FOREVER, World

KIND = "replicate-prediction"
THRESHOLD = timedelta(minutes=20)


def _completions(w: World, job_id: uuid.UUID) -> int:
    with w.db() as s:
        return s.execute(select(func.count()).select_from(JobEvent).where(
            JobEvent.job_id == job_id, JobEvent.type == "completed")).scalar_one()


def _money(w: World, job_id: uuid.UUID, where: str) -> None:
    """The task succeeded upstream and nobody asked the job to stop: completed once, no refund."""
    job = w.job(job_id)
    assert (job.status, job.error_code, w.refunds(job_id)) == ("completed", None, 0), (
        f"{where}: status={job.status} code={job.error_code} refunds={w.refunds(job_id)} "
        f"attempts={job.reconcile_attempts}")
    assert _completions(w, job_id) == 1 and w.audit() == [], where


def _succeeded_on_its_last_attempt(w: World, monkeypatch: pytest.MonkeyPatch,
                                   job_id: uuid.UUID) -> list[str]:
    """The job's next attempt is its last and its task has succeeded upstream; returns the
    switch of :func:`_stale_reads` (non-empty: a read says "not found")."""
    w.set(job_id, reconcile_attempts=MAX_ATTEMPTS - 1, reconcile_last_attempt_at=None)
    w.sim.set_state(w.task_id(job_id), "succeeded")
    stale: list[str] = []
    _stale_reads(w, monkeypatch, job_id, stale)
    return stale


def _stale_reads(w: World, monkeypatch: pytest.MonkeyPatch, job_id: uuid.UUID,
                 stale: list[str]) -> None:
    """While ``stale`` is non-empty, a read of the job's task says "not found" (a transient
    miss) whatever the task's state."""
    task = w.task_id(job_id)
    client = w.rt.client(w.rt.kind(w.job(job_id).provider_kind or ""))
    real = client.poll

    def poll(task_id: str, model: str | None = None) -> PollResult:
        if task_id == task and stale:
            return PollResult(PollStatus.NOT_FOUND)
        return real(task_id, model=model)

    monkeypatch.setattr(client, "poll", poll)


def _slow_finalize(w: World, monkeypatch: pytest.MonkeyPatch, job_id: uuid.UUID,
                   inside: Any) -> list[str]:
    """The poller's finalize of the job (its media downloads and uploads) runs ``inside()``
    first, once: what happens elsewhere while the outputs are being stored."""
    import reconcile.lifecycle.poll as poll_mod

    real = poll_mod.finalize_job_with_media
    seen: list[str] = []

    def finalize(rt: Any, jid: uuid.UUID, result: Any, **kw: Any) -> bool:
        if jid == job_id and kw.get("source") == "poll" and not seen:
            seen.append(str(inside()))
        return real(rt, jid, result, **kw)

    monkeypatch.setattr(poll_mod, "finalize_job_with_media", finalize)
    return seen


# ------------------------------------------------------------------ 2. a poller completing


def _tick_meanwhile(w: World, stale: list[str], later: timedelta) -> Any:
    """A sweep tick ``later`` (the poller's outputs still being stored), its reads stale."""
    def tick() -> str:
        w.clock.now += later
        stale.append("on")
        report = w.tick()
        stale.clear()
        return f"{report}"
    return tick


@pytest.mark.parametrize("beat", ["lapsed", "alive"])
def test_batch_a_sweep_tick_after_the_reaper_released_a_slow_pollers_claim_fails_nothing(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, beat: str) -> None:
    """Batch mode. Poller w-A claims the job on its last attempt and reads "succeeded"; while
    it stores the outputs its heartbeat lapses (a slow worker: c1aa16f says "a lapsed heartbeat
    is no proof"). The next sweep tick reaps first — ``end_claims_of`` releases w-A's batch
    claim, ``poll_due_at`` = the past — and then, in the same tick, scans the row: it is due,
    so ``unheld(now)`` is true, the sweep claims the last attempt, reads a stale "not found"
    and exhausts the job. w-A's completion then loses. The chain twin is protected (the
    reaper's plan is ``reaped``), the batch claim the reaper releases is not. (``alive``: the
    control, w-A's heartbeat still alive at the tick: nothing is failed.)"""
    w = World(db, simulator, tmp_path, poll_mode="batch", poll_batch_threads=1,
              poll_batch_finalize_threads=1)
    w.rt.worker_id = "w-A"
    job_id = w.accept(KIND, Script(timeline=FOREVER))
    w.clock.now += THRESHOLD + timedelta(minutes=1)
    stale = _succeeded_on_its_last_attempt(w, monkeypatch, job_id)
    with w.db.begin() as s:  # w-A's heartbeat row, alive when it claims
        jobstore.register_worker(s, "w-A", "host", 1, w.clock.now,
                                 timedelta(seconds=30 if beat == "lapsed" else 600))

    seen = _slow_finalize(w, monkeypatch, job_id,
                          _tick_meanwhile(w, stale, timedelta(minutes=1)))  # the downloads take a minute: w-A's beat lapsed
    outcome = batch_poll.poll_due(w.rt, budget=60).line()
    assert len(seen) == 1, outcome
    _money(w, job_id, f"poller={outcome} tick={seen[0]}")


@pytest.mark.parametrize("kind", [KIND, "kie-lip-sync"])
def test_chain_a_finalize_longer_than_the_poll_lease_is_not_failed_by_the_sweep(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """Chain mode. The chain takes its turn on the job's last attempt and reads "succeeded";
    storing the outputs takes longer than the turn's lease (2 × interval + 15 s: 21 s for
    replicate, 45 s for lip-sync; one output fetch may take ``media_timeout`` = 120 s). A
    sweep tick meanwhile sees the lease expired, resumes the chain itself (``own``: no
    ``unheld`` fence), reads a stale "not found" and exhausts the job; the poller's completion
    loses. c1aa16f's protection (``unheld``) only lasts as long as the poll lease."""
    w = World(db, simulator, tmp_path, poll_mode="chain")
    job_id = w.accept(kind, Script(timeline=FOREVER), job_type="video")
    k = w.rt.kind(kind)
    w.clock.now += k.stale_threshold + timedelta(minutes=1)
    stale = _succeeded_on_its_last_attempt(w, monkeypatch, job_id)

    seen = _slow_finalize(w, monkeypatch, job_id,
                          _tick_meanwhile(w, stale, timedelta(seconds=60)))  # one slow media fetch, within media_timeout
    assert lifecycle.resume_chain(w.rt, job_id)
    _, generation, seq = w.q.polls.popleft()
    outcome = lifecycle.poll_step(w.rt, job_id, generation, seq)
    assert len(seen) == 1, outcome
    _money(w, job_id, f"poller={outcome} tick={seen[0]}")


def test_batch_a_finalize_longer_than_the_claim_lease_is_not_failed_by_the_sweep(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Batch mode, a live poller (no heartbeat row: nothing lapses). Its round held the claim
    once, one claim lease ahead (``claim_lease``: 4 reads' deadlines + backoff + 15 s = 245 s),
    before the per-job outcomes; a completion whose outputs take longer to store (three
    outputs, each fetch up to ``media_timeout`` = 120 s) was past its claim while it stored
    them: the row was due, ``unheld`` true, and a sweep tick exhausted it on a stale "not
    found". The round's hold now gives a success what storing its outputs needs
    (``lifecycle.storing_hold``: 3 × 240 s + 15 s)."""
    w = World(db, simulator, tmp_path, poll_mode="batch", poll_batch_threads=1,
              poll_batch_finalize_threads=1)
    job_id = w.accept(KIND, Script(timeline=FOREVER, outputs=3))
    w.clock.now += THRESHOLD + timedelta(minutes=1)
    stale = _succeeded_on_its_last_attempt(w, monkeypatch, job_id)

    seen = _slow_finalize(w, monkeypatch, job_id,
                          _tick_meanwhile(w, stale, timedelta(minutes=5)))
    outcome = batch_poll.poll_due(w.rt, budget=60).line()
    assert len(seen) == 1, outcome
    _money(w, job_id, f"poller={outcome} tick={seen[0]}")


def test_batch_a_completion_queued_behind_another_holds_its_row_again(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Batch mode, one finalize thread, two completions read in one round, both on their last
    attempt. The first one's storing takes 200 s; a sweep tick 100 s into the second's own
    storing (300 s after the round's hold) reads stale. The round's grouped hold marked the
    second until its storing may have ended behind the first (255 s + 255 s), so it needs no
    statement of its own and the tick fails nothing. With one claim lease for each (before
    52e6f18), or 255 s from the round's hold, the row was due again and the stale read
    exhausted it."""
    w = World(db, simulator, tmp_path, poll_mode="batch", poll_batch_threads=2,
              poll_batch_finalize_threads=1)
    first, second = (w.accept(KIND, Script(timeline=FOREVER)) for _ in range(2))
    w.clock.now += THRESHOLD + timedelta(minutes=1)
    stale = _succeeded_on_its_last_attempt(w, monkeypatch, second)
    w.set(first, reconcile_attempts=MAX_ATTEMPTS - 1, reconcile_last_attempt_at=None)
    w.sim.set_state(w.task_id(first), "succeeded")
    import reconcile.lifecycle.poll as poll_mod

    real = poll_mod.finalize_job_with_media
    seen: list[str] = []

    def finalize(rt: Any, jid: uuid.UUID, result: Any, **kw: Any) -> bool:
        if jid == first:
            w.clock.now += timedelta(seconds=200)
        elif jid == second and not seen:
            seen.append(_tick_meanwhile(w, stale, timedelta(seconds=100))())
        return real(rt, jid, result, **kw)

    monkeypatch.setattr(poll_mod, "finalize_job_with_media", finalize)
    held: list[uuid.UUID] = []
    real_hold = jobstore.hold_while_storing

    def hold(session: Any, job_id: uuid.UUID, *args: Any) -> bool:
        held.append(job_id)
        return real_hold(session, job_id, *args)

    monkeypatch.setattr(jobstore, "hold_while_storing", hold)
    outcome = batch_poll.poll_due(w.rt, budget=60)
    assert outcome.outcomes == {"completed": 2}, outcome.line()
    assert held == [], "the grouped hold covered both storings, the wait included"
    assert w.job(second).storing_until is not None
    _money(w, second, f"poller={outcome.line()} tick={seen}")
    _money(w, first, outcome.line())


@pytest.mark.parametrize("mode", ["chain", "batch"])
def test_a_storing_mark_moves_a_pollers_hold_only_under_its_claim(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path, mode: str) -> None:
    """``hold_while_storing`` always marks the row (``storing_until``, never moved back), but
    moves the poller's hold (the lease; on a batch row the due
    time too) only under its own turn or claim: once another poller's turn or claim took the
    row, that holder keeps its own lease and due time. On a chain row ``poll_due_at`` stays
    NULL (a due time would hand the row to the batch poller). ``end_storing`` puts back what
    the mark covered, only while the row carries that mark. A job no longer in flight is not
    marked."""
    w = World(db, simulator, tmp_path, poll_mode=mode)
    job_id = w.accept(KIND, Script(timeline=FOREVER))
    job = w.job(job_id)
    claim = (job.poll_generation, job.poll_seq)
    now = w.clock.now
    until = now + timedelta(minutes=10)
    with w.db.begin() as s:
        assert jobstore.hold_while_storing(s, job_id, until, claim=claim, now=now)
    after = w.job(job_id)
    assert (after.poll_lease_expires_at, after.storing_until, after.storing_count) == (
        until, until, 1)
    assert after.poll_due_at == (None if mode == "chain" else until)
    later = now + timedelta(seconds=30)  # another poller's turn or claim since
    w.set(job_id, poll_seq=job.poll_seq + 1, poll_lease_expires_at=later,
          poll_due_at=None if mode == "chain" else later)
    with w.db.begin() as s:  # two more storers join the lasting mark without stretching it
        assert jobstore.hold_while_storing(s, job_id, until + timedelta(minutes=10),
                                           claim=claim, now=now)
        assert jobstore.hold_while_storing(s, job_id, until, now=now)
        # a storer counted already (a round's grouped hold) moves its own mark later
        assert jobstore.hold_while_storing(s, job_id, until + timedelta(minutes=10), now=now,
                                           counted=True)
    again = w.job(job_id)
    assert (again.poll_lease_expires_at, again.poll_due_at, again.storing_until,
            again.storing_count) == (later, None if mode == "chain" else later,
                                     until + timedelta(minutes=10), 3)

    def free(at: Any) -> bool:
        with w.db() as s:
            return s.execute(select(func.count()).select_from(Job).where(
                Job.id == job_id, jobstore.not_storing(at))).scalar_one() == 1

    # the failure at the horizon waits while one storer is counted under a live mark
    for left in (2, 1):
        with w.db.begin() as s:
            assert jobstore.end_storing(s, job_id)
        assert (w.job(job_id).storing_count, free(now)) == (left, False)
    with w.db.begin() as s:
        assert jobstore.end_storing(s, job_id) and jobstore.end_storing(s, job_id)
    assert (w.job(job_id).storing_count, free(now)) == (0, True)  # never below none
    assert free(until + timedelta(minutes=10))  # an ended mark holds nothing
    with w.db.begin() as s:  # the first storer after the mark ended counts one again
        assert jobstore.hold_while_storing(s, job_id, until + timedelta(minutes=30),
                                           now=until + timedelta(minutes=20))
    assert w.job(job_id).storing_count == 1
    w.set(job_id, status="completed")
    with w.db.begin() as s:
        assert not jobstore.hold_while_storing(s, job_id, until, now=now)


@pytest.mark.parametrize("mode", ["chain", "batch"])
def test_a_worker_that_dies_while_storing_is_taken_over_at_once_and_fails_nothing(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """Worker w-A (heartbeats on) reads "succeeded" on the job's last attempt and dies while
    storing the outputs. The storing mark does not slow recovery: 10 s later its heartbeat has
    lapsed, the reaper ends its hold (chain: resumed; batch: released, due now) and the next
    poller runs at once. That poller's read is stale ("not found") on an exhausted job: under
    the mark it fails nothing. Its next read, past the mark, completes the job once."""
    import reconcile.lifecycle.poll as poll_mod
    from reconcile.sweep.liveness import reap

    w = World(db, simulator, tmp_path, poll_mode=mode, poll_batch_threads=1,
              poll_batch_finalize_threads=1)
    job_id = w.accept(KIND, Script(timeline=FOREVER))
    w.clock.now += THRESHOLD + timedelta(minutes=1)
    stale = _succeeded_on_its_last_attempt(w, monkeypatch, job_id)
    with w.db.begin() as s:
        jobstore.register_worker(s, "w-A", "host", 1, w.clock.now, timedelta(seconds=6))
    w.rt.worker_id = "w-A"
    real = poll_mod.finalize_job_with_media

    def dies(*a: Any, **kw: Any) -> bool:
        raise _Died("storing")

    monkeypatch.setattr(poll_mod, "finalize_job_with_media", dies)
    with pytest.raises(_Died):
        if mode == "chain":
            assert lifecycle.resume_chain(w.rt, job_id)
            _, generation, seq = w.q.polls.popleft()
            lifecycle.poll_step(w.rt, job_id, generation, seq)
        else:
            w.set(job_id, poll_due_at=w.clock.now)
            batch_poll.poll_due(w.rt, budget=60)
    w.rt.worker_id = None
    monkeypatch.setattr(poll_mod, "finalize_job_with_media", real)
    mark = w.clock.now + lifecycle.storing_hold(w.rt.settings, 1)
    assert w.job(job_id).storing_until == mark

    def poll_now() -> str:
        if mode == "chain":
            outcomes = []
            while w.q.polls:
                _, generation, seq = w.q.polls.popleft()
                outcomes.append(lifecycle.poll_step(w.rt, job_id, generation, seq))
            return ",".join(outcomes)
        return batch_poll.poll_due(w.rt, budget=60).line()

    w.clock.now += timedelta(seconds=10)  # w-A's heartbeat lapsed
    stale.append("on")  # every read now is stale, the reaper's own included
    report = reap(w.rt)
    assert report.workers == ["w-A"], report.line()
    first = f"{report.line()} {poll_now()}"  # at once, on an exhausted job: nothing fails
    stale.clear()
    job = w.job(job_id)
    assert (job.status, w.refunds(job_id)) == ("processing", 0), first
    assert job.reconcile_attempts >= MAX_ATTEMPTS, first
    w.clock.now = mark + timedelta(seconds=1)
    if mode == "chain":
        w.tick()  # the chain's next turn was sent; the sweep resumes whatever is left
    else:
        w.set(job_id, poll_due_at=w.clock.now)
    second = poll_now()
    _money(w, job_id, f"{mode}: {first} / {second}")


# ------------------------------------------------------------------ 1. liveness


class _Died(BaseException):
    """The worker process died here (SIGKILL, OOM): nothing after it runs."""


def _die_at(point: str) -> Any:
    def hook(name: str) -> None:
        if name == point:
            raise _Died(name)
    return hook


_worker_no = [0]


def _new_worker(w: World, heartbeat: bool) -> str | None:
    """A fresh worker process; with ``heartbeat`` its row is registered with a 6 s timeout
    (it dies right after, so its heartbeat has lapsed by the next tick)."""
    if not heartbeat:
        return None
    _worker_no[0] += 1
    worker = f"w-{_worker_no[0]}-{uuid.uuid4().hex[:6]}"
    with w.db.begin() as s:
        jobstore.register_worker(s, worker, "host", 1, w.clock.now, timedelta(seconds=6))
    return worker


def _poller(w: World, mode: str, behaviour: str) -> None:
    """What the pollers do during one sweep interval."""
    if mode == "chain":
        if behaviour == "lost":
            w.lose_messages()
            return
        for job_id, generation, seq in list(w.q.polls):
            w.q.polls.popleft()
            if behaviour == "runs":
                w.rt.worker_id = None
                lifecycle.poll_step(w.rt, job_id, generation, seq)
                continue
            # crashloop: the worker takes the turn and dies before its read
            w.rt.worker_id = _new_worker(w, behaviour.endswith("_hb"))
            w.rt.crash_hook = _die_at("mid_poll")
            try:
                lifecycle.poll_step(w.rt, job_id, generation, seq)
            except _Died:
                pass
            finally:
                w.rt.crash_hook, w.rt.worker_id = None, None
        return
    w.lose_messages()
    if behaviour == "never":
        return
    if behaviour == "runs":
        w.rt.worker_id = None
        batch_poll.poll_due(w.rt, budget=60)
        return
    # crashloop: a worker claims what is due and dies before any read
    w.rt.worker_id = _new_worker(w, behaviour.endswith("_hb"))
    w.rt.crash_hook = _die_at("mid_batch")
    try:
        batch_poll.poll_due(w.rt, budget=60)
    except _Died:
        pass
    finally:
        w.rt.crash_hook, w.rt.worker_id = None, None


def _webhook(w: World, job_id: uuid.UUID) -> None:
    from reconcile.webhook_ingest import _confirm

    job = w.job(job_id)
    if job.status not in ("pending", "processing"):
        return
    event = SimpleNamespace(failed=False, signed_body=b"", status="processing", error=None)
    _confirm(w.rt, job, w.rt.kind(job.provider_kind or ""), event)


def _run_until_failed(w: World, job_id: uuid.UUID, mode: str, behaviour: str, *,
                      webhook: bool = False, spacings: int = 3) -> str:
    """Tick every (scaled) minute, pollers first, until the job is failed or its exhaustion
    horizon plus ``spacings`` attempt spacings has passed; the failure (or why not)."""
    scaled = w.rt.settings.scaled
    deadline = horizon.exhaustion_deadline(w.rt.settings, w.job(job_id))
    assert deadline is not None
    limit = deadline + spacings * scaled(ATTEMPT_SPACING)
    while w.clock.now <= limit and w.job(job_id).status in ("pending", "processing"):
        w.clock.now += scaled(timedelta(minutes=1))
        _poller(w, mode, behaviour)
        w.tick()
        if webhook:
            _webhook(w, job_id)
    job = w.job(job_id)
    return (f"{mode}/{behaviour}: {job.status} at {w.clock.now - deadline} past its horizon, "
            f"attempts={job.reconcile_attempts} due={job.poll_due_at} "
            f"lease={job.poll_lease_expires_at} now={w.clock.now}")


def _assert_exhausted(w: World, job_id: uuid.UUID, where: str) -> None:
    job = w.job(job_id)
    assert job.status == "failed", where
    assert w.refunds(job_id) == 1 and w.audit() == [], where
    assert w.anomalies(job_id, "reconcile_exhausted") == ["reconcile_exhausted"], where


BEHAVIOURS = [("chain", b) for b in ("runs", "lost", "crashloop", "crashloop_hb")] + \
    [("batch", b) for b in ("runs", "never", "crashloop", "crashloop_hb")]


@pytest.mark.parametrize("mode,behaviour", BEHAVIOURS)
def test_a_task_that_never_finishes_is_failed_by_its_horizon(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path, mode: str,
        behaviour: str) -> None:
    """A task that runs forever, its pollers running every tick / lost / never running /
    crash-looping (each worker takes the turn or claims the due row, then dies before its
    read; ``_hb``: every worker has a heartbeat row, which lapses). The job is failed and
    refunded once, by its exhaustion horizon plus three attempt spacings."""
    w = World(db, simulator, tmp_path, poll_mode=mode)
    job_id = w.accept(KIND, Script(timeline=FOREVER))
    where = _run_until_failed(w, job_id, mode, behaviour)
    _assert_exhausted(w, job_id, where)


def test_a_crash_looping_chain_with_heartbeats_does_not_outlive_the_horizon(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """The default liveness settings (a beat every 2 s, a 6 s timeout) and a poison job: every
    worker that takes its turn (chain) or claims it (batch) dies before its read (its process
    is killed; the broker hands the next message to a fresh worker). Every 3 s a live worker's
    beat runs the reaper (``reconcile.worker.heartbeat``), which ends the dead worker's claim:
    chain mode — its plan resumes the chain (``reaped``: its read never exhausts) and the next
    worker takes the turn and dies; batch mode — the row is due and the next worker claims it
    within the poll tick. The sweep ticks every minute. The task never finishes: the job must
    be failed and refunded by its horizon plus three spacings.

    Chain mode: the row always carries a live lease at a sweep tick (the dead worker's turn,
    21 s, or the reaper's resume, 21 s; the cycle is ~9 s), so the sweep never resumes it
    itself (``own``) and its reads never exhaust; the reaper's never do (``reaped``); no
    worker lives to read. Before c1aa16f the sweep's / reaper's read exhausted it. (Batch mode
    with heartbeats is phase-dependent: the tick's own reap must land in the ~2 s between the
    holder's lapse and a live worker's reap; without heartbeats it never exhausts:
    ``test_a_task_that_never_finishes_is_failed_by_its_horizon[batch-crashloop]``.)"""
    from reconcile.sweep.liveness import reap

    mode = "chain"

    w = World(db, simulator, tmp_path, poll_mode=mode)
    job_id = w.accept(KIND, Script(timeline=FOREVER))
    scaled = w.rt.settings.scaled
    deadline = horizon.exhaustion_deadline(w.rt.settings, w.job(job_id))
    assert deadline is not None
    limit = deadline + 3 * scaled(ATTEMPT_SPACING)
    step, elapsed = timedelta(seconds=3), timedelta(0)
    while w.clock.now <= limit and w.job(job_id).status in ("pending", "processing"):
        w.clock.now += step
        elapsed += step
        reap(w.rt)  # a live worker's beat
        _poller(w, mode, "crashloop_hb")
        if elapsed >= timedelta(minutes=1):
            elapsed = timedelta(0)
            w.tick()
    job = w.job(job_id)
    where = (f"{mode}: {job.status} at {w.clock.now - deadline} past its horizon, "
             f"attempts={job.reconcile_attempts} generation={job.poll_generation}")
    _assert_exhausted(w, job_id, where)


LIVE_KINDS = ["kie-lip-sync", "replicate-prediction", "fal-queue", "elevenlabs-async"]


# every kind at time scale 1; the scaled clock on the longest kind only (the rule is the same)
@pytest.mark.parametrize("kind,scale", [*((k, 1.0) for k in LIVE_KINDS), ("kie-lip-sync", 0.01)])
@pytest.mark.parametrize("mode,behaviour", [("chain", "runs"), ("chain", "lost"),
                                            ("batch", "runs"), ("batch", "never")])
def test_every_kind_and_scale_with_processing_webhooks_every_minute(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path, mode: str,
        behaviour: str, kind: str, scale: float) -> None:
    """Each kind family's lease / threshold, at time scale 1 and 0.01, a webhook saying
    "processing" every (scaled) minute (its confirming read fenced by ``unheld``), the pollers
    running or not: the job is failed and refunded by its horizon plus three spacings."""
    w = World(db, simulator, tmp_path, poll_mode=mode, time_scale=scale,
              legacy_sweep="observe")
    job_id = w.accept(kind, Script(timeline=FOREVER), job_type="video")
    where = _run_until_failed(w, job_id, mode, behaviour, webhook=True)
    _assert_exhausted(w, job_id, where)


def _platform_task(w: World, kind: str) -> uuid.UUID:
    from reconcile.providers import CreateRequest

    client = w.rt.client(w.rt.kind(kind))
    job_id = uuid.uuid4()
    w.sim.script(str(job_id), Script(timeline=FOREVER))
    created = client.create(CreateRequest(model="m/x", input={"prompt": "p"}, job_id=str(job_id),
                                          webhook_url=w.rt.webhook_url(
                                              w.rt.kind(kind).provider, job_id)))
    w.platform_row(id=job_id, provider_kind=kind, provider_task_id=created.task_id,
                   provider_call_started_at=w.clock.now)
    return job_id


@pytest.mark.parametrize("legacy", ["observe", "enforce"])
@pytest.mark.parametrize("mode,behaviour", [("chain", "runs"), ("chain", "lost"),
                                            ("chain", "crashloop"), ("batch", "runs"),
                                            ("batch", "never")])
def test_a_platform_row_with_a_task_that_never_finishes(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path, mode: str,
        behaviour: str, legacy: str) -> None:
    """A platform row (no ``submission_state``) of a known async kind with a task id that
    never finishes: the sweep adopts it past its threshold and it is failed by its horizon."""
    w = World(db, simulator, tmp_path, poll_mode=mode, legacy_sweep=legacy)
    job_id = _platform_task(w, KIND)
    where = _run_until_failed(w, job_id, mode, behaviour, spacings=4)
    _assert_exhausted(w, job_id, where)


@pytest.mark.parametrize("switch", ["batch>chain", "chain>batch", "batch>chain>batch",
                                    "chain>batch>chain"])
@pytest.mark.parametrize("behaviour", ["runs", "dead"])
def test_a_row_switched_between_modes(db: sessionmaker[Session], simulator: Simulator,
                                      tmp_path: Path, switch: str, behaviour: str) -> None:
    """The deployment switches ``POLL_MODE`` while the job is in flight (``poll_due_at`` left
    set by batch mode, a chain lease left by chain mode), every 30 scaled minutes; pollers
    running or none (``dead``: chain messages lost, no batch poller). Failed by the horizon of
    the last mode plus four spacings."""
    modes = switch.split(">")
    worlds = {m: World(db, simulator, tmp_path / m, poll_mode=m) for m in set(modes)}
    first = worlds[modes[0]]
    for other in worlds.values():
        other.clock = first.clock
        other.rt.clock = first.clock
    job_id = first.accept(KIND, Script(timeline=FOREVER))
    deadline = horizon.exhaustion_deadline(first.rt.settings, first.job(job_id))
    assert deadline is not None
    limit = deadline + 4 * first.rt.settings.scaled(ATTEMPT_SPACING)
    minute = 0
    while first.clock.now <= limit and first.job(job_id).status in ("pending", "processing"):
        mode = modes[min(minute // 30, len(modes) - 1)]
        w = worlds[mode]
        w.clock.now += timedelta(minutes=1)
        minute += 1
        for other in worlds.values():  # messages of the other mode's processes are gone
            if other is not w:
                other.lose_messages()
        _poller(w, mode, {"chain": "runs" if behaviour == "runs" else "lost",
                          "batch": "runs" if behaviour == "runs" else "never"}[mode])
        w.tick()
    job = first.job(job_id)
    where = (f"{switch}/{behaviour}: {job.status} at {first.clock.now - deadline} past, "
             f"attempts={job.reconcile_attempts} due={job.poll_due_at}")
    _assert_exhausted(first, job_id, where)


# ------------------------------------------------------------------ 3. partial settlement


def _given_back(w: World, job_id: uuid.UUID) -> list[tuple[str, int]]:
    """The job's REFUND / RELEASE transactions: (type, credits given back)."""
    from reconcile.db.models import CreditTransaction

    with w.db() as s:
        rows = s.execute(select(CreditTransaction).where(
            CreditTransaction.job_id == job_id,
            CreditTransaction.type.in_(("REFUND", "RELEASE")))).scalars().all()
        return [(r.type, abs(int(r.amount))) for r in rows]


@pytest.mark.parametrize("path", ["chain_after_sweep", "sweep_own", "batch_after_sweep",
                                  "webhook", "batch_poller"])
def test_exhaustion_settles_by_the_failure_share_once(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path, path: str) -> None:
    """failure_refund 1/3, cancel_refund 1/2. The job's last attempt is spent and the job
    exhausted by each home of the exhaustion: a live chain in its own turn after the sweep's
    read (held: it counted the attempt, failed nothing), the sweep's own resume of a dead
    chain, the batch poller after the sweep's read of its scheduled row, a webhook's
    confirming read, the batch poller's own count. The failure's share is kept exactly once
    and the audit is clean; later ticks change nothing."""
    from reconcile.settlement import kept_of
    from reconcile.webhook_ingest import _confirm

    mode = "batch" if path.startswith("batch") else "chain"
    w = World(db, simulator, tmp_path, poll_mode=mode, failure_refund="1/3",
              cancel_refund="1/2")
    job_id = w.accept(KIND, Script(timeline=FOREVER))
    before = sum(w.pools(w.user))
    w.clock.now += THRESHOLD + timedelta(minutes=1)
    w.set(job_id, reconcile_attempts=MAX_ATTEMPTS - 1, reconcile_last_attempt_at=None)
    if path == "chain_after_sweep":
        assert lifecycle.resume_chain(w.rt, job_id)  # a live chain, its message queued
        w.tick()
        assert w.job(job_id).status == "processing"  # the sweep left the exhaustion to it
        assert w.job(job_id).reconcile_attempts == MAX_ATTEMPTS
        _poller(w, "chain", "runs")
    elif path == "sweep_own":
        w.tick()
    elif path == "batch_after_sweep":
        w.set(job_id, poll_due_at=w.clock.now + timedelta(seconds=2))  # scheduled: held
        w.tick()
        assert w.job(job_id).status == "processing"
        w.clock.now += timedelta(seconds=3)
        _poller(w, "batch", "runs")
    elif path == "webhook":
        job = w.job(job_id)
        event = SimpleNamespace(failed=False, signed_body=b"", status="processing", error=None)
        _confirm(w.rt, job, w.rt.kind(KIND), event)
    else:
        w.set(job_id, poll_due_at=w.clock.now)
        _poller(w, "batch", "runs")
    job = w.job(job_id)
    assert job.status == "failed", (path, job.reconcile_attempts)
    kept = kept_of(40, Fraction(1, 3))
    assert job.credits_actual == kept, (path, job.credits_actual)
    for _ in range(3):
        w.clock.now += timedelta(minutes=5)
        w.tick()
    assert w.job(job_id).credits_actual == kept
    assert _given_back(w, job_id) == [("RELEASE", 40 - kept)] and w.audit() == [], path
    assert sum(w.pools(w.user)) - before == 40 - kept, path  # measured while 40 were held
    assert w.anomalies(job_id, "reconcile_exhausted") == ["reconcile_exhausted"], path


@pytest.mark.parametrize("reader", ["reap", "tick"])
def test_batch_mode_the_reapers_own_resume_of_a_chain_row_fails_nothing(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, reader: str) -> None:
    """Batch mode, a row still polled by its chain (a message sent before the switch to batch:
    ``poll_due_at`` NULL, the chain's lease live, ``claimed_by`` w-A). w-A takes the turn on the
    job's last attempt and reads "succeeded"; while it stores the outputs its heartbeat lapses.
    The reaper (alone, or as the sweep tick's first step) ends the chain's lease and plans it
    (``reaped``: its read must leave the exhaustion to the poller) — but in batch mode its
    resume is ``make_due``, ``poll_due_at`` = now, and ``unheld(now)`` holds for a due batch
    row: the reaper's stale "not found" exhausts the job and w-A's completion loses."""
    from reconcile.sweep.liveness import reap

    w = World(db, simulator, tmp_path, poll_mode="batch")
    job_id = w.accept(KIND, Script(timeline=FOREVER))
    w.clock.now += THRESHOLD + timedelta(minutes=1)
    w.set(job_id, reconcile_attempts=MAX_ATTEMPTS - 1, reconcile_last_attempt_at=None,
          poll_due_at=None)
    w.sim.set_state(w.task_id(job_id), "succeeded")
    stale: list[str] = []
    _stale_reads(w, monkeypatch, job_id, stale)
    with w.db.begin() as s:
        jobstore.register_worker(s, "w-A", "host", 1, w.clock.now, timedelta(seconds=6))

    def reap_meanwhile() -> str:
        w.clock.now += timedelta(seconds=10)  # w-A's beat lapsed; its lease (21 s) has not
        stale.append("on")
        out = reap(w.rt).line() if reader == "reap" else str(w.tick())
        stale.clear()
        return out

    seen = _slow_finalize(w, monkeypatch, job_id, reap_meanwhile)
    job = w.job(job_id)
    w.rt.worker_id = "w-A"
    outcome = lifecycle.poll_step(w.rt, job_id, job.poll_generation, job.poll_seq)
    w.rt.worker_id = None
    assert len(seen) == 1, outcome
    _money(w, job_id, f"poller={outcome} reader={seen[0]}")
