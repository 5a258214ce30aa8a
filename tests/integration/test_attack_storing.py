"""Attacks on 52e6f18 (a poller held the row while it stored a success it read:
``lifecycle.storing_hold``, ``jobstore.hold_while_storing``, the batch round's per-row grouped
hold), and on what replaced it: the storing mark ``jobs.storing_until`` that whoever reads
"succeeded" sets before storing, under which no read that is no verdict exhausts the job.

PostgreSQL (and SQLite where named), the simulator and an injected clock (``World``). Each test
states what must hold. The money rule: a task that succeeded upstream (nobody asked the job to
stop) ends ``completed`` exactly once, no refund, the audit clean. The adversary is the one the
existing attack files use: a transient stale read ("not found") by one reader while the task
has succeeded.

Findings against 52e6f18, fixed by the storing mark (they fail there):

* ``test_a_turnless_readers_success_is_not_exhausted_by_a_pollers_stale_read`` — the sweep
  that read "succeeded" stored it holding nothing; a poller that took the row meanwhile read
  stale and exhausted the job.
* ``test_a_webhooks_confirmed_success_keeps_a_storing_pollers_hold`` — a webhook's confirmed
  success resumed the chain unconditionally: a new generation replaced the storing poller's
  hold, and the next stale read exhausted the job.
* ``test_batch_a_completion_queued_past_its_grouped_hold_is_not_exhausted`` — a success queued
  behind a longer completion of its round outlived its grouped hold before its own turn.
* ``test_hold_while_storing_keeps_the_instant_of_an_aware_time_on_sqlite`` — on SQLite a bare
  bind in the hold's ``CASE`` stored a non-UTC aware time as its wall clock.
* ``test_a_media_timeout_past_its_bound_is_refused_with_a_clear_error`` — an unbounded
  ``media_timeout`` overflowed ``now + storing_hold`` (the chain errored on every success, a
  batch round raised).

Strict xfails, known and left (see their reasons): a chain read slower than its turn's lease
(older), ``TIME_SCALE`` scaling the storing bound but not the fetch's own timeout (test and
demo worlds only), a success whose storing kills its worker every time (older: a success read
counts no attempt).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session, sessionmaker

from reconcile import jobstore, lifecycle, operator
from reconcile.errors import ErrorCode, MediaExpired, MediaFetchFailed, MediaTooLarge
from reconcile.lifecycle import batch as batch_poll
from reconcile.providers import PollResult, PollStatus
from reconcile.states import MAX_ATTEMPTS
from reconcile.testing.simulator import Script, Simulator
from tests.conftest import PgDatabases
from tests.integration._platform_db import clean_sessions, platform_database
from tests.integration._sweep_helpers import FOREVER, World
from tests.integration.test_attack_unheld import (
    _die_at,
    _Died,
    _money,
    _slow_finalize,
    _succeeded_on_its_last_attempt,
    _tick_meanwhile,
)

KIND = "replicate-prediction"
THRESHOLD = timedelta(minutes=20)  # replicate's stale threshold
ADMIN = operator.Operator("ops@example.test", via="console")
SUCCEEDS = ((0.0, "queued"), (0.0, "succeeded"))


def _world(db: sessionmaker[Session], sim: Simulator, tmp: Path, mode: str,
           **settings: Any) -> World:
    return World(db, sim, tmp, poll_mode=mode, **{"poll_batch_threads": 1,
                                                 "poll_batch_finalize_threads": 1, **settings})


def _poll_once(w: World, mode: str, job_id: uuid.UUID) -> str:
    """The job's poller runs once: chain — a live chain's turn (resumed, its message run);
    batch — the row due now, one ``poll_due``."""
    if mode == "batch":
        w.set(job_id, poll_due_at=w.clock.now - timedelta(seconds=1))
        return batch_poll.poll_due(w.rt, budget=60).line()
    assert lifecycle.resume_chain(w.rt, job_id)
    _, generation, seq = w.q.polls.popleft()
    return lifecycle.poll_step(w.rt, job_id, generation, seq)


def _switchable_reads(w: World, monkeypatch: pytest.MonkeyPatch, job_id: uuid.UUID,
                      stale: list[Any]) -> None:
    """While ``stale`` is non-empty, a read of the job's task returns ``stale[-1]`` (a
    ``PollResult``; the string "on": "not found") whatever the task's state."""
    task = w.task_id(job_id)
    client = w.rt.client(w.rt.kind(w.job(job_id).provider_kind or ""))
    real = client.poll

    def poll(task_id: str, model: str | None = None) -> PollResult:
        if task_id == task and stale:
            found = stale[-1]
            return found if isinstance(found, PollResult) else PollResult(PollStatus.NOT_FOUND)
        return real(task_id, model=model)

    monkeypatch.setattr(client, "poll", poll)


def _last_attempt_succeeded(w: World, monkeypatch: pytest.MonkeyPatch,
                            job_id: uuid.UUID) -> list[Any]:
    w.set(job_id, reconcile_attempts=MAX_ATTEMPTS - 1, reconcile_last_attempt_at=None)
    w.sim.set_state(w.task_id(job_id), "succeeded")
    stale: list[Any] = []
    _switchable_reads(w, monkeypatch, job_id, stale)
    return stale


def _hold_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[uuid.UUID, datetime, bool]]:
    """Every ``jobstore.hold_while_storing`` statement: (job, until, won)."""
    calls: list[tuple[uuid.UUID, datetime, bool]] = []
    real = jobstore.hold_while_storing

    def hold(session: Any, job_id: uuid.UUID, until: datetime, **kw: Any) -> bool:
        won = real(session, job_id, until, **kw)
        calls.append((job_id, until, won))
        return won

    monkeypatch.setattr(jobstore, "hold_while_storing", hold)
    return calls


# ====================================================================== findings (they fail)


@pytest.mark.parametrize("mode", ["batch", "chain"])
def test_a_turnless_readers_success_is_not_exhausted_by_a_pollers_stale_read(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """The mirror image of the case 52e6f18 closed. The job's next attempt is its last, its
    task has succeeded. A sweep tick polls it (the ``accepted`` row: its claim counts the last
    attempt), reads "succeeded" and stores the outputs — under a ``ReaderClaim``, so it holds
    nothing. Five seconds in, the job's poller takes the row (batch: the row is due, a
    ``poll_due`` claims it; chain: the live chain's next turn) and reads a stale "not found":
    its count loses the spacing CAS, the job is exhausted (``_unfinished``: the sweep "left
    the exhaustion to the poller"), and the sweep's completion loses.

    Must hold: completed once, no refund. Happens: failed UPSTREAM_TASK_NOT_FOUND, refunded."""
    w = _world(db, simulator, tmp_path, mode)
    job_id = w.accept(KIND, Script(timeline=FOREVER))
    w.clock.now += THRESHOLD + timedelta(minutes=1)
    if mode == "batch":
        w.set(job_id, poll_due_at=w.clock.now - timedelta(seconds=1))
    else:
        assert lifecycle.resume_chain(w.rt, job_id)  # a live chain, its next turn queued
    stale = _last_attempt_succeeded(w, monkeypatch, job_id)
    import reconcile.lifecycle.poll as poll_mod

    real = poll_mod.finalize_job_with_media
    poller: list[str] = []

    def finalize(rt: Any, jid: uuid.UUID, result: Any, **kw: Any) -> bool:
        if jid == job_id and kw.get("source") == "sweep" and not poller:
            poller.append("")
            w.clock.now += timedelta(seconds=5)
            stale.append("on")
            if mode == "batch":
                poller[0] = batch_poll.poll_due(w.rt, budget=60).line()
            else:
                _, generation, seq = w.q.polls.popleft()
                poller[0] = lifecycle.poll_step(w.rt, job_id, generation, seq)
            stale.clear()
        return real(rt, jid, result, **kw)

    monkeypatch.setattr(poll_mod, "finalize_job_with_media", finalize)
    report = w.tick()
    assert poller, report
    _money(w, job_id, f"sweep={[a.outcome for a in report.actions]} poller={poller[0]}")


@pytest.mark.parametrize("mode", ["batch", "chain"])
def test_a_webhooks_confirmed_success_keeps_a_storing_pollers_hold(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """The poller reads "succeeded" on the job's last attempt and holds the row for
    storing_hold (255 s). Ten seconds in, the provider's "succeeded" webhook arrives (the usual
    moment for it): its confirming read says succeeded, and ``_confirm`` calls
    ``resume_chain(rt, job_id)`` — unconditionally, so a new generation replaces the hold
    (chain: a 21 s lease; batch: due now). The new generation's message is late (chain) / no
    claim ran yet (batch); a sweep tick 50 s later finds the row unheld (chain: lease expired,
    its own resume; batch: due) and its stale read exhausts the job; the poller's completion
    loses.

    Must hold: completed once, no refund (the webhook only confirmed what the poller stores).
    Happens: failed UPSTREAM_TASK_NOT_FOUND, refunded."""
    from reconcile.webhook_ingest import _confirm

    w = _world(db, simulator, tmp_path, mode)
    job_id = w.accept(KIND, Script(timeline=FOREVER))
    w.clock.now += THRESHOLD + timedelta(minutes=1)
    stale = _last_attempt_succeeded(w, monkeypatch, job_id)

    def meanwhile() -> str:
        w.clock.now += timedelta(seconds=10)
        answer = _confirm(w.rt, w.job(job_id), w.rt.kind(KIND), SimpleNamespace(
            failed=False, signed_body=b"", status="succeeded", error=None))
        w.lose_messages()  # the resumed chain's first turn is late
        w.clock.now += timedelta(seconds=50)
        stale.append("on")
        report = w.tick()
        stale.clear()
        return f"webhook={answer} sweep={[a.outcome for a in report.actions]}"

    seen = _slow_finalize(w, monkeypatch, job_id, meanwhile)
    outcome = _poll_once(w, mode, job_id)
    assert seen, outcome
    _money(w, job_id, f"poller={outcome} {seen[0]}")


def test_batch_a_completion_queued_past_its_grouped_hold_is_not_exhausted(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Batch mode, one finalize thread (the same with N threads and more than N completions in
    a round). Two successes read in one round: A (3 outputs: storing_hold 735 s) first, B (1
    output, its last attempt: 255 s) queued behind it. A's storing takes 400 s (within its
    hold). B's grouped hold ends at 255 s: from then until its own turn re-holds it
    (``_hold_while_storing``), B's row is due, ``unheld`` — a sweep tick at +300 s claims B's
    last attempt, reads stale and exhausts it. B's turn then finds the hold refused and its
    completion loses. (The existing test covers a wait shorter than the grouped hold.)

    Must hold: both completed once, no refund. Happens: B failed UPSTREAM_TASK_NOT_FOUND."""
    w = _world(db, simulator, tmp_path, "batch", poll_batch_threads=2)
    first = w.accept(KIND, Script(timeline=FOREVER, outputs=3))
    second = w.accept(KIND, Script(timeline=FOREVER))
    w.clock.now += THRESHOLD + timedelta(minutes=1)
    stale = _last_attempt_succeeded(w, monkeypatch, second)
    w.sim.set_state(w.task_id(first), "succeeded")
    w.set(first, poll_due_at=w.clock.now - timedelta(seconds=2))  # claimed first
    w.set(second, poll_due_at=w.clock.now - timedelta(seconds=1))
    import reconcile.lifecycle.poll as poll_mod

    real = poll_mod.finalize_job_with_media
    seen: list[str] = []

    def finalize(rt: Any, jid: uuid.UUID, result: Any, **kw: Any) -> bool:
        if jid == first and kw.get("source") == "poll" and not seen:
            seen.append("")
            seen[0] = _tick_meanwhile(w, stale, timedelta(seconds=300))()
            w.clock.now += timedelta(seconds=100)
        return real(rt, jid, result, **kw)

    monkeypatch.setattr(poll_mod, "finalize_job_with_media", finalize)
    outcome = batch_poll.poll_due(w.rt, budget=60).line()
    assert seen, outcome
    _money(w, first, outcome)
    _money(w, second, f"{outcome} tick={seen[0][:300]}")


@pytest.mark.xfail(strict=True, reason=(
    "known, older than the storing mark: a chain's status read slower than its turn's lease "
    "lets the sweep resume the chain and exhaust the job on its own stale read before the "
    "slow read's success is marked"))
def test_chain_a_status_read_slower_than_the_turns_lease_is_not_exhausted_by_the_sweep(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Chain mode. The turn's lease is 21 s; a status read may take ``poll_step_deadline``
    (230 s: retries). The hold is taken only after the read: the chain's read takes 40 s, the
    task succeeds meanwhile; a sweep tick at +40 s sees the lease expired, resumes the chain
    itself (its own read: no ``unheld`` fence), reads stale on the last attempt and exhausts
    the job. The poller's read then returns "succeeded"; its hold is refused (another
    generation), it stores the outputs anyway and its completion loses. (Older than 52e6f18.)

    Must hold: completed once, no refund. Happens: failed UPSTREAM_TASK_NOT_FOUND, refunded."""
    w = _world(db, simulator, tmp_path, "chain")
    job_id = w.accept(KIND, Script(timeline=FOREVER))
    w.clock.now += THRESHOLD + timedelta(minutes=1)
    w.set(job_id, reconcile_attempts=MAX_ATTEMPTS - 1, reconcile_last_attempt_at=None)
    task = w.task_id(job_id)
    client = w.rt.client(w.rt.kind(KIND))
    real = client.poll
    reads: list[str] = []

    def poll(task_id: str, model: str | None = None) -> PollResult:
        reads.append(task_id)
        if len(reads) == 1:  # the chain's read: 40 s (the sweep ticks meanwhile)
            w.clock.now += timedelta(seconds=40)
            reads.append(str([a.outcome for a in w.tick().actions]))
            w.sim.set_state(task, "succeeded")
            return real(task_id, model=model)
        if len(reads) == 2:  # the sweep's read: stale
            return PollResult(PollStatus.NOT_FOUND)
        return real(task_id, model=model)

    monkeypatch.setattr(client, "poll", poll)
    outcome = _poll_once(w, "chain", job_id)
    _money(w, job_id, f"poller={outcome} sweep={reads[2] if len(reads) > 2 else None}")


@pytest.mark.xfail(strict=True, reason=(
    "known: TIME_SCALE (a test and demo setting) scales every duration, a status read's and an "
    "output fetch's deadlines included, while the HTTP timeouts themselves are not scaled"))
@pytest.mark.parametrize("mode", ["chain", "batch"])
def test_a_scaled_world_holds_a_storing_poller_for_its_media_timeout(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """``TIME_SCALE`` 0.01: ``storing_hold`` is scaled (2.55 s for one output) but the fetch's
    timeout is ``media_timeout`` as configured (120 s: ``finalize`` passes it unscaled). A
    storing of 30 s — a quarter of its own bound — outlasts the hold; a sweep tick then finds
    the row unheld / its lease expired and exhausts it on a stale read.

    Must hold: completed once, no refund. Happens: failed UPSTREAM_TASK_NOT_FOUND, refunded."""
    w = _world(db, simulator, tmp_path, mode, time_scale=0.01)
    job_id = w.accept(KIND, Script(timeline=FOREVER))
    w.clock.now += w.rt.settings.scaled(THRESHOLD) + timedelta(seconds=1)
    stale = _succeeded_on_its_last_attempt(w, monkeypatch, job_id)
    assert lifecycle.storing_hold(w.rt.settings, 1) == timedelta(seconds=2.55)
    seen = _slow_finalize(w, monkeypatch, job_id,
                          _tick_meanwhile(w, stale, timedelta(seconds=30)))
    outcome = _poll_once(w, mode, job_id)
    assert seen, outcome
    _money(w, job_id, f"poller={outcome} tick={seen[0][:300]}")


def test_hold_while_storing_keeps_the_instant_of_an_aware_time_on_sqlite(
        pg_and_sqlite: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """``hold_while_storing`` on a batch row, ``until`` an aware time in UTC−5 (a runtime clock
    that is not UTC; ``UTCDateTime`` stores every aware time as its instant). Must hold: the
    row's lease and due time are that instant. PostgreSQL: held. SQLite: ``poll_due_at`` is
    written through ``CASE … ELSE :until`` (a plain DateTime bind, not the column's type) and
    stored as the wall clock — 5 hours early, so the row is due (``unheld``) while the poller
    stores (UTC+9: 9 hours late)."""
    w = World(pg_and_sqlite, simulator, tmp_path, poll_mode="batch")
    job_id = w.accept(KIND, Script(timeline=FOREVER))
    job = w.job(job_id)
    until = (w.clock.now + timedelta(minutes=10)).astimezone(timezone(timedelta(hours=-5)))
    with w.db.begin() as s:
        assert jobstore.hold_while_storing(s, job_id, until, now=w.clock.now,
                                           claim=(job.poll_generation, job.poll_seq))
    after = w.job(job_id)
    assert after.poll_lease_expires_at == until and after.storing_until == until
    assert after.poll_due_at == until, (
        f"due {after.poll_due_at} != {until.astimezone(UTC)} (wall clock stored as UTC)")


# the largest media timeout the settings take, and the most outputs a success stores at the
# default limit: the storing mark is 64 × 2 × 86,400 s ahead (128 days), within datetime
LARGEST_MEDIA_TIMEOUT = 86_400.0
MANY_OUTPUTS = 64


def test_a_media_timeout_past_its_bound_is_refused_with_a_clear_error() -> None:
    """Found against 52e6f18: ``media_timeout`` had no bound; at 3e9 s ``now + storing_hold``
    overflowed ``datetime`` and every success of the chain errored (batch: the whole round
    raised). The setting now says what it takes."""
    from pydantic import ValidationError

    from reconcile import Settings

    for bad in (3e9, 86_401.0, 0.0):
        with pytest.raises(ValidationError, match="media_timeout"):
            Settings(media_timeout=bad)
    with pytest.raises(ValidationError, match="max_outputs_per_job"):
        Settings(max_outputs_per_job=0)


def test_chain_the_largest_storing_mark_still_stores_a_success(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """At the largest media timeout, a success of 64 outputs is marked 128 days ahead and
    completed by the poller's read."""
    w = World(db, simulator, tmp_path, poll_mode="chain", media_timeout=LARGEST_MEDIA_TIMEOUT)
    job_id = w.accept(KIND, Script(timeline=SUCCEEDS, outputs=MANY_OUTPUTS))
    outcome = _poll_once(w, "chain", job_id)
    job = w.job(job_id)
    assert (outcome, job.status) == ("completed", "completed"), job.reconcile_last_error


def test_batch_the_largest_storing_mark_does_not_abort_the_round(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """Batch mode, the same setting; one round claims a success (64 outputs) and a task that
    failed upstream: both are written (the grouped hold's times are computed inside its guard:
    a failure there falls back to each job's own hold)."""
    w = World(db, simulator, tmp_path, poll_mode="batch", media_timeout=LARGEST_MEDIA_TIMEOUT)
    job_id = w.accept(KIND, Script(timeline=SUCCEEDS, outputs=MANY_OUTPUTS))
    other = w.accept(KIND, Script(timeline=((0.0, "queued"), (0.0, "failed"))))
    for jid in (job_id, other):
        w.set(jid, poll_due_at=w.clock.now - timedelta(seconds=1))
    outcome = batch_poll.poll_due(w.rt, budget=60).line()
    assert (w.job(job_id).status, w.job(other).status) == ("completed", "failed"), outcome
    assert w.refunds(other) == 1 and w.refunds(job_id) == 0 and w.audit() == [], outcome


# ====================================================================== what held (they pass)


def _reap_alive(w: World) -> str:
    """Another worker's beat reaps: a lapsed worker (not the poller) is taken; the poller's own
    heartbeat row is alive."""
    from reconcile.sweep.liveness import reap

    w.lapse(f"w-dead-{uuid.uuid4().hex[:6]}")
    report = reap(w.rt)
    assert len(report.workers) == 1 and sum(report.decided.values()) == 0, report.line()
    assert report.released == 0, report.line()
    return report.line()


WRITERS = ["tick", "webhook_processing", "reap", "batch_claim", "resume_if_expired"]


@pytest.mark.parametrize("writer", WRITERS)
@pytest.mark.parametrize("mode", ["chain", "batch"])
def test_a_second_writer_while_the_poller_stores_fails_nothing(
        pg_and_sqlite: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, mode: str, writer: str) -> None:
    """The poller (its heartbeat row alive, ``claimed_by`` set) reads "succeeded" on the job's
    last attempt; 250 s into its storing — past the chain's lease (21 s) and the batch claim
    (245 s), inside storing_hold (255 s) — a second writer runs, every read of it stale: a
    sweep tick; a "processing" webhook's confirming read; another worker's reaper; another
    worker's ``poll_due``; a resume only-if-expired. PostgreSQL and SQLite. Must hold: the
    writer takes nothing (no claim, no resume, no exhaustion) and the job ends completed once,
    no refund, the audit clean."""
    from reconcile.webhook_ingest import _confirm

    w = _world(pg_and_sqlite, simulator, tmp_path, mode)
    w.rt.worker_id = "w-A"
    with w.db.begin() as s:
        jobstore.register_worker(s, "w-A", "host", 1, w.clock.now, timedelta(hours=1))
    job_id = w.accept(KIND, Script(timeline=FOREVER))
    w.clock.now += THRESHOLD + timedelta(minutes=1)
    stale = _last_attempt_succeeded(w, monkeypatch, job_id)

    def meanwhile() -> str:
        w.clock.now += timedelta(seconds=250)
        stale.append(PollResult(PollStatus.RUNNING, raw_status="processing")
                     if writer == "webhook_processing" else "on")
        polls_before = len(w.q.polls)
        try:
            if writer == "tick":
                return str([(a.action, a.outcome) for a in w.tick().actions])
            if writer == "webhook_processing":
                answer = _confirm(w.rt, w.job(job_id), w.rt.kind(KIND), SimpleNamespace(
                    failed=False, signed_body=b"", status="processing", error=None))
                assert w.job(job_id).status == "processing", answer
                return str(answer)
            if writer == "reap":
                return _reap_alive(w)
            if writer == "batch_claim":
                worker, w.rt.worker_id = w.rt.worker_id, "w-B"
                try:
                    claimed = batch_poll.claim(w.rt)
                finally:
                    w.rt.worker_id = worker
                assert claimed == [], "a held row was claimed by another poller"
                return "claimed none"
            assert not lifecycle.resume_chain(w.rt, job_id, only_if_lease_expired=True)
            return "not resumed"
        finally:
            stale.clear()
            assert len(w.q.polls) == polls_before, "a new chain was started meanwhile"

    seen = _slow_finalize(w, monkeypatch, job_id, meanwhile)
    outcome = _poll_once(w, mode, job_id)
    assert seen, outcome
    _money(w, job_id, f"poller={outcome} writer={seen[0]}")
    assert w.job(job_id).reconcile_attempts <= MAX_ATTEMPTS


@pytest.mark.parametrize("action", ["cancel", "operator_fail"])
@pytest.mark.parametrize("mode", ["chain", "batch"])
def test_a_stop_asked_while_the_poller_stores_settles_once(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, mode: str, action: str) -> None:
    """The user cancels / an operator fails the job while the poller stores its success. Must
    hold: the stop wins (the completion's CAS loses: ``lost``), one settlement (cancel: the
    cancel refund; fail: one refund), no ``completed`` event, the stored outputs dropped, the
    audit clean."""
    w = _world(db, simulator, tmp_path, mode)
    job_id = w.accept(KIND, Script(timeline=FOREVER, outputs=2))
    w.sim.set_state(w.task_id(job_id), "succeeded")

    def stop() -> str:
        w.clock.now += timedelta(seconds=30)
        if action == "cancel":
            from reconcile.lifecycle.cancel import cancel_job

            return cancel_job(w.rt, w.user, job_id).status
        return operator.run(w.rt, operator.FAIL, job_id, operator=ADMIN, reason="stuck").detail

    seen = _slow_finalize(w, monkeypatch, job_id, stop)
    outcome = _poll_once(w, mode, job_id)
    assert seen and "lost" in outcome, (outcome, seen)
    job = w.job(job_id)
    assert job.status == ("cancelled" if action == "cancel" else "failed"), seen
    assert w.completions(job_id) == 0 and w.refunds(job_id) == 1 and w.audit() == []
    media = list((tmp_path / "media").rglob("*")) if (tmp_path / "media").exists() else []
    assert [p for p in media if p.is_file()] == [], "the losing completion's uploads stayed"


def _die_after_the_hold(w: World, mode: str, job_id: uuid.UUID, worker: str | None) -> str:
    """The poller (``worker``) reads "succeeded", holds the row, stores the outputs and dies
    before the completion's statement (``after_upload``)."""
    w.rt.worker_id = worker
    w.rt.crash_hook = _die_at("after_upload")
    try:
        return _poll_once(w, mode, job_id)
    except _Died:
        return "died"
    finally:
        w.rt.crash_hook, w.rt.worker_id = None, None


@pytest.mark.parametrize("mode", ["chain", "batch"])
def test_a_poller_dying_after_the_hold_with_a_heartbeat_is_recovered_at_once(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path, mode: str) -> None:
    """Heartbeats on: the poller's worker row (6 s timeout) lapses 10 s after it died past its
    hold. Must hold: the reaper ends the hold at once (chain: its plan resumes the chain;
    batch: the claim is released, due now) and the next poller completes the job — 10 s after
    the death, not after storing_hold (255 s); no refund."""
    from reconcile.sweep.liveness import reap

    w = _world(db, simulator, tmp_path, mode)
    with w.db.begin() as s:
        jobstore.register_worker(s, "w-A", "host", 1, w.clock.now, timedelta(seconds=6))
    job_id = w.accept(KIND, Script(timeline=FOREVER))
    w.sim.set_state(w.task_id(job_id), "succeeded")
    died_at = w.clock.now
    assert _die_after_the_hold(w, mode, job_id, "w-A") == "died"
    held = w.job(job_id)
    hold_end = held.poll_due_at if mode == "batch" else held.poll_lease_expires_at
    assert hold_end == died_at + lifecycle.storing_hold(w.rt.settings, 1)
    w.clock.now += timedelta(seconds=10)
    report = reap(w.rt)
    assert report.workers == ["w-A"], report.line()
    if mode == "batch":
        assert report.released == 1, report.line()
        assert w.job(job_id).poll_due_at <= w.clock.now
        batch_poll.poll_due(w.rt, budget=60)
    else:
        assert sum(report.decided.values()) == 1, report.line()
        for jid, generation, seq in list(w.q.polls):
            w.q.polls.popleft()
            lifecycle.poll_step(w.rt, jid, generation, seq)
    _money(w, job_id, report.line())


@pytest.mark.parametrize("past_threshold", [False, True])
@pytest.mark.parametrize("mode", ["chain", "batch"])
def test_a_poller_dying_after_the_hold_without_a_heartbeat_is_recovered_after_the_hold(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path, mode: str,
        past_threshold: bool) -> None:
    """No heartbeats. The poller dies after its hold, before completing. Must hold: short of
    the threshold, the row stays held (no resume, not due) until storing_hold has passed
    (255 s: checked one second before) and is recovered right after it (chain: the sweep's
    resume; batch: due, the next ``poll_due``); past the threshold, the sweep's own read
    completes it at its next tick. Completed once, no refund."""
    w = _world(db, simulator, tmp_path, mode)
    job_id = w.accept(KIND, Script(timeline=FOREVER))
    if past_threshold:
        w.clock.now += THRESHOLD + timedelta(minutes=1)
    w.sim.set_state(w.task_id(job_id), "succeeded")
    hold = lifecycle.storing_hold(w.rt.settings, 1)
    died_at = w.clock.now
    assert _die_after_the_hold(w, mode, job_id, None) == "died"

    def step() -> None:
        w.tick()
        if mode == "batch":
            batch_poll.poll_due(w.rt, budget=60)
        for jid, generation, seq in list(w.q.polls):
            w.q.polls.popleft()
            lifecycle.poll_step(w.rt, jid, generation, seq)

    if past_threshold:
        w.clock.now += timedelta(seconds=1)
        step()
        _money(w, job_id, "the sweep's read past the threshold")
        return
    w.clock.now = died_at + hold - timedelta(seconds=1)
    step()
    assert w.job(job_id).status == "processing" and w.completions(job_id) == 0, \
        "recovered before the hold ended: it was not held"
    w.clock.now = died_at + hold + timedelta(seconds=1)
    step()
    _money(w, job_id, "after storing_hold")


@pytest.mark.parametrize("error", [MediaExpired, MediaFetchFailed, MediaTooLarge])
@pytest.mark.parametrize("mode", ["chain", "batch"])
def test_a_media_error_after_the_hold_keeps_the_job_polled(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, mode: str, error: type[Exception]) -> None:
    """The poller holds the row (3 outputs: 735 s) and the first fetch fails (expired URL, a
    failed fetch, too large). Must hold: the job stays in flight and is polled on schedule, not
    held for the storing it gave up — chain: its next turn is sent (with the kind's
    countdown); batch: ``poll_due_at`` is its next due time (one interval, not the 735 s hold),
    and that poll, the media fine again, completes it once."""
    import reconcile.media.fetch as fetch_mod

    w = _world(db, simulator, tmp_path, mode)
    job_id = w.accept(KIND, Script(timeline=FOREVER, outputs=3))
    w.sim.set_state(w.task_id(job_id), "succeeded")
    real = fetch_mod.safe_fetch
    failed: list[str] = []

    def fetch(url: str, **kw: Any) -> Any:
        if not failed:
            failed.append(url)
            raise error("refused once")
        return real(url, **kw)

    monkeypatch.setattr(fetch_mod, "safe_fetch", fetch)
    start = w.clock.now
    outcome = _poll_once(w, mode, job_id)
    assert failed, outcome
    assert outcome in ("in_flight", "error") or "in_flight=1" in outcome \
        or "error=1" in outcome, outcome
    job = w.job(job_id)
    assert job.status == "processing"
    interval = w.rt.settings.scaled(w.rt.kind(KIND).interval_at(timedelta(0)))
    if mode == "batch":
        assert job.poll_due_at is not None and job.poll_due_at <= start + interval, (
            f"due {job.poll_due_at - start} after the read, the hold was 735 s")
        w.clock.now = job.poll_due_at
        assert "completed=1" in batch_poll.poll_due(w.rt, budget=60).line()
    else:
        assert job.poll_due_at is None
        assert [(j, seq) for j, _, seq in w.q.polls] == [(job_id, job.poll_seq)]
        _, generation, seq = w.q.polls.popleft()
        assert lifecycle.poll_step(w.rt, job_id, generation, seq) == "completed"
    _money(w, job_id, outcome)


@pytest.mark.parametrize("outputs,limit,code", [
    (0, 64, ErrorCode.UPSTREAM_EMPTY_RESULT), (3, 2, ErrorCode.UPSTREAM_OUTPUT_LIMIT)])
@pytest.mark.parametrize("mode", ["chain", "batch"])
def test_a_success_with_no_media_or_too_many_is_failed_without_a_hold(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, mode: str, outputs: int, limit: int,
        code: ErrorCode) -> None:
    """A success with no outputs, or more than ``max_outputs_per_job``: nothing to store. Must
    hold: no storing hold (no statement; batch: the grouped hold gave one claim lease), the
    job failed with its code and refunded once."""
    w = _world(db, simulator, tmp_path, mode, max_outputs_per_job=limit)
    job_id = w.accept(KIND, Script(timeline=SUCCEEDS, outputs=outputs))
    calls = _hold_calls(monkeypatch)
    untils: list[Any] = []
    real = jobstore.hold_claims_with_status

    def grouped(session: Any, rows: Any, until: Any, **kw: Any) -> Any:
        untils.append(until)
        return real(session, rows, until, **kw)

    monkeypatch.setattr(jobstore, "hold_claims_with_status", grouped)
    now = w.clock.now
    outcome = _poll_once(w, mode, job_id)
    job = w.job(job_id)
    assert (job.status, job.error_code) == ("failed", code), outcome
    assert w.refunds(job_id) == 1 and w.audit() == [] and calls == []
    if mode == "batch":
        assert untils == [[now + batch_poll.claim_lease(w.rt)]]


def test_the_grouped_hold_gives_each_row_its_own_time(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """One batch round: a success with 3 outputs, a "not found" read, a success with 1 output
    and one with 5 (claimed in that order). Must hold: the grouped hold is one statement that
    holds each row until its own time — 735 s, one claim lease (245 s), then 255 s and 1215 s
    each after what the round's finalize threads may still have to work off before it — in
    the row's order, its storing mark with it, and no completion needs a statement of its
    own."""
    w = _world(db, simulator, tmp_path, "batch", poll_batch_threads=4,
               poll_batch_finalize_threads=4)
    specs = [("succeeded", 3), ("missing", 1), ("succeeded", 1), ("succeeded", 5)]
    ids = [w.accept(KIND, Script(timeline=FOREVER, outputs=n)) for _, n in specs]
    missing = ids[1]
    _switchable_reads(w, monkeypatch, missing, ["on"])
    for n, (jid, (state, _)) in enumerate(zip(ids, specs, strict=True)):
        if state == "succeeded":
            w.sim.set_state(w.task_id(jid), "succeeded")
        w.set(jid, poll_due_at=w.clock.now - timedelta(seconds=10 - n))
    calls = _hold_calls(monkeypatch)
    seen: dict[uuid.UUID, Any] = {}
    real = jobstore.hold_claims_with_status

    def grouped(session: Any, rows: Any, until: Any, **kw: Any) -> Any:
        held = real(session, rows, until, **kw)
        for (jid, *_), each in zip(rows, until, strict=True):
            seen[jid] = (each, held[jid].poll_due_at, held[jid].poll_lease_expires_at)
        return held

    monkeypatch.setattr(jobstore, "hold_claims_with_status", grouped)
    now = w.clock.now
    report = batch_poll.poll_due(w.rt, budget=60)
    own = lambda n: lifecycle.storing_hold(w.rt.settings, n)  # noqa: E731
    slack = timedelta(seconds=15)  # the "not found" outcome's own bound
    # each success until its storing may have ended: started once the 4 threads worked off
    # the bounds of the outcomes before it (their sum ÷ 4), then its own storing_hold
    want = {ids[0]: now + own(3), missing: now + batch_poll.claim_lease(w.rt),
            ids[2]: now + (own(3) + slack) / 4 + own(1),
            ids[3]: now + (own(3) + slack + own(1)) / 4 + own(5)}
    assert {jid: v[0] for jid, v in seen.items()} == want
    assert all(v[0] == v[1] == v[2] for v in seen.values()), seen
    assert calls == [], "a completion held its row again"
    assert report.outcomes.get("completed") == 3, report.line()
    for jid in (ids[0], ids[2], ids[3]):
        _money(w, jid, report.line())


def test_hold_claims_with_status_per_row_times_and_mismatched_lengths(
        pg_and_sqlite: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """``hold_claims_with_status`` directly, PostgreSQL and SQLite: each row gets its own time
    in the order given (reversed here against the ids' order), a row whose claim was taken
    over is absent and unchanged, and one time too few or too many raises before anything is
    written."""
    w = World(pg_and_sqlite, simulator, tmp_path, poll_mode="batch")
    ids = [w.accept(KIND, Script(timeline=FOREVER)) for _ in range(3)]
    ids.sort(reverse=True)
    jobs = [w.job(jid) for jid in ids]
    w.set(ids[1], poll_seq=jobs[1].poll_seq + 1)  # taken over
    before = w.job(ids[1])
    rows = [(j.id, j.poll_generation, j.poll_seq, None) for j in jobs]
    untils = [w.clock.now + timedelta(seconds=s) for s in (300, 20, 100)]
    for bad in (untils[:2], [*untils, untils[0]]):
        with pytest.raises(ValueError), w.db.begin() as s:
            jobstore.hold_claims_with_status(s, rows, bad)
        assert [w.job(jid).poll_due_at for jid in ids] == [j.poll_due_at for j in jobs]
    with w.db.begin() as s:
        held = jobstore.hold_claims_with_status(s, rows, untils)
    assert set(held) == {ids[0], ids[2]}
    for jid, until in ((ids[0], untils[0]), (ids[2], untils[2])):
        row = w.job(jid)
        assert (row.poll_due_at, row.poll_lease_expires_at) == (until, until)
    after = w.job(ids[1])
    assert (after.poll_due_at, after.poll_lease_expires_at) == (
        before.poll_due_at, before.poll_lease_expires_at)


@pytest.mark.parametrize("outputs", [1, 3])
def test_a_round_whose_grouped_hold_raises_still_holds_each_success_while_it_stores(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, outputs: int) -> None:
    """The round's grouped hold raises (each job then holds its own claim: one claim lease,
    no storing mark). Must hold: a success still gets what storing needs — its own
    ``hold_while_storing``, to 255 s (1 output) or 735 s (3) — and a sweep tick whose reads are
    stale, at the end of what storing may take (240 s per output), fails nothing."""
    w = _world(db, simulator, tmp_path, "batch")
    job_id = w.accept(KIND, Script(timeline=FOREVER, outputs=outputs))
    w.clock.now += THRESHOLD + timedelta(minutes=1)
    stale = _succeeded_on_its_last_attempt(w, monkeypatch, job_id)

    def broken(*args: Any, **kw: Any) -> Any:
        raise RuntimeError("grouped hold failed")

    monkeypatch.setattr(jobstore, "hold_claims_with_status", broken)
    calls = _hold_calls(monkeypatch)
    seen = _slow_finalize(w, monkeypatch, job_id,
                          _tick_meanwhile(w, stale, timedelta(seconds=240 * outputs)))
    now = w.clock.now
    outcome = _poll_once(w, "batch", job_id)
    assert seen, outcome
    # the job's own claim holds no storing mark: its completion marks the row itself
    assert calls == [(job_id, now + lifecycle.storing_hold(w.rt.settings, outputs), True)]
    _money(w, job_id, f"poller={outcome} tick={seen[0][:300]}")


@pytest.mark.parametrize("threads", [1, 4])
def test_several_completions_in_one_round_each_held_while_stored(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, threads: int) -> None:
    """Four successes in one round, each on its last attempt, ``POLL_BATCH_FINALIZE_THREADS``
    1 and 4; each storing takes 60 s and a sweep tick with stale reads runs during each
    (1 thread: the 4th starts 180 s after the round's hold, re-held). Must hold: all four
    completed once, no refund."""
    w = _world(db, simulator, tmp_path, "batch", poll_batch_threads=4,
               poll_batch_finalize_threads=threads)
    ids = [w.accept(KIND, Script(timeline=FOREVER)) for _ in range(4)]
    w.clock.now += THRESHOLD + timedelta(minutes=1)
    stale: list[Any] = []
    for jid in ids:
        w.set(jid, reconcile_attempts=MAX_ATTEMPTS - 1, reconcile_last_attempt_at=None,
              poll_due_at=w.clock.now - timedelta(seconds=1))
        w.sim.set_state(w.task_id(jid), "succeeded")
    client = w.rt.client(w.rt.kind(KIND))
    real_poll = client.poll
    tasks = {w.task_id(jid) for jid in ids}

    def poll(task_id: str, model: str | None = None) -> PollResult:
        if task_id in tasks and stale:
            return PollResult(PollStatus.NOT_FOUND)
        return real_poll(task_id, model=model)

    monkeypatch.setattr(client, "poll", poll)
    import threading

    import reconcile.lifecycle.poll as poll_mod

    real = poll_mod.finalize_job_with_media
    lock = threading.Lock()
    ticks: list[str] = []

    def finalize(rt: Any, jid: uuid.UUID, result: Any, **kw: Any) -> bool:
        if kw.get("source") == "poll":
            with lock:  # one storing's minute and one tick at a time
                w.clock.now += timedelta(seconds=60)
                stale.append("on")
                ticks.append(str([a.outcome for a in w.tick().actions]))
                stale.clear()
        return real(rt, jid, result, **kw)

    monkeypatch.setattr(poll_mod, "finalize_job_with_media", finalize)
    report = batch_poll.poll_due(w.rt, budget=60)
    assert report.outcomes == {"completed": 4}, (report.line(), ticks)
    for jid in ids:
        _money(w, jid, f"{report.line()} {ticks}")


@pytest.mark.parametrize("media_timeout", [1.0, 120.0])
def test_chain_a_completion_marks_its_row_whatever_the_media_timeout(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, media_timeout: float) -> None:
    """Chain mode. Whether or not storing_hold fits the turn's lease (``media_timeout`` 1 s:
    17 s, inside 21 s; 120 s: 255 s), the completion pays one statement: the storing mark, to
    now + storing_hold, ``poll_due_at`` left NULL. Must hold: completed once either way."""
    w = World(db, simulator, tmp_path, poll_mode="chain", media_timeout=media_timeout)
    job_id = w.accept(KIND, Script(timeline=SUCCEEDS))
    calls = _hold_calls(monkeypatch)
    now = w.clock.now
    assert _poll_once(w, "chain", job_id) == "completed"
    assert calls == [(job_id, now + lifecycle.storing_hold(w.rt.settings, 1), True)]
    assert w.job(job_id).poll_due_at is None
    _money(w, job_id, "chain")


def test_chain_mode_a_row_left_due_by_batch_mode_is_held_by_its_due_time_too(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``RECONCILE_POLL_MODE=chain``, a row batch mode left with a due time in the past and a
    chain turn on it. Must hold: the hold moves ``poll_due_at`` with the lease (a due row is
    ``unheld``), and a sweep tick 200 s into the storing, its reads stale, fails nothing."""
    w = _world(db, simulator, tmp_path, "chain")
    job_id = w.accept(KIND, Script(timeline=FOREVER))
    w.clock.now += THRESHOLD + timedelta(minutes=1)
    stale = _succeeded_on_its_last_attempt(w, monkeypatch, job_id)
    assert lifecycle.resume_chain(w.rt, job_id)
    w.set(job_id, poll_due_at=w.clock.now - timedelta(minutes=3))  # left by batch mode
    calls = _hold_calls(monkeypatch)
    seen = _slow_finalize(w, monkeypatch, job_id,
                          _tick_meanwhile(w, stale, timedelta(seconds=200)))
    now = w.clock.now
    _, generation, seq = w.q.polls.popleft()
    outcome = lifecycle.poll_step(w.rt, job_id, generation, seq)
    assert seen, outcome
    assert calls == [(job_id, now + lifecycle.storing_hold(w.rt.settings, 1), True)]
    _money(w, job_id, f"poller={outcome} tick={seen[0][:300]}")


# ---------------------------------------------- a platform's naive columns, a non-UTC zone

SHAPES = [("America/New_York", "session"), ("Asia/Tokyo", "database")]


@pytest.fixture(scope="module", params=SHAPES, ids=[f"{z.split('/')[1]}-{lv}" for z, lv in SHAPES])
def naive_zoned(request: pytest.FixtureRequest, pg_databases: PgDatabases) -> Iterator[Engine]:
    """A platform database with ``timestamp without time zone`` columns in a non-UTC zone (the
    database's default, or the URL's session zone): ``tests/integration/test_naive_timestamps``'s
    shape."""
    zone, level = request.param
    _, engine = platform_database(pg_databases, "rtstore", naive=True, zone=zone, level=level)
    yield engine
    engine.dispose()


@pytest.fixture
def ndb(naive_zoned: Engine) -> sessionmaker[Session]:
    return clean_sessions(naive_zoned)


@pytest.mark.parametrize("mode", ["batch", "chain"])
def test_naive_columns_in_a_non_utc_zone_hold_the_instants(
        ndb: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """Naive platform columns, a non-UTC server zone. Batch: the grouped hold's
    ``timestamptz[]`` gives each row its instant (3 outputs: now + 735 s; a "not found" row:
    one claim lease). Chain: ``hold_while_storing`` moves the lease to now + 255 s. Checked
    through a plain connection in the zone (``extract(epoch …)``), then a stale tick 200 s in
    fails nothing. Must hold: the instants, and completed once."""
    w = _world(ndb, simulator, tmp_path, mode, poll_batch_threads=2,
               poll_batch_finalize_threads=1)
    job_id = w.accept(KIND, Script(timeline=FOREVER, outputs=3))
    other = w.accept(KIND, Script(timeline=FOREVER))
    w.clock.now += THRESHOLD + timedelta(minutes=1)
    stale = _succeeded_on_its_last_attempt(w, monkeypatch, job_id)
    _switchable_reads(w, monkeypatch, other, ["on"])
    now = w.clock.now
    if mode == "batch":  # claimed in the same round, after the job (its outcome comes second)
        w.set(other, poll_due_at=now - timedelta(milliseconds=500))
    epochs: dict[uuid.UUID, float] = {}

    def meanwhile() -> str:
        with ndb() as s:
            for jid in (job_id, other):
                epochs[jid] = s.execute(text(
                    "SELECT extract(epoch FROM COALESCE(poll_due_at, poll_lease_expires_at)) "
                    "FROM jobs WHERE id = :id"), {"id": jid}).scalar_one()
        return _tick_meanwhile(w, stale, timedelta(seconds=200))()

    seen = _slow_finalize(w, monkeypatch, job_id, meanwhile)
    outcome = _poll_once(w, mode, job_id)
    assert seen, outcome
    want = (now + lifecycle.storing_hold(w.rt.settings, 3)).timestamp()
    assert float(epochs[job_id]) == pytest.approx(want, abs=1.5), (epochs, want)
    if mode == "batch":
        lease = (now + batch_poll.claim_lease(w.rt)).timestamp()
        assert float(epochs[other]) == pytest.approx(lease, abs=1.5)
    _money(w, job_id, f"poller={outcome}")



@pytest.mark.xfail(strict=True, reason=(
    "known, older than the storing mark: a read of \"succeeded\" counts no attempt, so a "
    "success whose storing kills its worker every time is never exhausted"))
@pytest.mark.parametrize("mode", ["chain", "batch"])
def test_a_success_whose_storing_always_kills_its_worker_is_failed_by_its_horizon(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path, mode: str) -> None:
    """Liveness. The task succeeded, but storing its outputs kills whichever process does it
    (an OOM on the media, a crashing watermark hook): every poller and every sweep tick that
    reads it dies at ``after_upload``. Ticks every minute, pollers first, no heartbeats. Must
    hold: the job does not outlive its exhaustion horizon by much — failed and refunded by the
    horizon plus three attempt spacings. Happens: a read that says "succeeded" never counts
    toward exhaustion nor exhausts; the sweep's claims count attempts past MAX_ATTEMPTS (22)
    and the job stays ``processing``, its credits held, 16 minutes past its horizon and on.
    (Older than 52e6f18: the same with the hold stubbed out.)"""
    from reconcile.jobstore import horizon
    from reconcile.states import ATTEMPT_SPACING

    w = _world(db, simulator, tmp_path, mode)
    job_id = w.accept(KIND, Script(timeline=FOREVER))
    w.sim.set_state(w.task_id(job_id), "succeeded")
    deadline = horizon.exhaustion_deadline(w.rt.settings, w.job(job_id))
    assert deadline is not None
    limit = deadline + 3 * w.rt.settings.scaled(ATTEMPT_SPACING)
    w.rt.crash_hook = _die_at("after_upload")
    while w.clock.now <= limit and w.job(job_id).status in ("pending", "processing"):
        w.clock.now += timedelta(minutes=1)
        try:
            if mode == "batch":
                batch_poll.poll_due(w.rt, budget=60)
            else:
                for jid, generation, seq in list(w.q.polls):
                    w.q.polls.popleft()
                    lifecycle.poll_step(w.rt, jid, generation, seq)
        except _Died:
            pass
        try:
            w.tick()
        except _Died:
            pass
    w.rt.crash_hook = None
    job = w.job(job_id)
    assert job.status == "failed", (
        f"{job.status} at {w.clock.now - deadline} past its horizon, "
        f"attempts={job.reconcile_attempts}")
    assert w.refunds(job_id) == 1 and w.audit() == []
