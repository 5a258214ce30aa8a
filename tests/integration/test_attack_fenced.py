"""Attacks on the fenced attempt writes (7f91260): ``observe(claim=…)`` and the batch round's
one grouped hold (``jobstore.hold_claims_with_status``).

A second writer is interleaved at each step after the batch round's hold and after the chain's
turn; the grouped hold's SQL is fed odd rows; batch mode runs on the embedded SQLite default.

PostgreSQL (and SQLite where named), the simulator and an injected clock (``World``).

Findings, both also on 606b2b3 (not regressions of 7f91260), both fixed:
``test_a_sweep_read_overtaken_by_a_webhook_resume_fails_nothing`` (the sweep's / reaper's own
read exhausted under no fence, then under a fence a resume of a turnless generation could not
move: the fence now includes the row's resume count, ``jobstore.claim_of``, migration 0030)
and ``test_a_length_limited_provider_status_poisons_no_other_row_of_the_round[running]`` (one
overlong status made the set-based reschedule raise out of the whole round; the round's
set-based write now falls back to one write per row). The ``succeeded`` interleavings of
webhook_resume and reap_and_claim fail on 606b2b3 (the hole 7f91260 closes).
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from reconcile import jobstore, lifecycle
from reconcile.lifecycle import batch as batch_poll
from reconcile.providers import PollResult, PollStatus
from reconcile.states import IN_FLIGHT, MAX_ATTEMPTS
from reconcile.sweep import reconcile_job
from reconcile.sweep.liveness import reap
from reconcile.testing.simulator import Script, Simulator
from tests.integration._sweep_helpers import FOREVER, World

KIND = "replicate-prediction"
THRESHOLD = timedelta(minutes=20)



# ------------------------------------------------------------------ 1. the sweep's own read


def _next_poll(w: World, mode: str, job_id: uuid.UUID) -> None:
    """The job's next poll, its queued messages lost: a ``poll_due`` run (batch), or a turn of
    the row's current generation and seq (chain)."""
    w.lose_messages()
    if mode == "batch":
        batch_poll.poll_due(w.rt, budget=60)
    else:
        job = w.job(job_id)
        lifecycle.poll_step(w.rt, job_id, job.poll_generation, job.poll_seq)


@pytest.mark.parametrize("mode,writer", [("batch", "sweep"), ("chain", "sweep"),
                                         ("chain", "reap")])
def test_a_sweep_read_overtaken_by_a_webhook_resume_fails_nothing(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, mode: str, writer: str) -> None:
    """The same hole the commit closes for the poller's claim, on the sweep's POLL (and the
    heartbeat reaper's, which runs the sweep's plan): the sweep claims the job's last attempt
    and reads "not found" (a transient miss); during that read the task succeeds and the
    webhook's confirming read resumes the chain (a new generation: every poller's claim is
    fenced). The sweep's read is no verdict, yet ``_poll_once`` exhausts the job under no
    fence: it fails and refunds a job whose task succeeded, and the poller that then reads the
    success loses the completion CAS."""
    w = World(db, simulator, tmp_path, poll_mode=mode, poll_batch_threads=1,
              poll_batch_finalize_threads=1)
    job_id = w.accept(KIND, Script(timeline=FOREVER))
    w.clock.now += THRESHOLD + timedelta(minutes=1)
    w.set(job_id, reconcile_attempts=MAX_ATTEMPTS - 1, reconcile_last_attempt_at=None)
    if writer == "reap":  # a live chain's turn, held by a worker whose heartbeat lapsed
        w.set(job_id, claimed_by="w-A", poll_due_at=None,
              poll_lease_expires_at=w.clock.now + timedelta(minutes=1))
        w.lapse("w-A")
    resumed: list[bool] = []
    w.miss_once(monkeypatch, job_id,
               lambda: resumed.append(lifecycle.resume_chain(w.rt, job_id)))
    if writer == "sweep":
        outcome = reconcile_job(w.rt, job_id)
    else:
        report = reap(w.rt)
        assert report.workers == ["w-A"], report.line()
        outcome = ",".join(sorted(report.decided))
    assert resumed == [True]
    _next_poll(w, mode, job_id)  # whoever polls next reads the success
    job = w.job(job_id)
    assert (job.status, job.error_code, w.refunds(job_id)) == ("completed", None, 0), (
        f"{writer} outcome={outcome}: a job whose task succeeded was {job.status} "
        f"({job.error_code}) and refunded {w.refunds(job_id)}x on a stale 'not found'")
    assert w.completions(job_id) == 1 and w.audit() == []


@pytest.mark.parametrize("mode", ["batch", "chain"])
def test_a_webhook_read_overtaken_by_a_resume_fails_nothing(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """The webhook's confirming read is a reader without a turn too: it reads "processing" (no
    verdict) on the job's last attempt, and during that read the task succeeds and another
    delivery's confirming read resumes the polling (a generation that never took a turn: only
    the resume count moves). The first delivery fails nothing; the resumed poller completes."""
    from types import SimpleNamespace

    from reconcile.webhook_ingest import _confirm

    w = World(db, simulator, tmp_path, poll_mode=mode, poll_batch_threads=1,
              poll_batch_finalize_threads=1)
    job_id = w.accept(KIND, Script(timeline=FOREVER))
    w.clock.now += THRESHOLD + timedelta(minutes=1)
    w.set(job_id, reconcile_attempts=MAX_ATTEMPTS - 1, reconcile_last_attempt_at=None)
    task, job = w.task_id(job_id), w.job(job_id)
    kind = w.rt.kind(KIND)
    client = w.rt.client(kind)
    real = client.poll
    resumed: list[bool] = []

    def poll(task_id: str, model: str | None = None) -> PollResult:
        if task_id == task and not resumed:
            w.sim.set_state(task, "succeeded")
            resumed.append(lifecycle.resume_chain(w.rt, job_id))
            return PollResult(PollStatus.RUNNING, raw_status="processing")
        return real(task_id, model=model)

    monkeypatch.setattr(client, "poll", poll)
    event = SimpleNamespace(failed=False, signed_body=b"", status="processing", error=None)
    code, body = _confirm(w.rt, job, kind, event)
    assert resumed == [True] and code == 200, body
    assert w.job(job_id).status in IN_FLIGHT, body
    _next_poll(w, mode, job_id)
    job = w.job(job_id)
    assert (job.status, w.refunds(job_id)) == ("completed", 0), (job.status, body)
    assert w.completions(job_id) == 1 and w.audit() == []


# ------------------------------------------------------------------ 2. writers after the hold / turn

WRITERS = ["cancel", "operator_fail", "sweep", "reap_and_claim", "webhook_resume",
           "webhook_observe"]


def _write(w: World, writer: str, job_id: uuid.UUID, mode: str,
           taken: list[batch_poll.Claim]) -> None:
    """One second writer on the job, run between the poller's hold (or turn) and its writes."""
    from reconcile.lifecycle.cancel import cancel_job
    from reconcile.operator import Operator, run

    if writer == "cancel":
        cancel_job(w.rt, w.user, job_id)
    elif writer == "operator_fail":
        run(w.rt, "fail", job_id, operator=Operator("op", via="cli"), reason="stuck")
    elif writer == "sweep":
        reconcile_job(w.rt, job_id)
    elif writer == "reap_and_claim":
        w.lapse("w-A")
        assert reap(w.rt).workers == ["w-A"]
        if mode == "batch":
            w.rt.worker_id = "w-B"
            taken.extend(batch_poll.claim(w.rt))
            w.rt.worker_id = "w-A"
    elif writer == "webhook_resume":
        lifecycle.resume_chain(w.rt, job_id)
    elif writer == "webhook_observe":  # a webhook whose confirming read is no verdict
        lifecycle.observe(w.rt, w.job(job_id), w.rt.kind(KIND), via="webhook")


def _poll_round(w: World, mode: str) -> int:
    """One attempt spacing later, the pollers' next round: a ``poll_due`` run (batch) or every
    queued poll message (chain). Returns the messages run (chain)."""
    from reconcile.states import ATTEMPT_SPACING

    w.clock.now += w.rt.settings.scaled(ATTEMPT_SPACING) + timedelta(seconds=1)
    if mode == "batch":
        batch_poll.poll_due(w.rt, budget=60)
        return 0
    steps = list(w.q.polls)
    w.q.polls.clear()
    for job_id, generation, seq in steps:
        lifecycle.poll_step(w.rt, job_id, generation, seq)
    return len(steps)


def _drain(w: World, mode: str, taken: list[batch_poll.Claim], rounds: int = 4) -> None:
    """Whatever brings a job back: another poller's claims, the sweep, the next poll
    messages, each lease and spacing let run out."""

    if taken:
        batch_poll.run_claims(w.rt, list(taken))
        taken.clear()
    for _ in range(rounds):
        _poll_round(w, mode)
        w.tick()


def _invariants(w: World, job_id: uuid.UUID, upstream: str, writer: str, mode: str) -> None:
    job = w.job(job_id)
    refunds = w.refunds(job_id)
    where = f"{mode}/{writer}/{upstream}: status={job.status} code={job.error_code}"
    assert refunds <= 1, where
    assert w.completions(job_id) <= 1, where
    if job.status == "completed":
        assert refunds == 0, where
    if upstream == "succeeded" and writer not in ("cancel", "operator_fail"):
        # nobody asked for it to stop: the success must win, never a failure and a refund
        assert (job.status, refunds) == ("completed", 0), where
    if job.status in ("pending", "processing"):
        # a way back: a due time (batch) or a live lease / queued turn (chain)
        if mode == "batch":
            assert job.poll_due_at is not None, where
        else:
            assert any(p[0] == job_id for p in w.q.polls) or job.poll_lease_expires_at, where
    assert w.audit() == [], where


@pytest.mark.parametrize("upstream", ["succeeded", "running"])
@pytest.mark.parametrize("writer", WRITERS)
def test_batch_a_writer_after_the_grouped_hold(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, writer: str, upstream: str) -> None:
    """A round of three past their threshold: A succeeded, B (one attempt left) reads "not
    found" once, C still running. The grouped hold has held all three; the writer lands on B
    right before B's outcome is written (A's already is). Money and liveness invariants."""
    from reconcile.testing.simulator import Script as S

    w = World(db, simulator, tmp_path, poll_mode="batch", poll_batch_threads=1,
              poll_batch_finalize_threads=1)
    w.rt.worker_id = "w-A"
    a = w.accept(KIND, S(timeline=((0.0, "queued"), (0.0, "succeeded"))))
    b = w.accept(KIND, S(timeline=FOREVER))
    c = w.accept(KIND, S(timeline=FOREVER))
    w.clock.now += THRESHOLD + timedelta(minutes=1)
    w.set(b, reconcile_attempts=MAX_ATTEMPTS - 1, reconcile_last_attempt_at=None)
    task_b = w.task_id(b)
    client = w.rt.client(w.rt.kind(KIND))
    real_poll = client.poll
    misses = [1]

    def poll(task_id: str, model: str | None = None) -> PollResult:
        if task_id == task_b and misses:
            misses.pop()
            if upstream == "succeeded":
                w.sim.set_state(task_b, "succeeded")
            return PollResult(PollStatus.NOT_FOUND)
        return real_poll(task_id, model=model)

    monkeypatch.setattr(client, "poll", poll)
    real_observe = lifecycle.observe
    taken: list[batch_poll.Claim] = []
    fired: list[str] = []

    def observe(rt: Any, job: Any, *args: Any, **kw: Any) -> Any:
        if job.id == b and kw.get("via") == "poll" and not fired:
            fired.append(writer)
            _write(w, writer, b, "batch", taken)
        return real_observe(rt, job, *args, **kw)

    monkeypatch.setattr(lifecycle, "observe", observe)
    claims = batch_poll.claim(w.rt)
    assert {cl.job.id for cl in claims} == {a, b, c}
    report = batch_poll.run_claims(w.rt, claims)
    monkeypatch.setattr(lifecycle, "observe", real_observe)
    assert fired == [writer], report.line()
    assert w.job(a).status == "completed"
    _drain(w, "batch", taken)
    for job_id in (a, c):
        _invariants(w, job_id, "running" if job_id == c else "succeeded", writer, "batch")
    _invariants(w, b, upstream, writer, "batch")


@pytest.mark.parametrize("upstream", ["succeeded", "running"])
@pytest.mark.parametrize("writer", WRITERS)
def test_chain_a_writer_after_the_turn(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, writer: str, upstream: str) -> None:
    """The chain's turn taken, its read says "not found" on the last attempt; the writer
    lands inside that read (after the turn, before the count)."""
    w = World(db, simulator, tmp_path, poll_mode="chain")
    w.rt.worker_id = "w-A"
    b = w.accept(KIND, Script(timeline=FOREVER))
    w.clock.now += THRESHOLD + timedelta(minutes=1)
    w.set(b, reconcile_attempts=MAX_ATTEMPTS - 1, reconcile_last_attempt_at=None)

    def inside() -> None:
        if upstream == "running":
            w.sim.set_state(w.task_id(b), "running")
        _write(w, writer, b, "chain", [])

    task_b = w.task_id(b)
    client = w.rt.client(w.rt.kind(KIND))
    real = client.poll
    reads: list[int] = []

    def poll(task_id: str, model: str | None = None) -> PollResult:
        if task_id == task_b and not reads:
            reads.append(1)
            w.sim.set_state(task_b, "succeeded")
            inside()
            return PollResult(PollStatus.NOT_FOUND)
        return real(task_id, model=model)

    monkeypatch.setattr(client, "poll", poll)
    before = w.job(b)
    w.lose_messages()
    w.set(b, poll_lease_expires_at=w.clock.now + timedelta(minutes=1))  # a live chain
    lifecycle.poll_step(w.rt, b, before.poll_generation, before.poll_seq)
    assert reads == [1]
    _drain(w, "chain", [])
    _invariants(w, b, upstream, writer, "chain")


# ------------------------------------------------------------------ 3. every count under its own claim


@pytest.mark.parametrize("mode", ["batch", "chain"])
def test_a_task_never_found_exhausts_under_the_poller_alone(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """No step of the poller itself moves poll_seq/poll_generation between its claim (turn)
    and its count: a task the provider never finds spends one attempt per spacing and the job
    is failed (and refunded once) at MAX_ATTEMPTS, with no sweep running — default settings."""
    w = World(db, simulator, tmp_path, poll_mode=mode)
    job_id = w.accept(KIND, Script(timeline=FOREVER))
    if mode == "chain":
        job = w.job(job_id)
        w.q.polls.append((job_id, job.poll_generation, job.poll_seq))
    client = w.rt.client(w.rt.kind(KIND))
    monkeypatch.setattr(client, "poll",
                        lambda task_id, model=None: PollResult(PollStatus.NOT_FOUND))
    w.clock.now += THRESHOLD
    seen: list[int] = []
    for _ in range(MAX_ATTEMPTS + 6):
        ran = _poll_round(w, mode)
        assert mode == "batch" or ran == 1, ran
        job = w.job(job_id)
        seen.append(job.reconcile_attempts or 0)
        if job.status == "failed":
            break
    assert (job.status, job.error_code) == ("failed", "UPSTREAM_TASK_NOT_FOUND"), seen
    assert job.reconcile_attempts == MAX_ATTEMPTS and seen == list(range(1, MAX_ATTEMPTS + 1))
    assert w.refunds(job_id) == 1 and w.audit() == []


# ------------------------------------------------------------------ 4. the grouped hold's SQL


class _NoText:
    def __str__(self) -> str:
        raise RuntimeError("no text")


def test_the_grouped_hold_on_odd_rows(db: sessionmaker[Session], simulator: Simulator,
                                      tmp_path: Path) -> None:
    """NUL bytes, a very long status, a number, None, an object with no text, an empty string;
    a job named twice; a stale claim; a finished job; an empty round."""
    from reconcile.jobstore.predicates import PROVIDER_STATUS_MAX

    w = World(db, simulator, tmp_path, poll_mode="batch")
    ids = [w.accept(KIND, Script(timeline=FOREVER)) for _ in range(8)]
    w.clock.now += timedelta(seconds=10)
    claims = {c.job.id: c for c in batch_poll.claim(w.rt)}
    assert set(claims) == set(ids)
    w.set(ids[3], provider_status="kept")
    w.set(ids[5], provider_status="kept")
    with w.db.begin() as s:  # ids[6]: a new generation; ids[7]: finished
        assert jobstore.start_new_chain(s, ids[6], w.clock.now, timedelta(minutes=1),
                                        poll_due_at=w.clock.now) is not None
    w.set(ids[7], status="completed")
    statuses: list[object] = ["a\x00b", "x" * 100_000, 12345, None, "", _NoText(), "s6", "s7"]
    rows = [(j, claims[j].generation, claims[j].seq, st) for j, st in zip(ids, statuses,
                                                                          strict=True)]
    rows.append(rows[0])  # named twice
    rows.append((ids[1], claims[ids[1]].generation, claims[ids[1]].seq - 1, "stale"))
    until = w.clock.now + timedelta(minutes=3)
    with w.rt.sessions.begin() as s:
        assert jobstore.hold_claims_with_status(s, [], until) == {}
        held = jobstore.hold_claims_with_status(s, rows, until)
    assert set(held) == set(ids[:6])
    got = {j: w.job(j).provider_status for j in ids}
    assert got[ids[0]] == "a\ufffdb"
    assert got[ids[1]] == "x" * PROVIDER_STATUS_MAX
    assert got[ids[2]] == "12345"
    assert got[ids[3]] == "kept" and got[ids[5]] == "kept"
    assert got[ids[4]] == ""
    assert got[ids[6]] is None and got[ids[7]] is None
    for j in ids[:6]:
        job = w.job(j)
        assert job.poll_due_at == until and job.poll_lease_expires_at == until
        assert held[j].provider_status == got[j]
    assert w.job(ids[6]).poll_due_at == w.clock.now  # a new generation's row untouched


def _platform_db(pg_databases: Any, status_type: str) -> tuple[sessionmaker[Session], Any]:
    """A platform-owned ``jobs`` (revision 0001's shape) with naive UTC timestamps, a session
    zone that is not UTC, columns of its own (one NOT NULL with a default, one nullable),
    bigint poll counters and ``provider_status`` as ``status_type`` — all before the library's
    migrations, which keep them."""
    from urllib.parse import quote

    import psycopg

    from reconcile.db.migrate import upgrade
    from reconcile.db.session import make_engine, make_sessionmaker
    from reconcile.testing.platform_schema import create_platform_tables

    url = pg_databases.create("rtattack")
    plain = url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(plain, autocommit=True) as conn:
        create_platform_tables(conn, naive=True)
        conn.execute("ALTER TABLE jobs ADD COLUMN tenant text NOT NULL DEFAULT 'acme', "
                      "ADD COLUMN note jsonb, ADD COLUMN poll_generation bigint NOT NULL "
                      "DEFAULT 0, ADD COLUMN poll_seq bigint NOT NULL DEFAULT 0, "
                      f"ADD COLUMN provider_status {status_type}")
    url += "?options=" + quote("-c TimeZone=America/New_York")
    upgrade(url)
    engine = make_engine(url)
    return make_sessionmaker(engine), engine


def test_a_round_on_a_platform_shaped_jobs_table(
        pg_databases: Any, simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The grouped hold (and the round around it) on the platform's odd shape: every outcome
    as on the library's own table, the hold's times read back as written."""
    db, engine = _platform_db(pg_databases, "varchar(64)")
    try:
        w = World(db, simulator, tmp_path, poll_mode="batch", poll_batch_threads=1)
        done = w.accept(KIND, Script(timeline=((0.0, "queued"), (0.0, "succeeded"))))
        missing = w.accept(KIND, Script(timeline=FOREVER))
        running = w.accept(KIND, Script(timeline=FOREVER))
        w.clock.now += THRESHOLD + timedelta(minutes=1)
        w.set(missing, reconcile_attempts=MAX_ATTEMPTS - 1, reconcile_last_attempt_at=None)
        client = w.rt.client(w.rt.kind(KIND))
        real = client.poll
        task = w.task_id(missing)
        odd = "\x00" + "é" * 200

        def poll(task_id: str, model: str | None = None) -> PollResult:
            if task_id == task:
                return PollResult(PollStatus.NOT_FOUND, raw_status=odd)
            return real(task_id, model=model)

        monkeypatch.setattr(client, "poll", poll)
        report = batch_poll.poll_due(w.rt, budget=60)
        assert report.outcomes == {"completed": 1, "failed": 1, "in_flight": 1}, report.line()
        assert w.job(missing).error_code == "UPSTREAM_TASK_NOT_FOUND"
        assert w.refunds(missing) == 1 and w.refunds(done) == 0
        assert w.job(missing).provider_status == "\ufffd" + "é" * 63
        # the hold's times on naive columns in another zone read back as written
        w.clock.now += timedelta(minutes=10)
        (claim,) = batch_poll.claim(w.rt)
        until = w.clock.now + timedelta(minutes=2)
        with w.rt.sessions.begin() as s:
            held = jobstore.hold_claims_with_status(
                s, [(claim.job.id, claim.generation, claim.seq, "ok")], until)
        assert set(held) == {running}
        job = w.job(running)
        assert (job.poll_due_at, job.poll_lease_expires_at, job.provider_status) == (
            until, until, "ok")
        assert w.audit() == []
    finally:
        engine.dispose()


@pytest.mark.parametrize("where", ["others", "running"])
def test_a_length_limited_provider_status_poisons_no_other_row_of_the_round(
        pg_databases: Any, simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    """``provider_status varchar(16)`` (accepted by ``db check`` with a NOTE: "a longer value
    fails its write"); one job's provider answers a 20-character status. That row's write may
    fail, but no other job of the round may lose its outcome: the grouped hold falls back to one
    hold per job (``_HOLD_EACH``) for exactly this — does the set-based write of the rows still
    running?"""
    db, engine = _platform_db(pg_databases, "varchar(16)")
    try:
        w = World(db, simulator, tmp_path, poll_mode="batch", poll_batch_threads=1)
        done = w.accept(KIND, Script(timeline=((0.0, "queued"), (0.0, "succeeded"))))
        odd = w.accept(KIND, Script(timeline=FOREVER))
        if where == "others":  # past the threshold: the per-job path
            w.clock.now += THRESHOLD + timedelta(minutes=1)
        else:
            w.clock.now += timedelta(seconds=10)
        client = w.rt.client(w.rt.kind(KIND))
        real = client.poll
        task = w.task_id(odd)

        def poll(task_id: str, model: str | None = None) -> PollResult:
            if task_id == task:
                return PollResult(PollStatus.RUNNING, raw_status="PROCESSING_IN_REGION")
            return real(task_id, model=model)

        monkeypatch.setattr(client, "poll", poll)
        rounds: list[str] = []
        for _ in range(3):  # each a lease later: the rows are claimed together again
            try:
                rounds.append(batch_poll.poll_due(w.rt, budget=60).line())
            except Exception as exc:  # noqa: BLE001 - what the round did is the finding
                rounds.append(f"poll_due raised {type(exc).__name__}")
            if w.job(done).status == "completed":
                break
            w.clock.now += batch_poll.claim_lease(w.rt) + timedelta(seconds=1)
        assert w.job(done).status == "completed", (
            f"{where}: the succeeded job of the same round stays {w.job(done).status} "
            f"after {len(rounds)} rounds: {rounds}")
        assert w.refunds(done) == 0 and w.audit() == []
    finally:
        engine.dispose()


# ------------------------------------------------------------------ 5. SQLite (the embedded default)


def test_sqlite_a_round_held_one_row_at_a_time_and_fenced(
        simulator: Simulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Batch mode on SQLite: the grouped hold is one CAS per row (no unnest). A round of four
    past the threshold — succeeded, not found on the last attempt, still running, and one
    whose claim a webhook's resume takes over after the hold (its stale "not found" on the
    last attempt must fail nothing) — then the taken-over job completes once."""
    from reconcile.db.migrate import upgrade
    from reconcile.db.session import make_engine, make_sessionmaker

    url = f"sqlite:///{tmp_path}/reconcile.db"
    upgrade(url)
    w = World(make_sessionmaker(make_engine(url)), simulator, tmp_path, poll_mode="batch",
              poll_batch_threads=1, poll_batch_finalize_threads=1)
    done = w.accept(KIND, Script(timeline=((0.0, "queued"), (0.0, "succeeded"))))
    missing = w.accept(KIND, Script(timeline=FOREVER))
    running = w.accept(KIND, Script(timeline=FOREVER))
    taken = w.accept(KIND, Script(timeline=FOREVER))
    w.clock.now += THRESHOLD + timedelta(minutes=1)
    for j in (missing, taken):
        w.set(j, reconcile_attempts=MAX_ATTEMPTS - 1, reconcile_last_attempt_at=None)
    tasks = {w.task_id(missing): missing, w.task_id(taken): taken}
    client = w.rt.client(w.rt.kind(KIND))
    real = client.poll
    first: set[str] = set()

    def poll(task_id: str, model: str | None = None) -> PollResult:
        if task_id in tasks and task_id not in first:
            first.add(task_id)
            if tasks[task_id] == taken:
                w.sim.set_state(task_id, "succeeded")
            return PollResult(PollStatus.NOT_FOUND, raw_status="gone\x00")
        return real(task_id, model=model)

    monkeypatch.setattr(client, "poll", poll)
    real_observe = lifecycle.observe

    def observe(rt: Any, job: Any, *args: Any, **kw: Any) -> Any:
        if job.id == taken and kw.get("via") == "poll":
            assert lifecycle.resume_chain(w.rt, taken)
        return real_observe(rt, job, *args, **kw)

    monkeypatch.setattr(lifecycle, "observe", observe)
    report = batch_poll.poll_due(w.rt, budget=60)
    monkeypatch.setattr(lifecycle, "observe", real_observe)
    assert report.outcomes == {"completed": 1, "failed": 1, "in_flight": 1, "fenced": 1}, \
        report.line()
    assert w.job(missing).provider_status == "gone\ufffd"
    assert (w.job(taken).status, w.job(taken).reconcile_attempts) == (
        "processing", MAX_ATTEMPTS - 1)
    again = batch_poll.poll_due(w.rt, budget=60)
    assert again.outcomes == {"completed": 1}, again.line()
    assert [w.refunds(j) for j in (done, missing, running, taken)] == [0, 1, 0, 0]
    assert w.completions(taken) == 1
