"""Attacks on f3cbe88 (``jobs.poll_resumes``; the turnless reader's fence ``jobstore.claim_of``;
``db check``'s varchar bound), and on the fixes of what they found.

PostgreSQL (and SQLite where named), the simulator and an injected clock (``World``).

Findings (each test below fails on f3cbe88, the first also on 9d81745; fixed since):
``test_a_turnless_reader_during_a_pollers_finalize_fails_nothing``: a reader without a turn of
its own (sweep, webhook, reaper) whose fence was loaded after a poller's turn or claim exhausted
the job while that poller stored the success it read — now such a reader counts and fails
nothing while a poller holds the row (``jobstore.unheld``), and the poller exhausts the job in
its own turn; ``test_a_platform_jobs_table_with_its_own_poll_resumes[... NOT NULL DEFAULT 0]``:
db check broke on a column the library never writes NULL to (now a note);
``test_db_check_on_a_text_column_says_what_postgresql_does[*-dom_wide, provider_status-varchar(n)[]]``:
a domain over a wide varchar broke though every write works (a domain is now checked as its
base type), and an array of varchar(n) was only a note though every write fails (an array now
breaks).
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from reconcile import lifecycle
from reconcile.lifecycle import batch as batch_poll
from reconcile.providers import PollResult, PollStatus
from reconcile.states import MAX_ATTEMPTS
from reconcile.sweep import reconcile_job
from reconcile.sweep.liveness import reap
from reconcile.testing.simulator import Script, Simulator
from tests.integration._sweep_helpers import FOREVER, World

KIND = "replicate-prediction"
THRESHOLD = timedelta(minutes=20)



def _money(w: World, job_id: uuid.UUID, where: str) -> None:
    """The task succeeded upstream and nobody asked the job to stop: completed once, no refund."""
    job = w.job(job_id)
    assert (job.status, job.error_code, w.refunds(job_id)) == ("completed", None, 0), (
        f"{where}: status={job.status} code={job.error_code} refunds={w.refunds(job_id)} "
        f"attempts={job.reconcile_attempts}")
    assert w.completions(job_id) == 1 and w.audit() == [], where


# ------------------------------------------------------------------ a. a turnless reader while a
# poller holding the current turn finalizes the success it read


def _turnless_read(w: World, reader: str, job_id: uuid.UUID) -> str:
    """A reader with no turn of its own, run now (its read is no verdict)."""
    if reader == "sweep":
        return reconcile_job(w.rt, job_id)
    if reader == "reap":  # the poller's worker is slow to beat: its heartbeat lapsed
        w.lapse(w.rt.worker_id or "")
        report = reap(w.rt)
        return ",".join(sorted(report.decided)) or report.line()
    from reconcile.webhook_ingest import _confirm

    event = SimpleNamespace(failed=False, signed_body=b"", status="processing", error=None)
    code, body = _confirm(w.rt, w.job(job_id), w.rt.kind(KIND), event)
    return f"{code} {body}"


@pytest.mark.parametrize("reader", ["sweep", "webhook", "reap"])
@pytest.mark.parametrize("mode", ["chain", "batch"])
def test_a_turnless_reader_during_a_pollers_finalize_fails_nothing(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, mode: str, reader: str) -> None:
    """The poller takes its turn (chain) or claim (batch) on the job's last attempt and reads
    "succeeded"; while it stores the outputs (``finalize_job_with_media``: media downloads,
    uploads — the slow part) a reader holding no turn of its own — the sweep, a webhook's
    confirming read, the heartbeat reaper — reads a stale "not found" / "processing". That
    reader's fence (``claim_of``: generation, seq, resumes) was loaded *after* the poller's turn,
    so nothing the poller does moves it: the reader exhausts the job (failed + refunded) and the
    poller's completion CAS then loses. The task had succeeded."""
    w = World(db, simulator, tmp_path, poll_mode=mode, poll_batch_threads=1,
              poll_batch_finalize_threads=1)
    w.rt.worker_id = "w-A"
    job_id = w.accept(KIND, Script(timeline=FOREVER))
    w.clock.now += THRESHOLD + timedelta(minutes=1)
    w.set(job_id, reconcile_attempts=MAX_ATTEMPTS - 1, reconcile_last_attempt_at=None)
    task = w.task_id(job_id)
    w.sim.set_state(task, "succeeded")
    client = w.rt.client(w.rt.kind(KIND))
    real_poll = client.poll
    stale: list[str] = []

    def poll(task_id: str, model: str | None = None) -> PollResult:
        if task_id == task and stale:  # the turnless reader's read: a stale answer
            return (PollResult(PollStatus.NOT_FOUND) if reader != "webhook"
                    else PollResult(PollStatus.RUNNING, raw_status="processing"))
        return real_poll(task_id, model=model)

    monkeypatch.setattr(client, "poll", poll)
    import reconcile.lifecycle.poll as poll_mod

    real_finalize = poll_mod.finalize_job_with_media
    seen: list[str] = []

    def finalize(rt: Any, jid: uuid.UUID, result: Any, **kw: Any) -> bool:
        if jid == job_id and kw.get("source") == "poll" and not seen:
            stale.append("on")
            seen.append(_turnless_read(w, reader, job_id))
            stale.clear()
        return real_finalize(rt, jid, result, **kw)

    monkeypatch.setattr(poll_mod, "finalize_job_with_media", finalize)
    w.lose_messages()
    if mode == "chain":
        before = w.job(job_id)
        w.set(job_id, poll_lease_expires_at=w.clock.now + timedelta(minutes=1))  # a live chain
        outcome = lifecycle.poll_step(w.rt, job_id, before.poll_generation, before.poll_seq)
    else:
        outcome = batch_poll.poll_due(w.rt, budget=60).line()
    assert len(seen) == 1, (outcome, seen)
    _money(w, job_id, f"{mode}/{reader}: poller={outcome} reader={seen[0]}")


@pytest.mark.parametrize("mode", ["chain", "batch"])
def test_a_webhook_after_the_last_attempt_leaves_a_held_job_to_its_poller(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """The sweep counted the job's last attempt a minute ago while a poller held the row (so it
    left the exhaustion to that poller, which is storing the success it read). A webhook then
    reads a stale "processing": its own count is refused by the attempt spacing, so its read is
    not beyond the last attempt, and it fails nothing while the poller holds the row."""
    from reconcile.webhook_ingest import _confirm

    w = World(db, simulator, tmp_path, poll_mode=mode, poll_batch_threads=1,
              poll_batch_finalize_threads=1)
    job_id = w.accept(KIND, Script(timeline=FOREVER))
    w.clock.now += THRESHOLD + timedelta(minutes=10)
    held = w.clock.now + timedelta(minutes=1)  # a live chain lease / a claimed batch row
    w.set(job_id, reconcile_attempts=MAX_ATTEMPTS,
          reconcile_last_attempt_at=w.clock.now - timedelta(minutes=1),
          poll_lease_expires_at=held, poll_due_at=held if mode == "batch" else None)
    task = w.task_id(job_id)
    w.sim.set_state(task, "succeeded")
    client = w.rt.client(w.rt.kind(KIND))
    monkeypatch.setattr(client, "poll", lambda task_id, model=None: PollResult(
        PollStatus.RUNNING, raw_status="processing"))
    event = SimpleNamespace(failed=False, signed_body=b"", status="processing", error=None)
    code, body = _confirm(w.rt, w.job(job_id), w.rt.kind(KIND), event)
    job = w.job(job_id)
    assert (job.status, w.refunds(job_id)) == ("processing", 0), (code, body, job.error_code)


# ------------------------------------------------------------------ a. a second writer at each
# statement of the sweep's _poll_once (inside its read; after observe, before exhaust's load;
# between that load and the failure's CAS)

SWEEP_WRITERS = {
    "chain": ["resume_turnless", "resume_turnful", "chain_turn", "cancel", "operator_fail",
              "reap"],
    "batch": ["resume_turnless", "resume_turnful", "batch_claim", "cancel", "operator_fail"],
}
POINTS = ["read", "before_exhaust", "in_exhaust"]


def _second_writer(w: World, writer: str, job_id: uuid.UUID, taken: list[Any]) -> None:
    from reconcile.lifecycle.cancel import cancel_job
    from reconcile.operator import Operator, run

    if writer.startswith("resume"):
        assert lifecycle.resume_chain(w.rt, job_id)
    elif writer == "chain_turn":  # the chain's live message runs: its read is real
        job = w.job(job_id)
        lifecycle.poll_step(w.rt, job_id, job.poll_generation, job.poll_seq)
    elif writer == "batch_claim":  # another poller claims it now, reads later
        w.rt.worker_id = "w-B"
        taken.extend(batch_poll.claim(w.rt))
        w.rt.worker_id = None
    elif writer == "cancel":
        cancel_job(w.rt, w.user, job_id)
    elif writer == "operator_fail":
        run(w.rt, "fail", job_id, operator=Operator("op", via="cli"), reason="stuck")
    elif writer == "reap":
        w.lapse("w-A")
        reap(w.rt)


@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("mode,writer", [(m, wr) for m, ws in SWEEP_WRITERS.items() for wr in ws])
@pytest.mark.parametrize("reader", ["sweep", "webhook"])
def test_a_writer_at_each_statement_of_a_turnless_read(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, reader: str, mode: str, writer: str, point: str) -> None:
    """The sweep's POLL (a transient "not found") or a webhook's confirming read (a stale
    "processing") on the job's last attempt, while the task has succeeded; a second writer
    lands at one statement after the reader's fence was loaded: inside the read, after observe
    before exhaust's load (sweep) / before exhaust (webhook), between that and the failure's
    CAS. Unless an operator or the user stopped the job, it ends completed once, never failed
    and refunded."""
    import reconcile.lifecycle.poll as poll_mod
    from reconcile.webhook_ingest import _confirm
    from tests.integration.test_attack_fenced import _drain

    w = World(db, simulator, tmp_path, poll_mode=mode, poll_batch_threads=1,
              poll_batch_finalize_threads=1)
    job_id = w.accept(KIND, Script(timeline=FOREVER))
    w.clock.now += THRESHOLD + timedelta(minutes=1)
    w.set(job_id, reconcile_attempts=MAX_ATTEMPTS - 1, reconcile_last_attempt_at=None)
    if writer == "resume_turnful":  # a generation that took turns
        w.set(job_id, poll_seq=3)
    # the webhook's exhaustion is reached only past a live chain (a live chain's poller
    # exhausts the job itself: the finalize test above), except when the reaper is to end it
    unreachable = reader == "webhook" and mode == "chain" and writer == "reap" \
        and point != "read"
    if mode == "chain" and (reader == "sweep" or writer == "reap"):
        # a live chain (the sweep's claim resumes nothing) held by w-A
        w.set(job_id, poll_lease_expires_at=w.clock.now + timedelta(minutes=1), claimed_by="w-A")
    taken: list[Any] = []
    fired: list[str] = []

    def fire() -> None:
        if not fired:
            fired.append(writer)
            _second_writer(w, writer, job_id, taken)

    stale = (PollResult(PollStatus.NOT_FOUND) if reader == "sweep"
             else PollResult(PollStatus.RUNNING, raw_status="processing"))
    w.miss_once(monkeypatch, job_id, fire if point == "read" else (lambda: None), stale)
    if point == "before_exhaust":
        real_exhaust = poll_mod.exhaust  # both readers exhaust inside observe

        def exhaust(rt: Any, job: Any, **kw: Any) -> str:
            fire()
            return real_exhaust(rt, job, **kw)

        monkeypatch.setattr(poll_mod, "exhaust", exhaust)
    elif point == "in_exhaust":
        real_fail = poll_mod.fail_job

        def fail_job(rt: Any, jid: Any, *a: Any, **kw: Any) -> bool:
            if kw.get("anomaly") == "reconcile_exhausted":
                fire()
            return real_fail(rt, jid, *a, **kw)

        monkeypatch.setattr(poll_mod, "fail_job", fail_job)
    if reader == "sweep":
        outcome = reconcile_job(w.rt, job_id)
    else:
        event = SimpleNamespace(failed=False, signed_body=b"", status="processing", error=None)
        outcome = str(_confirm(w.rt, w.job(job_id), w.rt.kind(KIND), event))
    where = f"{reader}/{mode}/{writer}/{point}: reader={outcome} fired={fired}"
    if writer != "chain_turn":
        w.lose_messages()
    _drain(w, mode, taken)
    job = w.job(job_id)
    assert w.refunds(job_id) <= 1 and w.completions(job_id) <= 1, where
    assert w.audit() == [], where
    if writer in ("cancel", "operator_fail"):
        assert job.status in ("cancelled", "failed"), where
        return
    assert bool(fired) != unreachable, where
    _money(w, job_id, where)


# ------------------------------------------------------------------ a. liveness under resumes


@pytest.mark.parametrize("mode", ["chain", "batch"])
def test_resumes_every_few_minutes_do_not_starve_exhaustion(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """A task the provider never finds; every poll message is lost (chain) / the batch poller
    never runs; a resume (a webhook's, a duplicate create message's) lands every 2 minutes —
    between the sweep's ticks (a resume landing inside every sweep read would starve it, by
    design: a resume is news of the task, and only a confirming read that said "succeeded"
    makes a webhook resume). The sweep ticks
    every minute. The job must be failed and refunded once, by its horizon (threshold +
    MAX_ATTEMPTS spacings) plus a few spacings."""
    from reconcile.jobstore import horizon

    w = World(db, simulator, tmp_path, poll_mode=mode)
    job_id = w.accept(KIND, Script(timeline=FOREVER))
    client = w.rt.client(w.rt.kind(KIND))
    monkeypatch.setattr(client, "poll",
                        lambda task_id, model=None: PollResult(PollStatus.NOT_FOUND))
    deadline = horizon.exhaustion_deadline(w.rt.settings, w.job(job_id))
    assert deadline is not None
    limit = deadline + 3 * w.rt.settings.scaled(timedelta(minutes=5))
    minute = 0
    while w.clock.now <= limit and w.job(job_id).status != "failed":
        w.clock.now += timedelta(minutes=1)
        minute += 1
        if minute % 2 == 0:
            lifecycle.resume_chain(w.rt, job_id)
        w.tick()
        w.lose_messages()
    job = w.job(job_id)
    assert job.status == "failed", (
        f"{mode}: still {job.status} at {w.clock.now - deadline} past its horizon, "
        f"attempts={job.reconcile_attempts} resumes={job.poll_resumes}")
    assert w.refunds(job_id) == 1 and w.audit() == []


# ------------------------------------------------------------------ b. the embedded SQLite default


@pytest.fixture
def sqlite_db(tmp_path: Path) -> Any:
    from reconcile.db.migrate import upgrade
    from reconcile.db.session import make_engine, make_sessionmaker

    url = f"sqlite:///{tmp_path}/reconcile.db"
    upgrade(url)
    engine = make_engine(url)
    yield make_sessionmaker(engine)
    engine.dispose()


@pytest.mark.parametrize("backend", ["postgresql", "sqlite"])
def test_the_resume_fence_on_null_and_counted_rows(
        request: pytest.FixtureRequest, simulator: Simulator, tmp_path: Path,
        backend: str) -> None:
    """``under_claim(g, s, resumes)`` on a row whose count is NULL (before 0030, or never
    resumed) and on one counted once: each matches only its own count, on both databases."""
    from sqlalchemy import update

    from reconcile import jobstore
    from reconcile.db.models import Job

    db = request.getfixturevalue("db" if backend == "postgresql" else "sqlite_db")
    w = World(db, simulator, tmp_path, poll_mode="chain")
    a = w.accept(KIND, Script(timeline=FOREVER))
    b = w.accept(KIND, Script(timeline=FOREVER))
    assert w.job(a).poll_resumes is None
    assert lifecycle.resume_chain(w.rt, b)  # turnless: generation and seq kept, count 1
    ja, jb = w.job(a), w.job(b)
    assert (jb.poll_seq, jb.poll_resumes) == (0, 1)
    assert jobstore.claim_of(ja)[2] is None and jobstore.claim_of(jb)[2] == 1

    def hits(job_id: uuid.UUID, claim: tuple[Any, ...]) -> int:
        with w.db.begin() as s:
            res = s.execute(update(Job).where(Job.id == job_id, *jobstore.under_claim(*claim))
                            .values(progress=Job.progress))
            return int(res.rowcount)

    assert hits(a, jobstore.claim_of(ja)) == 1
    assert hits(a, (ja.poll_generation, ja.poll_seq, 1)) == 0
    assert hits(a, (ja.poll_generation, ja.poll_seq, 0)) == 0  # NULL is not 0
    assert hits(b, jobstore.claim_of(jb)) == 1
    assert hits(b, (jb.poll_generation, jb.poll_seq, None)) == 0
    assert hits(b, (jb.poll_generation, jb.poll_seq)) == 1  # a poller's claim: any count
    assert lifecycle.resume_chain(w.rt, a)
    assert w.job(a).poll_resumes == 1 and hits(a, jobstore.claim_of(ja)) == 0


@pytest.mark.parametrize("mode,writer", [("batch", "sweep"), ("chain", "sweep"),
                                         ("chain", "reap")])
def test_sqlite_the_fenced_first_test(sqlite_db: Any, simulator: Simulator, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch, mode: str,
                                      writer: str) -> None:
    """test_attack_fenced's first test (the sweep's / reaper's read overtaken by a resume of a
    turnless generation) on the embedded SQLite default."""
    from tests.integration import test_attack_fenced as fenced

    fenced.test_a_sweep_read_overtaken_by_a_webhook_resume_fails_nothing(
        sqlite_db, simulator, tmp_path, monkeypatch, mode, writer)


@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("reader", ["sweep", "webhook"])
@pytest.mark.parametrize("mode", ["chain", "batch"])
def test_sqlite_a_resume_at_each_statement_of_a_turnless_read(
        sqlite_db: Any, simulator: Simulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        mode: str, reader: str, point: str) -> None:
    """The resume of a turnless generation at each statement of the sweep's / a webhook's
    read, on SQLite."""
    test_a_writer_at_each_statement_of_a_turnless_read(
        sqlite_db, simulator, tmp_path, monkeypatch, reader, mode, "resume_turnless", point)


# ------------------------------------------------------------------ c. migration 0030


def _columns(url: str, table: str = "jobs") -> dict[str, str]:
    import psycopg

    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://")) as conn:
        return dict(conn.execute(
            "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
            "WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped",
            (table,)).fetchall())


def _sweep_raced_by_a_resume(w: World, monkeypatch: pytest.MonkeyPatch,
                             job_id: uuid.UUID) -> Any:
    """The sweep's read of the job's last attempt says "not found" while a webhook's resume
    lands and the task succeeds: its exhaustion is fenced. Returns the row after, its queued
    messages lost."""
    w.set(job_id, reconcile_attempts=MAX_ATTEMPTS - 1, reconcile_last_attempt_at=None)
    w.miss_once(monkeypatch, job_id, lambda: lifecycle.resume_chain(w.rt, job_id))
    assert reconcile_job(w.rt, job_id) == "lost"  # its exhaustion fenced
    w.lose_messages()
    return w.job(job_id)


def test_0030_down_and_up_with_jobs_in_flight(pg_databases: Any, simulator: Simulator,
                                              tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Jobs in flight (one resumed: count 1); 0030 → 0029 drops the column the revision added,
    → head adds it back with every count NULL. Then the sweep's read overtaken by a turnless
    resume still fails nothing, and a task never found is still exhausted by the sweep."""
    from reconcile.db.migrate import downgrade, upgrade
    from reconcile.db.session import make_engine, make_sessionmaker

    url = pg_databases.create("rt30")
    upgrade(url)
    engine = make_engine(url)
    w = World(make_sessionmaker(engine), simulator, tmp_path, poll_mode="chain")
    raced = w.accept(KIND, Script(timeline=FOREVER))
    lost = w.accept(KIND, Script(timeline=FOREVER))
    assert lifecycle.resume_chain(w.rt, lost) and w.job(lost).poll_resumes == 1
    w.lose_messages()
    engine.dispose()
    downgrade(url, "0029")
    assert "poll_resumes" not in _columns(url)
    upgrade(url)
    assert _columns(url)["poll_resumes"] == "integer"
    assert (w.job(raced).poll_resumes, w.job(lost).poll_resumes) == (None, None)
    w.clock.now += THRESHOLD + timedelta(minutes=1)
    job = _sweep_raced_by_a_resume(w, monkeypatch, raced)
    assert job.poll_resumes == 2  # the sweep's own resume (its lease had expired), the webhook's
    lifecycle.poll_step(w.rt, raced, job.poll_generation, job.poll_seq)
    _money(w, raced, "after 0030 down/up")
    # the other: never found, its messages lost: the sweep exhausts it (fence on NULL)
    w.set(lost, reconcile_attempts=MAX_ATTEMPTS - 1, reconcile_last_attempt_at=None)
    client = w.rt.client(w.rt.kind(KIND))
    monkeypatch.setattr(client, "poll", lambda task_id, model=None: PollResult(PollStatus.NOT_FOUND))
    assert reconcile_job(w.rt, lost) == "failed"
    assert w.refunds(lost) == 1 and w.audit() == []
    engine.dispose()


@pytest.mark.parametrize("ddl,level", [
    ("text", "breaks"), ("bigint", None), ("smallint", "note"), ("numeric", "breaks"),
    ("integer NOT NULL DEFAULT 0", "note"), ("bigint NOT NULL DEFAULT 0", "note")])
def test_a_platform_jobs_table_with_its_own_poll_resumes(
        pg_databases: Any, simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, ddl: str, level: str | None) -> None:
    """The platform's ``jobs`` already has a ``poll_resumes`` column before the library's
    migrations: 0030 keeps it (and a downgrade never drops it). ``db check`` says what a write
    would do; where every write works, the resume and the sweep's fenced read work on it and
    the check breaks nothing. The library never writes NULL to ``poll_resumes`` (the submit
    leaves it out, ``start_new_chain`` writes ``COALESCE(poll_resumes, 0) + 1``), so a
    ``NOT NULL DEFAULT 0`` column works — yet ``db check`` BREAKS on it ("NOT NULL, where the
    library may write NULL") and every start-up refuses."""
    import psycopg

    from reconcile.db.contract import check
    from reconcile.db.migrate import downgrade, upgrade
    from reconcile.db.session import make_engine, make_sessionmaker
    from reconcile.testing.platform_schema import create_platform_tables

    url = pg_databases.create("rt30p")
    plain = url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(plain, autocommit=True) as conn:
        create_platform_tables(conn)
        conn.execute(f"ALTER TABLE jobs ADD COLUMN poll_resumes {ddl}")
    upgrade(url)
    before = _columns(url)["poll_resumes"]
    engine = make_engine(url)
    try:
        found = [f for f in check(engine) if f.where == "jobs.poll_resumes"]
        if level != "breaks":  # the library's writes, whatever the check said
            w = World(make_sessionmaker(engine), simulator, tmp_path, poll_mode="chain")
            job_id = w.accept(KIND, Script(timeline=FOREVER))
            w.clock.now += THRESHOLD + timedelta(minutes=1)
            job = _sweep_raced_by_a_resume(w, monkeypatch, job_id)
            lifecycle.poll_step(w.rt, job_id, job.poll_generation, job.poll_seq)
            _money(w, job_id, ddl)
        assert [f.level for f in found] == ([level] if level else []), [f.line() for f in found]
    finally:
        engine.dispose()
    downgrade(url, "0029")
    assert _columns(url).get("poll_resumes") == before  # the platform's: kept


# ------------------------------------------------------------------ d. the varchar bound against
# what PostgreSQL does with the library's values

_VALUES: dict[str, list[str]] = {
    "status": ["pending", "processing", "completed", "failed", "cancelled"],
    "submission_state": ["not_started", "submitting", "accepted", "rejected", "uncertain"],
    "provider_status": ["x", "é" * 64],
}


def _types(column: str, n: int) -> list[str]:
    # an array on status / submission_state: the library's partial indexes refuse the type
    arrays = [f"varchar({n})[]", f"varchar({n - 1})[]", "text[]"] \
        if column == "provider_status" else []
    return ["varchar", f"varchar({n})", f"varchar({n - 1})", f"varchar({n + 20})",
            f"char({n})", f"char({n - 1})", "dom_short", "dom_wide", *arrays]


_CASES = [(col, t) for col, vals in _VALUES.items() for t in _types(col, max(map(len, vals)))]


@pytest.fixture(scope="module")
def varchar_db(pg_databases: Any) -> Any:
    from reconcile.db.migrate import upgrade
    from reconcile.db.session import make_engine

    url = pg_databases.create("rt30v")
    upgrade(url)
    engine = make_engine(url)
    yield engine
    engine.dispose()


@pytest.mark.parametrize("column,pg_type", _CASES)
def test_db_check_on_a_text_column_says_what_postgresql_does(varchar_db: Any, column: str,
                                                             pg_type: str) -> None:
    """``db check`` BREAKS on the column's type exactly when a value the library writes there
    fails its write or does not read back as written (a ``char(n)`` pads it)."""
    from sqlalchemy import text as sql, update

    from reconcile.db.contract import BREAKS, check
    from reconcile.db.models import Job

    engine = varchar_db
    values = _VALUES[column]
    n = max(map(len, values))
    ddl = {"dom_short": f"varchar({n - 1})", "dom_wide": f"varchar({n})"}
    with engine.begin() as conn:
        conn.execute(sql("TRUNCATE jobs CASCADE"))
        conn.execute(sql("ALTER TABLE jobs ALTER COLUMN status DROP NOT NULL"))  # any order
        conn.execute(sql(f"ALTER TABLE jobs ALTER COLUMN {column} DROP NOT NULL"))
        conn.execute(sql(f"ALTER TABLE jobs ALTER COLUMN {column} TYPE text USING NULL"))
        for name, base in ddl.items():
            conn.execute(sql(f"DROP DOMAIN IF EXISTS {name}"))
            conn.execute(sql(f"CREATE DOMAIN {name} AS {base}"))
    try:
        with engine.begin() as conn:
            conn.execute(sql(f"ALTER TABLE jobs ALTER COLUMN {column} TYPE {pg_type} USING NULL"))
    except Exception as exc:  # noqa: BLE001 - an index or predicate on it refuses the type
        pytest.skip(f"{column} {pg_type}: {str(exc).splitlines()[0]}")
    try:
        job_id = uuid.uuid4()
        with engine.begin() as conn:
            conn.execute(sql("INSERT INTO jobs (id, user_id, job_type, created_at, status) "
                             "VALUES (:id, :u, 'image', now(), NULL)"),
                         {"id": job_id, "u": uuid.uuid4()})
        works, why = True, ""
        for value in values:
            try:
                with engine.begin() as conn:
                    conn.execute(update(Job).where(Job.id == job_id).values({column: value}))
                    back = conn.execute(select(getattr(Job, column)).where(Job.id == job_id)
                                        ).scalar_one()
                if back != value:
                    works, why = False, f"{value!r} read back as {back!r}"
                    break
            except Exception as exc:  # noqa: BLE001 - what PostgreSQL did is the point
                works, why = False, f"{value!r}: {str(exc).splitlines()[0]}"
                break
        found = [f for f in check(engine) if f.where == f"jobs.{column}"]
        breaks = any(f.level == BREAKS for f in found)
        assert breaks == (not works), (
            f"jobs.{column} {pg_type}: db check says {[f.line() for f in found] or 'nothing'}; "
            f"PostgreSQL: {'every write works' if works else why}")
    finally:
        with engine.begin() as conn:
            conn.execute(sql("TRUNCATE jobs CASCADE"))
            conn.execute(sql(f"ALTER TABLE jobs ALTER COLUMN {column} TYPE text USING NULL"))


# ------------------------------------------------------------------ e. mixed versions


@pytest.mark.parametrize("backend", ["postgresql", "sqlite"])
def test_a_database_at_0029_refuses_a_runtime_naming_poll_resumes(
        pg_databases: Any, tmp_path: Path, backend: str) -> None:
    """A database at 0029 (the old code's head): the new code's start-up refuses, naming
    ``jobs.poll_resumes`` (a worker without it would resume turnless generations the sweep's
    fence cannot see)."""
    from reconcile import Runtime, Settings
    from reconcile.db.contract import SchemaMismatch
    from reconcile.db.migrate import upgrade

    url = (pg_databases.create("rt29") if backend == "postgresql"
           else f"sqlite:///{tmp_path}/old.db")
    upgrade(url, "0029")
    with pytest.raises(SchemaMismatch) as raised:
        Runtime.from_settings(Settings(database_url=url))
    message = str(raised.value)
    assert "jobs.poll_resumes: missing (the library adds it)" in message, message
    assert "reconcile db check" in message


def test_the_old_codes_check_on_a_0030_database_only_warns(pg_databases: Any,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    """The other half of a rolling deploy: a process at the old code (head 0029, no
    ``poll_resumes`` in its mapping) on a database already at 0030. Its start-up check is the
    same function with head 0029: the version is only DIFFERS (a warning) and the extra nullable
    column is nothing, so the old worker starts — and its resumes (``start_new_chain`` without
    the count) move nothing the new sweep's fence reads. Documented here as what happens."""
    from reconcile.db import contract
    from reconcile.db.migrate import upgrade
    from reconcile.db.session import make_engine

    url = pg_databases.create("rt30o")
    upgrade(url)
    monkeypatch.setattr(contract, "head_revision", lambda: "0029")
    engine = make_engine(url)
    try:
        findings = contract.check(engine)
        assert [(f.where, f.level) for f in findings] == [
            ("reconcile_alembic_version", "differs")], [f.line() for f in findings]
    finally:
        engine.dispose()
