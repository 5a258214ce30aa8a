"""Attacks on 9a47af1, the storing mark (``jobs.storing_until``): whoever reads "succeeded" marks
the row before storing the outputs (``lifecycle.poll._store`` / ``_mark_storing``), a storing
that raises ends its own mark (``jobstore.end_storing``, a compare-and-set on the exact value)
and ``lifecycle.exhaust`` refuses to fail a job while a mark lasts (``jobstore.not_storing``).

PostgreSQL (and SQLite where named), the simulator and an injected clock (``World``). Each test
states what must hold and, for a finding, what happens. Money rules: a task that succeeded
upstream (nobody asked the job to stop) ends ``completed`` exactly once, no refund, the audit
clean; a job whose task never finishes (or whose outputs can never be stored) is failed and
refunded by its exhaustion horizon plus a few attempt spacings, never kept alive by marks.

Findings (they fail at 9a47af1):

* ``test_a_second_storers_failure_does_not_unmark_the_first_storer`` (8 cases) — one column
  holds every storer's mark: a second reader of the success (the chain a "succeeded" webhook
  resumes, a sweep counting beyond the last attempt, the poller after a lapsed heartbeat)
  whose own download fails ends the mark — reused or moved later, it is the first storer's
  too — and its own no-verdict outcome (or the next stale read) exhausts the job while the
  first storer stores: failed and refunded, the completion loses.
* ``test_batch_a_grouped_mark_ended_by_the_sweep_is_not_trusted_by_the_rounds_storing`` —
  the round's own storing trusts the grouped hold's returned row and writes no mark, though
  the sweep ended that mark meanwhile: B stores unmarked and is exhausted.
* ``test_batch_two_rounds_in_one_process_hold_the_later_rounds_success_while_it_waits`` —
  the grouped hold's list-scheduling bound assumes the round has the finalize pool to itself;
  two rounds in one process (a threads worker) share it, and a success queued behind the other
  round's storings outlives its mark and claim before it starts: exhausted by a stale read.
* ``test_a_success_never_stored_is_failed_by_its_horizon_on_a_mark_column_db_check_accepts``
  (4 cases) — on a ``jobs.storing_until`` that ``db check`` accepts but of reduced precision
  (``timestamp(3)``, ``timestamptz(0)``: the exact-value CAS never matches) or NOT NULL with a
  default (``SET … = NULL`` raises), no failed storing ends its mark: every reader's own
  exhaustion is refused by its own mark, and a success whose media can never be stored stays
  in flight indefinitely (measured: 3 hours past the horizon, 55 attempts).
* ``test_the_audit_stays_empty_while_a_success_read_on_the_last_attempt_is_stored`` — the
  ledger audit's horizon knows nothing of the mark: a legitimately marked storing (5 outputs,
  16 minutes, inside its 20-minute mark) is reported ``in_flight_past_horizon``.

Held (they pass; each can fail — an ``end_storing`` stubbed to a no-op fails the liveness and
compare-and-set ones): a success whose media always fails (each media error, chain and batch,
a "succeeded" webhook every minute, a round of six with 1 and 8 finalize threads, time scale
0.01 with heartbeats off) is failed by its horizon; a mark left once (``end_storing`` raising,
the worker killed mid-fetch) only delays that; the failure share is kept once; a cancel or an
operator's fail wins at once over a dead storer's mark; the exact-value CAS ends the chain's
and the grouped hold's marks on PostgreSQL, SQLite and naive columns in a non-UTC zone;
revision 0031 down and up with a job in flight, SQLite from 0030; ``db check`` on a platform's
own ``storing_until`` of another type.
"""

from __future__ import annotations

import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session, sessionmaker

from reconcile import jobstore, lifecycle
from reconcile.db.migrate import downgrade, upgrade
from reconcile.db.session import make_engine, make_sessionmaker
from reconcile.errors import MediaExpired, MediaFetchFailed, MediaTooLarge, UnsafeMediaURL
from reconcile.jobstore import horizon
from reconcile.lifecycle import batch as batch_poll
from reconcile.providers import PollResult, PollStatus
from reconcile.states import ATTEMPT_SPACING, MAX_ATTEMPTS
from reconcile.testing.platform_schema import create_platform_tables
from reconcile.testing.simulator import Script, Simulator
from tests.conftest import PgDatabases
from tests.integration._platform_db import clean_sessions, platform_database
from tests.integration._sweep_helpers import FOREVER, World
from tests.integration.test_attack_storing import naive_zoned as naive_zoned, ndb as ndb
from tests.integration.test_attack_unheld import _given_back, _money, _stale_reads

KIND = "replicate-prediction"
THRESHOLD = timedelta(minutes=20)  # replicate's stale threshold


def _world(db: sessionmaker[Session], sim: Simulator, tmp: Path, mode: str,
           **settings: Any) -> World:
    return World(db, sim, tmp, poll_mode=mode, **{"poll_batch_threads": 1,
                                                 "poll_batch_finalize_threads": 1, **settings})


def _last_attempt(w: World, job_id: uuid.UUID) -> None:
    """The job's next counted attempt is its last; its task has succeeded upstream."""
    w.set(job_id, reconcile_attempts=MAX_ATTEMPTS - 1, reconcile_last_attempt_at=None)
    w.sim.set_state(w.task_id(job_id), "succeeded")


def _failing_fetch(monkeypatch: pytest.MonkeyPatch, error: type[Exception] = MediaFetchFailed
                   ) -> list[str]:
    """While the returned list is non-empty, every output fetch raises ``error``."""
    import reconcile.media.fetch as fetch_mod

    real = fetch_mod.safe_fetch
    failing: list[str] = []

    def fetch(url: str, **kw: Any) -> Any:
        if failing:
            raise error(f"fetch failed ({failing[-1]})")
        return real(url, **kw)

    monkeypatch.setattr(fetch_mod, "safe_fetch", fetch)
    return failing


def _inside_first_storing(monkeypatch: pytest.MonkeyPatch, job_id: uuid.UUID, source: str,
                          inside: Callable[[], str]) -> list[str]:
    """The first storing of the job by ``source`` ("poll", "sweep") runs ``inside()`` before
    its downloads (re-entrant: a storing started by ``inside`` runs plainly)."""
    import reconcile.lifecycle.poll as poll_mod

    real = poll_mod.finalize_job_with_media
    seen: list[str] = []

    def finalize(rt: Any, jid: uuid.UUID, result: Any, **kw: Any) -> bool:
        if jid == job_id and kw.get("source") == source and not seen:
            seen.append("(running)")
            seen[0] = str(inside())
        return real(rt, jid, result, **kw)

    monkeypatch.setattr(poll_mod, "finalize_job_with_media", finalize)
    return seen


def _stale_switch(w: World, monkeypatch: pytest.MonkeyPatch, job_id: uuid.UUID) -> list[str]:
    """While the returned list is non-empty, a read of the job's task says "not found" (a
    transient miss) whatever the task's state."""
    task = w.task_id(job_id)
    client = w.rt.client(w.rt.kind(w.job(job_id).provider_kind or ""))
    real = client.poll
    stale: list[str] = []

    def poll(task_id: str, model: str | None = None) -> PollResult:
        if task_id == task and stale:
            return PollResult(PollStatus.NOT_FOUND)
        return real(task_id, model=model)

    monkeypatch.setattr(client, "poll", poll)
    return stale


def _run_chain_messages(w: World) -> list[str]:
    out = []
    while w.q.polls:
        jid, generation, seq = w.q.polls.popleft()
        out.append(lifecycle.poll_step(w.rt, jid, generation, seq))
    return out


def _poll_once(w: World, mode: str, job_id: uuid.UUID) -> str:
    """The job's poller runs once: chain — a live chain's turn (resumed, its message run);
    batch — the row due now, one ``poll_due``."""
    if mode == "batch":
        w.set(job_id, poll_due_at=w.clock.now - timedelta(seconds=1))
        return batch_poll.poll_due(w.rt, budget=60).line()
    assert lifecycle.resume_chain(w.rt, job_id)
    _, generation, seq = w.q.polls.popleft()
    return lifecycle.poll_step(w.rt, job_id, generation, seq)


def _webhook_succeeded(w: World, job_id: uuid.UUID) -> Any:
    from reconcile.webhook_ingest import _confirm

    return _confirm(w.rt, w.job(job_id), w.rt.kind(KIND), SimpleNamespace(
        failed=False, signed_body=b"", status="succeeded", error=None))


# ============================================================================ findings


SECOND = [("webhook", 5), ("webhook", 30), ("sweep", 30), ("reaped", 30)]


@pytest.mark.parametrize("second,later", SECOND, ids=["webhook-mark-reused", "webhook-mark-moved",
                                                      "sweep-beyond-last", "heartbeat-lapsed"])
@pytest.mark.parametrize("mode", ["chain", "batch"])
def test_a_second_storers_failure_does_not_unmark_the_first_storer(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, mode: str, second: str, later: int) -> None:
    """The job's poller P reads "succeeded" and marks the row (255 s) while it downloads.
    ``later`` seconds in, a second reader reads "succeeded" too and marks the row — reusing P's
    mark when it still ends within the slack (5 s), else moving it later (30 s):

    * ``webhook``: the provider's "succeeded" webhook (the job's next attempt is its last): its
      confirming read resumes the polling (a new generation), whose poller C reads;
    * ``sweep``: the job's attempts are all counted (MAX, the last one 6 minutes ago, as when a
      sweep counted it while P held the row): a sweep tick's claim counts one beyond the last,
      so its read is no longer fenced by P's hold (``reader_claim``).
    * ``reaped``: P's worker is alive but its heartbeat lapsed (a long GC pause, a saturated
      host): the reaper ends P's turn / claim (chain: its own plan polls the row; batch: the
      row is due and the next ``poll_due`` claims it) — the change's own "heartbeat lapsed
      while alive" case.

    The second reader's download fails (a transient fetch error; P's downloads are fine). Its
    storing "ends its own mark": ``end_storing`` clears ``storing_until`` to NULL — the one
    column that also carried P's mark. Its no-verdict outcome then exhausts the job and
    ``exhaust`` finds no mark (chain ``heartbeat-lapsed``: the reaper's read is fenced, and the
    chain it resumed reads a stale "not found" 30 s later and exhausts it): the job is failed
    and refunded while P is still storing; P's completion loses.

    Must hold: the row stays marked while P stores; completed once, no refund.
    Happens (all eight): ``storing_until`` NULL, the job failed and refunded."""
    w = _world(db, simulator, tmp_path, mode)
    job_id = w.accept(KIND, Script(timeline=FOREVER))
    w.clock.now += THRESHOLD + timedelta(minutes=1)
    _last_attempt(w, job_id)
    if second == "sweep":
        w.set(job_id, reconcile_attempts=MAX_ATTEMPTS,
              reconcile_last_attempt_at=w.clock.now - timedelta(minutes=6))
    if second == "reaped":
        with w.db.begin() as s:
            jobstore.register_worker(s, "w-A", "host", 1, w.clock.now, timedelta(seconds=6))
        w.rt.worker_id = "w-A"
    failing = _failing_fetch(monkeypatch)
    stale = _stale_switch(w, monkeypatch, job_id)
    marks: list[Any] = []

    def meanwhile() -> str:
        w.clock.now += timedelta(seconds=later)
        failing.append("second reader")
        worker, w.rt.worker_id = w.rt.worker_id, None
        try:
            if second == "reaped":
                from reconcile.sweep.liveness import reap

                other = reap(w.rt).line() + " " + str(
                    _run_chain_messages(w) if mode == "chain"
                    else batch_poll.poll_due(w.rt, budget=60).line())
            elif second == "sweep":
                other = str([(a.action, a.outcome) for a in w.tick().actions])
            else:
                other = f"webhook={_webhook_succeeded(w, job_id)} " + str(
                    _run_chain_messages(w) if mode == "chain"
                    else batch_poll.poll_due(w.rt, budget=60).line())
        finally:
            failing.clear()
            w.rt.worker_id = worker
        job = w.job(job_id)
        marks.append(job.storing_until)
        if job.status == "processing":  # 30 s later, whoever polls next reads a stale miss
            w.clock.now += timedelta(seconds=30)
            stale.append("on")
            try:
                other += f" then tick={[(a.action, a.outcome) for a in w.tick().actions]} " + str(_run_chain_messages(w) if mode == "chain"
                                        else batch_poll.poll_due(w.rt, budget=60).line())
            finally:
                stale.clear()
            job = w.job(job_id)
        return f"{second}: {other} -> {job.status} {job.error_code}"

    seen = _inside_first_storing(monkeypatch, job_id, "poll", meanwhile)
    first_at = w.clock.now
    outcome = _poll_once(w, mode, job_id)
    assert seen, outcome
    mark = marks[0]
    assert mark is not None and mark > first_at + timedelta(seconds=later), (
        f"P still storing, the row unmarked: storing_until={mark} ({seen[0]})")
    _money(w, job_id, f"poller={outcome} {seen[0]}")


def test_batch_a_grouped_mark_ended_by_the_sweep_is_not_trusted_by_the_rounds_storing(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Batch mode, one finalize thread, no webhook. One round reads two successes: A, then B
    (its next attempt the last). The grouped hold marks B until A's bound plus its own (now +
    510 s) and hands B's outcome that row. While A stores (5 s in), a sweep tick claims B's
    last attempt (B is held: its no-verdict outcome may not exhaust), reads "succeeded" too,
    reuses the grouped mark (it ends later than now + storing_hold − slack), and its own fetch
    fails: it ends that mark (``storing_until`` NULL). A completes 100 s in. B's storing then
    starts: ``_mark_storing`` trusts the row the grouped hold returned (marked until +510 s)
    and writes nothing — B stores unmarked. 300 s later (still inside B's grouped mark) the
    next sweep tick counts one attempt beyond the last (no longer fenced by B's claim), reads
    a stale "not found" and ``exhaust`` finds no mark: B is failed and refunded; B's completion
    loses.

    Must hold: the row is marked while B stores; A and B completed once, no refund.
    Happens: ``storing_until`` NULL during B's storing; B failed (exhausted) and refunded."""
    w = _world(db, simulator, tmp_path, "batch", poll_batch_threads=2)
    first = w.accept(KIND, Script(timeline=FOREVER))
    second = w.accept(KIND, Script(timeline=FOREVER))
    w.clock.now += THRESHOLD + timedelta(minutes=1)
    _last_attempt(w, second)
    w.sim.set_state(w.task_id(first), "succeeded")
    # A's attempt is not due at the ticks below: only B is the sweep's
    w.set(first, poll_due_at=w.clock.now - timedelta(seconds=2),
          reconcile_last_attempt_at=w.clock.now + timedelta(minutes=10))
    w.set(second, poll_due_at=w.clock.now - timedelta(seconds=1))
    failing = _failing_fetch(monkeypatch)
    stale: list[str] = []
    _stale_reads(w, monkeypatch, second, stale)
    import reconcile.lifecycle.poll as poll_mod

    real = poll_mod.finalize_job_with_media
    seen: dict[str, str] = {}
    marks: list[Any] = []

    def finalize(rt: Any, jid: uuid.UUID, result: Any, **kw: Any) -> bool:
        if kw.get("source") == "poll" and jid == first and "A" not in seen:
            seen["A"] = "(running)"
            w.clock.now += timedelta(seconds=5)
            failing.append("the sweep's fetch")
            try:
                seen["A"] = str([(a.action, a.outcome) for a in w.tick().actions])
            finally:
                failing.clear()
            w.clock.now += timedelta(seconds=95)
        elif kw.get("source") == "poll" and jid == second and "B" not in seen:
            seen["B"] = "(running)"
            marks.append(w.job(second).storing_until)
            w.clock.now += timedelta(seconds=300)
            stale.append("on")
            try:
                seen["B"] = str([(a.action, a.outcome) for a in w.tick().actions])
            finally:
                stale.clear()
        return real(rt, jid, result, **kw)

    monkeypatch.setattr(poll_mod, "finalize_job_with_media", finalize)
    started = w.clock.now
    outcome = batch_poll.poll_due(w.rt, budget=60).line()
    assert set(seen) == {"A", "B"}, (outcome, seen)
    assert marks[0] is not None and marks[0] > started + timedelta(seconds=400), (
        f"B stores unmarked: storing_until={marks[0]} ({seen})")
    _money(w, first, outcome)
    _money(w, second, f"{outcome} {seen}")


def test_batch_two_rounds_in_one_process_hold_the_later_rounds_success_while_it_waits(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Batch mode on a threads worker (supported: it relies on beat), two finalize threads:
    the process's finalize pool (``batch_reads.finalize_pool``) is shared by every round the
    process runs. Round A's two successes (3 outputs each: marked 735 s and more) occupy both
    threads, storing for 300 s. Meanwhile round B (another ``poll_due`` in the same process)
    reads two successes, B1 (its next attempt the last) and B2; its grouped hold marks B1 for
    255 s as if its outcomes started now (``_holds``: "the round's outcomes run
    ``POLL_BATCH_FINALIZE_THREADS`` at a time"), and both wait in the pool's queue behind A's.
    At +300 s B1's mark and claim have ended before its storing started: a sweep tick claims
    B1's last attempt, reads a stale "not found" and exhausts it. B1's storing then finds the
    job failed and its completion loses.

    Must hold: B1 and B2 completed once, no refund (their marks cover the wait of a shared
    pool). Happens: B1 failed (exhausted) and refunded."""
    w = _world(db, simulator, tmp_path, "batch", poll_batch_threads=2, poll_batch_size=2,
               poll_batch_finalize_threads=2)
    a_ids = [w.accept(KIND, Script(timeline=FOREVER, outputs=3)) for _ in range(2)]
    b_ids = [w.accept(KIND, Script(timeline=FOREVER)) for _ in range(2)]
    w.clock.now += THRESHOLD + timedelta(minutes=1)
    _last_attempt(w, b_ids[0])
    later = w.clock.now + timedelta(minutes=10)
    for jid in a_ids:
        w.sim.set_state(w.task_id(jid), "succeeded")
        w.set(jid, poll_due_at=w.clock.now - timedelta(seconds=1), reconcile_last_attempt_at=later)
    for jid in b_ids:
        w.sim.set_state(w.task_id(jid), "succeeded")
        w.set(jid, poll_due_at=w.clock.now + timedelta(hours=1))
    w.set(b_ids[1], reconcile_last_attempt_at=later)
    stale: list[str] = []
    _stale_reads(w, monkeypatch, b_ids[0], stale)
    import reconcile.lifecycle.poll as poll_mod

    real = poll_mod.finalize_job_with_media
    entered = threading.Semaphore(0)
    release = threading.Event()
    b_held = threading.Event()

    def finalize(rt: Any, jid: uuid.UUID, result: Any, **kw: Any) -> bool:
        if jid in a_ids and kw.get("source") == "poll":
            entered.release()
            assert release.wait(60), "never released"
        return real(rt, jid, result, **kw)

    monkeypatch.setattr(poll_mod, "finalize_job_with_media", finalize)
    real_hold = jobstore.hold_claims_with_status

    def grouped(session: Any, rows: Any, until: Any, **kw: Any) -> Any:
        held = real_hold(session, rows, until, **kw)
        if any(r[0] == b_ids[0] for r in rows):
            b_held.set()
        return held

    monkeypatch.setattr(jobstore, "hold_claims_with_status", grouped)
    reports: dict[str, str] = {}

    def run(name: str) -> None:
        try:
            reports[name] = batch_poll.poll_due(w.rt, budget=60).line()
        except BaseException as exc:  # noqa: BLE001 - reported below
            reports[name] = repr(exc)

    round_a = threading.Thread(target=run, args=("A",))
    round_b = threading.Thread(target=run, args=("B",))
    tick = ""
    try:
        round_a.start()
        assert entered.acquire(timeout=60) and entered.acquire(timeout=60), reports
        for jid in b_ids:
            w.set(jid, poll_due_at=w.clock.now - timedelta(seconds=1))
        round_b.start()
        assert b_held.wait(60), reports
        w.clock.now += timedelta(seconds=300)
        stale.append("on")
        tick = str([(a.action, a.outcome) for a in w.tick().actions])
        stale.clear()
    finally:
        release.set()
        round_a.join(120)
        round_b.join(120)
    for jid in a_ids:
        _money(w, jid, f"{reports}")
    for jid in b_ids:
        _money(w, jid, f"{reports} tick={tick}")


def test_the_audit_stays_empty_while_a_success_read_on_the_last_attempt_is_stored(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A sweep tick claims the job's last attempt (its chain is dead) and reads "succeeded",
    5 outputs: it marks the row for ``storing_hold`` (5 × 240 s + 15 s, 20¼ minutes), as the
    change means it to, so no failure may happen meanwhile. The downloads and uploads take
    16 minutes (each output's fetch and upload within ``MEDIA_TIMEOUT``). The ledger audit run
    meanwhile (``in_flight_past_horizon``: the exhaustion deadline plus the grace, 10 minutes,
    and one sweep interval, 5) knows nothing of the mark: its deadline is the last attempt.

    Must hold: the audit is empty while a marked success is being stored (the job then
    completes once). Happens: ``in_flight_past_horizon`` for a job the library itself keeps
    in flight — an operator paging on the audit sees a violation; the mark's bound (up to
    ``MAX_OUTPUTS_PER_JOB`` × 2 × ``MEDIA_TIMEOUT``: 4¼ hours at the defaults) is not the
    audit's."""
    w = _world(db, simulator, tmp_path, "chain")
    job_id = w.accept(KIND, Script(timeline=FOREVER, outputs=5))
    w.clock.now += THRESHOLD + timedelta(minutes=1)
    _last_attempt(w, job_id)
    found: list[Any] = []

    def meanwhile() -> str:
        w.clock.now += timedelta(minutes=16)
        found.extend(w.audit())
        return f"storing_until={w.job(job_id).storing_until} now={w.clock.now}"

    seen = _inside_first_storing(monkeypatch, job_id, "sweep", meanwhile)
    report = w.tick()
    assert seen, report
    assert found == [], f"{seen[0]}: {found}"
    _money(w, job_id, str([(a.action, a.outcome) for a in report.actions]))


# ---------------------------------------------------------------- liveness: media never stored


def _pollers(w: World, mode: str) -> None:
    """What the job's pollers do in one minute: chain — the turns queued now (each sends the
    next); batch — one ``poll_due``."""
    if mode == "chain":
        for jid, generation, seq in list(w.q.polls):
            w.q.polls.popleft()
            lifecycle.poll_step(w.rt, jid, generation, seq)
    else:
        batch_poll.poll_due(w.rt, budget=60)


def _until_failed(w: World, job_id: uuid.UUID, mode: str, *, spacings: int = 3,
                  each_minute: Callable[[], None] | None = None) -> str:
    """Every minute: the pollers, a sweep tick (and ``each_minute``), until the job is no
    longer in flight or its exhaustion horizon plus ``spacings`` attempt spacings has passed."""
    deadline = horizon.exhaustion_deadline(w.rt.settings, w.job(job_id))
    assert deadline is not None
    limit = deadline + spacings * w.rt.settings.scaled(ATTEMPT_SPACING)
    while w.clock.now <= limit and w.job(job_id).status in ("pending", "processing"):
        w.clock.now += timedelta(minutes=1)
        _pollers(w, mode)
        w.tick()
        if each_minute is not None:
            each_minute()
    job = w.job(job_id)
    return (f"{mode}: {job.status} {job.error_code} at {w.clock.now - deadline} past its "
            f"horizon, attempts={job.reconcile_attempts} storing_until={job.storing_until} "
            f"now={w.clock.now}")


def _never_stored(w: World, monkeypatch: pytest.MonkeyPatch, mode: str,
                  error: type[Exception] = MediaExpired) -> uuid.UUID:
    """A job whose task succeeded at once and whose every output fetch fails with ``error``;
    chain mode: its chain running."""
    w.clock.now = w.clock.now.replace(microsecond=123_457)  # a real clock's microseconds
    job_id = w.accept(KIND, Script(timeline=FOREVER))
    w.sim.set_state(w.task_id(job_id), "succeeded")
    _failing_fetch(monkeypatch, error).append("always")
    if mode == "chain":
        assert lifecycle.resume_chain(w.rt, job_id)
    return job_id


def _assert_exhausted(w: World, job_id: uuid.UUID, where: str) -> None:
    job = w.job(job_id)
    assert job.status == "failed", where
    assert w.refunds(job_id) == 1 and w.audit() == [], where
    assert w.anomalies(job_id, "reconcile_exhausted") == ["reconcile_exhausted"], where


ODD_MARKS = ["timestamp(3) without time zone", "timestamp(0) with time zone",
             "timestamptz NOT NULL DEFAULT now()"]


@pytest.fixture(scope="module", params=ODD_MARKS, ids=["ts3-naive", "tstz0", "notnull-now"])
def odd_mark(request: pytest.FixtureRequest, pg_databases: PgDatabases) -> Iterator[Engine]:
    """A platform database whose ``jobs.storing_until`` already exists as ``reconcile db
    check`` accepts it (``reconcile db upgrade`` keeps it: ``ADD COLUMN IF NOT EXISTS``): of
    a reduced precision (``timestamp(3)``: Prisma's ``DateTime``; ``timestamptz(0)``), or NOT
    NULL with a default (the contract lists the column among those the library never writes
    NULL)."""
    _, engine = platform_database(
        pg_databases, "rtprec", naive=request.param.endswith("without time zone"),
        before_upgrade=(f"ALTER TABLE jobs ADD COLUMN storing_until {request.param}",))
    yield engine
    engine.dispose()


@pytest.fixture
def odb(odd_mark: Engine) -> sessionmaker[Session]:
    return clean_sessions(odd_mark)


@pytest.mark.parametrize("mode", ["chain", "batch"])
def test_a_success_never_stored_is_failed_by_its_horizon_on_a_mark_column_db_check_accepts(
        odb: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """Liveness. The platform's ``jobs.storing_until`` is one ``db check`` accepts (at most a
    note) but of milliseconds (Prisma's ``timestamp(3)``) or seconds (``timestamptz(0)``), or
    NOT NULL with a default. The task succeeded; every output fetch fails (expired media). Each
    reader that reads "succeeded" marks the row and, its storing failed, ends "its own mark":
    on a reduced precision by the exact microsecond value it wrote (no RETURNING: the chain's,
    the sweep's), which never matches the rounded one; on NOT NULL its ``SET storing_until =
    NULL`` raises (chain and batch: the media error becomes an INTERNAL one). Its own no-verdict
    outcome then reaches ``exhaust``, which its own live mark refuses ("lost": the chain
    stops). The sweep's read every spacing re-marks the row first and is refused the same way.

    Must hold: failed and refunded by the horizon plus three attempt spacings (as on a
    microsecond nullable column: ``test_a_success_never_stored_is_failed_by_its_horizon``).
    Happens (chain on all three, batch on NOT NULL): ``processing`` past that, attempts beyond
    MAX, a fresh mark at each read; measured: still ``processing`` 3 hours past the horizon
    (attempts 55), for as long as the provider answers "succeeded"."""
    from reconcile.db.contract import check

    found = [f.line() for f in check(odb.kw["bind"]) if "storing_until" in f.where]
    w = _world(odb, simulator, tmp_path, mode)
    job_id = _never_stored(w, monkeypatch, mode)
    where = _until_failed(w, job_id, mode)
    _assert_exhausted(w, job_id, f"{where}; db check on the column: {found}")


MEDIA_ERRORS = [MediaExpired, MediaFetchFailed, MediaTooLarge, UnsafeMediaURL]


@pytest.mark.parametrize("error", MEDIA_ERRORS, ids=lambda e: e.__name__)
@pytest.mark.parametrize("mode", ["chain", "batch"])
def test_a_success_never_stored_is_failed_by_its_horizon(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, mode: str, error: type[Exception]) -> None:
    """Held. The provider answers "succeeded" at every read, every output fetch fails
    (expired, failed, too large, an unsafe URL). Each storing marks the row and ends its own
    mark when it raises, so its no-verdict outcome counts and, at the last attempt, exhausts
    the job. Must hold: failed and refunded once by the horizon plus three spacings."""
    w = _world(db, simulator, tmp_path, mode)
    job_id = _never_stored(w, monkeypatch, mode, error)
    where = _until_failed(w, job_id, mode)
    _assert_exhausted(w, job_id, where)


@pytest.mark.parametrize("threads", [1, 8])
def test_batch_a_round_of_successes_never_stored_is_failed_by_the_horizon(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, threads: int) -> None:
    """Held. Batch mode, ``POLL_BATCH_FINALIZE_THREADS`` 1 and 8: six successes (1 to 6
    outputs) read in one round each minute, every fetch failing: the grouped hold marks each
    with its list-scheduling bound (up to 6 × 1455 s with one thread) and each job's own
    failed storing ends that mark. Must hold: all six failed and refunded once by the horizon
    plus three spacings."""
    w = _world(db, simulator, tmp_path, "batch", poll_batch_threads=8, poll_batch_size=8,
               poll_batch_finalize_threads=threads)
    w.clock.now = w.clock.now.replace(microsecond=31_415)
    ids = [w.accept(KIND, Script(timeline=FOREVER, outputs=n)) for n in range(1, 7)]
    for jid in ids:
        w.sim.set_state(w.task_id(jid), "succeeded")
    _failing_fetch(monkeypatch, MediaFetchFailed).append("always")
    deadline = max(d for d in (horizon.exhaustion_deadline(w.rt.settings, w.job(j))
                               for j in ids) if d is not None)
    limit = deadline + 3 * w.rt.settings.scaled(ATTEMPT_SPACING)
    while w.clock.now <= limit and any(w.job(j).status == "processing" for j in ids):
        w.clock.now += timedelta(minutes=1)
        _pollers(w, "batch")
        w.tick()
    where = [(w.job(j).status, w.job(j).reconcile_attempts, w.job(j).storing_until) for j in ids]
    for jid in ids:
        _assert_exhausted(w, jid, f"{w.clock.now - deadline} past: {where}")


@pytest.mark.parametrize("mode", ["chain", "batch"])
def test_a_success_never_stored_with_a_succeeded_webhook_every_minute(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """Liveness under a flood. As above (fetches fail: expired), and the provider delivers a
    "succeeded" webhook every minute: each confirming read resumes the polling (a new
    generation; chain: a message), each new poller reads "succeeded" and marks the row. Must
    hold: failed and refunded once by the horizon plus three spacings."""
    w = _world(db, simulator, tmp_path, mode)
    job_id = _never_stored(w, monkeypatch, mode)

    def deliver() -> None:
        if w.job(job_id).status in ("pending", "processing"):
            _webhook_succeeded(w, job_id)

    where = _until_failed(w, job_id, mode, each_minute=deliver)
    _assert_exhausted(w, job_id, where)


class _Died(BaseException):
    """The worker process died here (SIGKILL, OOM): nothing after it runs."""


@pytest.mark.parametrize("fault", ["end_storing_db_error", "worker_killed_mid_fetch"])
@pytest.mark.parametrize("mode", ["chain", "batch"])
def test_a_storing_whose_mark_is_not_ended_once_still_exhausts_by_the_horizon(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, mode: str, fault: str) -> None:
    """Held. As ``test_a_success_never_stored_is_failed_by_its_horizon`` (expired media at
    every fetch), and once, on the job's last attempt, the failed storing does not end its
    mark: ``end_storing`` itself raises (a database error: the media error becomes an
    INTERNAL one, the mark stays, the poller's own exhaustion is refused, "lost"), or the
    worker dies in the fetch (a BaseException: ``_store`` ends nothing). Must hold: the mark
    only delays the failure (255 s, then the sweep) — failed and refunded once by the horizon
    plus three spacings; no attempt beyond that keeps it alive."""
    w = _world(db, simulator, tmp_path, mode)
    job_id = _never_stored(w, monkeypatch, mode)
    w.set(job_id, reconcile_attempts=MAX_ATTEMPTS - 1,
          reconcile_last_attempt_at=w.clock.now - timedelta(minutes=6))
    w.clock.now += THRESHOLD
    faults: list[str] = []
    if fault == "end_storing_db_error":
        from sqlalchemy.exc import OperationalError

        real_end = jobstore.end_storing

        def end(session: Any, jid: uuid.UUID) -> bool:
            if not faults:
                faults.append("end_storing raised")
                raise OperationalError("UPDATE jobs", {}, Exception("server closed the connection"))
            return real_end(session, jid)

        monkeypatch.setattr(jobstore, "end_storing", end)
    else:
        import reconcile.media.fetch as fetch_mod

        failing_fetch = fetch_mod.safe_fetch

        def fetch(url: str, **kw: Any) -> Any:
            if not faults:
                faults.append("worker killed in the fetch")
                raise _Died("SIGKILL")
            return failing_fetch(url, **kw)

        monkeypatch.setattr(fetch_mod, "safe_fetch", fetch)

    real_pollers = _pollers

    def guarded(w_: World, mode_: str) -> None:
        try:
            real_pollers(w_, mode_)
        except _Died:
            w_.lose_messages()  # the dead worker's chain message is gone with it

    monkeypatch.setattr(sys.modules[__name__], "_pollers", guarded)
    where = _until_failed(w, job_id, mode)
    assert faults, where
    _assert_exhausted(w, job_id, f"{faults}: {where}")


@pytest.mark.parametrize("mode", ["chain", "batch"])
def test_exhaustion_after_failed_storings_settles_by_the_failure_share_once(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """Held. ``failure_refund`` 1/3, ``cancel_refund`` 1/2: a success whose every fetch fails
    is exhausted once its marks have ended; the failure's share is kept exactly once, later
    ticks change nothing, the audit is clean."""
    from reconcile.settlement import kept_of

    w = _world(db, simulator, tmp_path, mode, failure_refund="1/3", cancel_refund="1/2")
    job_id = _never_stored(w, monkeypatch, mode)
    where = _until_failed(w, job_id, mode)
    assert w.job(job_id).status == "failed", where
    assert w.anomalies(job_id, "reconcile_exhausted") == ["reconcile_exhausted"], where
    kept = kept_of(40, Fraction(1, 3))
    for _ in range(3):
        w.clock.now += timedelta(minutes=5)
        w.tick()
    job = w.job(job_id)
    assert job.credits_actual == kept and w.audit() == [], where
    assert _given_back(w, job_id) == [("RELEASE", 40 - kept)], where


@pytest.mark.parametrize("scale", [0.01], ids=["time_scale-0.01"])
@pytest.mark.parametrize("mode", ["chain", "batch"])
def test_a_scaled_world_exhausts_a_success_never_stored(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, mode: str, scale: float) -> None:
    """Held. ``TIME_SCALE`` 0.01, heartbeats off (``heartbeat_interval`` 0), ticks every
    scaled minute: the marks (2.55 s) and the horizon scale together; failed and refunded once
    by the horizon plus three spacings."""
    w = _world(db, simulator, tmp_path, mode, time_scale=scale, heartbeat_interval=0)
    job_id = _never_stored(w, monkeypatch, mode)
    deadline = horizon.exhaustion_deadline(w.rt.settings, w.job(job_id))
    assert deadline is not None
    limit = deadline + 3 * w.rt.settings.scaled(ATTEMPT_SPACING)
    while w.clock.now <= limit and w.job(job_id).status == "processing":
        w.clock.now += w.rt.settings.scaled(timedelta(minutes=1))
        _pollers(w, mode)
        w.tick()
    job = w.job(job_id)
    _assert_exhausted(w, job_id, f"{job.status} at {w.clock.now - deadline} past, "
                                 f"attempts={job.reconcile_attempts}")


@pytest.mark.parametrize("action", ["cancel", "operator_fail"])
@pytest.mark.parametrize("mode", ["chain", "batch"])
def test_a_stop_wins_at_once_over_a_mark_left_by_a_dead_storer(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, mode: str, action: str) -> None:
    """Held. A storer died mid-fetch (its mark, 255 s, is left on the row). The user cancels /
    an operator fails the job 10 s later. Must hold: the stop wins at once (not after the
    mark), settled once, the audit clean; later reads of "succeeded" complete nothing."""
    from reconcile import operator

    w = _world(db, simulator, tmp_path, mode)
    job_id = w.accept(KIND, Script(timeline=FOREVER))
    w.sim.set_state(w.task_id(job_id), "succeeded")
    import reconcile.media.fetch as fetch_mod

    def dies(url: str, **kw: Any) -> Any:
        raise _Died("SIGKILL")

    monkeypatch.setattr(fetch_mod, "safe_fetch", dies)
    with pytest.raises(_Died):
        _poll_once(w, mode, job_id)
    monkeypatch.undo()
    mark = w.job(job_id).storing_until
    assert mark is not None and mark > w.clock.now + timedelta(seconds=200)
    w.clock.now += timedelta(seconds=10)
    if action == "cancel":
        from reconcile.lifecycle.cancel import cancel_job

        cancel_job(w.rt, w.user, job_id)
        want = "cancelled"
    else:
        operator.run(w.rt, operator.FAIL, job_id,
                     operator=operator.Operator("ops@example.test", via="console"), reason="stuck")
        want = "failed"
    assert w.job(job_id).status == want
    for _ in range(3):
        w.clock.now += timedelta(minutes=5)
        w.lose_messages()
        _pollers(w, mode)
        w.tick()
    assert w.job(job_id).status == want and w.completions(job_id) == 0
    assert w.refunds(job_id) == 1 and w.audit() == []


# ---------------------------------------------------------- the exact-value compare-and-set


@pytest.mark.parametrize("mode", ["chain", "batch"])
def test_a_failed_storing_ends_the_mark_it_wrote_pg_and_sqlite(
        pg_and_sqlite: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """Held. PostgreSQL and SQLite, a clock with microseconds: the chain's mark (a bound
    Python time, no RETURNING) and the batch round's grouped mark (the row RETURNING gave it)
    are each ended by the job's own failed storing — its storer no longer counted afterwards,
    the job in flight with its next read scheduled."""
    w = _world(pg_and_sqlite, simulator, tmp_path, mode)
    w.clock.now = w.clock.now.replace(microsecond=654_321)
    job_id = w.accept(KIND, Script(timeline=FOREVER))
    w.sim.set_state(w.task_id(job_id), "succeeded")
    marks: list[Any] = []
    real_end = jobstore.end_storing

    def end(session: Any, jid: uuid.UUID) -> bool:
        ended = real_end(session, jid)
        marks.append((jid, ended))
        return ended

    monkeypatch.setattr(jobstore, "end_storing", end)
    _failing_fetch(monkeypatch, MediaExpired).append("once")
    outcome = _poll_once(w, mode, job_id)
    job = w.job(job_id)
    assert job.status == "processing", outcome
    # the mark stays, its one storer is no longer counted: nothing holds the job's horizon
    assert [ended for _, ended in marks] == [True] and job.storing_count == 0, (
        marks, job.storing_until, job.storing_count)


@pytest.mark.parametrize("mode", ["chain", "batch"])
def test_a_failed_storing_ends_its_mark_on_naive_columns_in_a_non_utc_zone(
        ndb: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """Held. A platform's ``timestamp without time zone`` columns, the server (or the URL) in
    New York / Tokyo: the grouped hold's ``timestamptz[]`` mark and the chain's bound mark are
    the instants, and the job's own failed storing takes its count back."""
    w = _world(ndb, simulator, tmp_path, mode, poll_batch_threads=2)
    w.clock.now = w.clock.now.replace(microsecond=987_654)
    job_id = w.accept(KIND, Script(timeline=FOREVER, outputs=3))
    other = w.accept(KIND, Script(timeline=FOREVER))  # a second row in the round
    w.sim.set_state(w.task_id(job_id), "succeeded")
    w.set(other, poll_due_at=w.clock.now - timedelta(milliseconds=500))
    seen: list[Any] = []
    import reconcile.media.fetch as fetch_mod

    def fetch(url: str, **kw: Any) -> Any:
        with ndb() as s:
            seen.append(s.execute(text("SELECT extract(epoch FROM storing_until) FROM jobs "
                                       "WHERE id = :id"), {"id": job_id}).scalar_one())
        raise MediaExpired("expired")

    monkeypatch.setattr(fetch_mod, "safe_fetch", fetch)
    now = w.clock.now
    outcome = _poll_once(w, mode, job_id)
    want = now + lifecycle.storing_hold(w.rt.settings, 3)
    assert seen and float(seen[0]) == pytest.approx(want.timestamp(), abs=0.001), (seen, want)
    job = w.job(job_id)
    assert job.status == "processing" and job.storing_count == 0, (outcome, job.storing_count)


# ------------------------------------------------------------------------- the migration


def test_revision_0031_down_and_up_with_jobs_in_flight(
        pg_databases: PgDatabases, simulator: Simulator, tmp_path: Path) -> None:
    """Held. PostgreSQL: a job in flight carrying a mark; ``downgrade 0030`` drops the column
    (the library added it) and keeps the row; ``upgrade`` adds it back (NULL: no mark) and the
    job is then polled to completion once."""
    url = pg_databases.create("rtmig")
    upgrade(url)
    engine = make_engine(url)
    try:
        db_ = make_sessionmaker(engine)
        w = World(db_, simulator, tmp_path, poll_mode="chain")
        job_id = w.accept(KIND, Script(timeline=FOREVER))
        w.set(job_id, storing_until=w.clock.now + timedelta(minutes=4))
        engine.dispose()
        downgrade(url, "0030")
        with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://")) as conn:
            cols = {r[0] for r in conn.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = 'jobs'")}
            assert "storing_until" not in cols and "poll_resumes" in cols
            assert conn.execute("SELECT status FROM jobs WHERE id = %s",
                                (job_id,)).fetchone()[0] == "processing"
        upgrade(url)
        engine.dispose()
        assert w.job(job_id).storing_until is None
        w.sim.set_state(w.task_id(job_id), "succeeded")
        assert _poll_once(w, "chain", job_id) == "completed"
        _money(w, job_id, "after 0031 down and up")
    finally:
        engine.dispose()


def test_sqlite_from_0030_upgrades_with_a_job_in_flight(
        tmp_path: Path, simulator: Simulator) -> None:
    """Held. The embedded default: a database at 0030 with a job in flight (written while the
    library was at 0030: no ``storing_until``) upgrades to head; the column is there, NULL, the
    job completes once; down to 0030 and up again round-trips."""
    url = f"sqlite:///{tmp_path / 'old.db'}"
    upgrade(url, "0030")
    engine = make_engine(url)
    with engine.begin() as conn:
        cols = {r[1] for r in conn.exec_driver_sql("PRAGMA table_info(jobs)")}
        assert "storing_until" not in cols and "poll_resumes" in cols
    engine.dispose()
    upgrade(url)
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            cols = {r[1]: r[2] for r in conn.exec_driver_sql("PRAGMA table_info(jobs)")}
        assert cols.get("storing_until", "").upper() == "DATETIME", cols
        w = World(make_sessionmaker(engine), simulator, tmp_path, poll_mode="batch")
        job_id = w.accept(KIND, Script(timeline=FOREVER))
        assert w.job(job_id).storing_until is None
        w.sim.set_state(w.task_id(job_id), "succeeded")
        assert "completed=1" in _poll_once(w, "batch", job_id)
        _money(w, job_id, "sqlite upgraded from 0030")
        assert w.job(job_id).storing_until is not None  # the mark the completion left
        engine.dispose()
        downgrade(url, "0030")
        upgrade(url)
        assert w.job(job_id).status == "completed"
    finally:
        engine.dispose()


@pytest.mark.parametrize("shape,level", [
    ("text", "breaks"), ("timestamptz NOT NULL", "breaks"), ("bigint", "breaks"),
    ("timestamp without time zone", "note")])
def test_db_check_on_a_platforms_own_storing_until(
        pg_databases: PgDatabases, shape: str, level: str) -> None:
    """Held. A platform whose ``jobs.storing_until`` already exists (``db upgrade`` keeps it):
    ``reconcile db check`` calls text, a number or NOT NULL without a default breaking, and a
    naive timestamp a note."""
    from reconcile.db.contract import check

    url = pg_databases.create("rtshape")
    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"),
                         autocommit=True) as conn:
        create_platform_tables(conn)
        conn.execute(f"ALTER TABLE jobs ADD COLUMN storing_until {shape}")
    upgrade(url)
    engine = make_engine(url)
    try:
        found = [(f.level, f.line()) for f in check(engine) if f.where == "jobs.storing_until"]
    finally:
        engine.dispose()
    assert [lv for lv, _ in found] == [level], found
