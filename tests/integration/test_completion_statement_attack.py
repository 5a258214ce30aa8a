"""Attack on the completion that is one statement (``reconcile.lifecycle.completion``) on
PostgreSQL with the built-in ledger.

Interleavings: two writers on one job, the first paused after each of its statements (it holds
whatever it locked so far), the second run until it completes or waits on a lock (seen in
``pg_stat_activity``), then the first goes on. The outcome must be one of the two serial orders
(every return, every ledger table, the job's money and completion columns, its assets, events
and anomalies), the audit clean, no deadlock. The writers: the completion (all held, or a price),
a failure or the user's cancel with its settlement (full refund, and a policy keeping half), a
second completion, a legacy refund's import, the ledger's refund called directly, and a
platform's stale write-back of the row in flight.

Then odd data the platform contract allows, and the published event.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event, text
from sqlalchemy.orm import Session, sessionmaker

from reconcile import Runtime, Settings, credits, lifecycle
from reconcile.credits import refund_txn_id
from reconcile.db.migrate import upgrade
from reconcile.db.models import Job
from reconcile.db.session import make_engine, make_sessionmaker
from reconcile.lifecycle import completion
from reconcile.lifecycle.finalize import finalize_job_with_media
from reconcile.providers import Output
from reconcile.states import Status
from reconcile.storage import LocalStorage
from tests.conftest import PgDatabases
from tests.integration.test_ledger_differential import dump, wipe

T0 = datetime(2026, 1, 1, tzinfo=UTC)
USER = uuid.UUID(int=1)
JOB = uuid.UUID(int=11)
PNG = (Output(data=b"png-0", media_type="image/png"),)


class Pauser:
    """After the ``at``-th statement run by the thread named ``A``, waits for ``go``."""

    def __init__(self, engine: Engine) -> None:
        self.at = 0
        self.count = 0
        self.paused = threading.Event()
        self.go = threading.Event()
        self.b_pid: list[int] = []
        event.listen(engine, "after_cursor_execute", self._after)
        event.listen(engine, "before_cursor_execute", self._before)

    def _before(self, conn: Any, *args: Any) -> None:
        if threading.current_thread().name == "B":  # the backend B runs its statement on
            self.b_pid.append(conn.connection.dbapi_connection.info.backend_pid)

    def _after(self, *args: Any) -> None:
        if threading.current_thread().name != "A":
            return
        self.count += 1
        if self.at and self.count == self.at:
            self.paused.set()
            assert self.go.wait(60)


@pytest.fixture(scope="module")
def pg(pg_databases: PgDatabases) -> Iterator[tuple[sessionmaker[Session], Engine, Pauser]]:
    url = pg_databases.create("xcattack")
    upgrade(url)
    engine = make_engine(url)
    yield make_sessionmaker(engine), engine, Pauser(engine)
    engine.dispose()


def _setup(factory: sessionmaker[Session], written_back: Path | None = None) -> None:
    """The job in flight with 10 held; ``written_back``: completed first (its media there),
    then its row written back in flight by a platform's stale save."""
    wipe(factory)
    with factory.begin() as s:
        s.add(Job(id=JOB, user_id=USER, job_type="image", status="processing",
                  submission_state="accepted", provider_task_id="task-1"))
    with factory.begin() as s:
        credits.grant(s, USER, "sub", 6, "g-sub", now=T0)
        credits.grant(s, USER, "topup", 6, "g-topup", now=T0)
        credits.grant(s, USER, "sub", 3, "g-sub2", now=T0)
        credits.reserve(s, USER, JOB, 10, now=T0)  # sub 6 + sub2 3 + topup 1
    if written_back is not None:
        rt = _rt(factory, written_back, "1", 6)
        assert finalize_job_with_media(rt, JOB, None, source="first", outputs=PNG)
        with factory.begin() as s:
            _stale_write_back(s)


def _rt(factory: sessionmaker[Session], media: Path, share: str, price: int | None) -> Runtime:
    rt = Runtime(settings=Settings(database_url="postgresql+psycopg://unused/x",
                                   failure_refund=share, cancel_refund=share),
                 sessions=factory, storage=LocalStorage(media), clock=lambda: T0)
    if price is not None:
        rt.pricing_hook = lambda job, result: price
    return rt


def _in_txn(fn: Callable[[Session], Any]) -> Callable[[Runtime], Any]:
    return lambda rt: _with(rt.sessions, fn)


def _with(sessions: sessionmaker[Session], fn: Callable[[Session], Any]) -> Any:
    with sessions.begin() as s:
        return fn(s)


def _stale_write_back(s: Session) -> Any:
    """A platform's ORM save of the row it read in flight, after its own work."""
    return s.execute(text("UPDATE jobs SET status = 'processing' WHERE id = :j"),
                     {"j": JOB}).rowcount


# name -> (price given to the pricing hook, what the writer does)
OPS: dict[str, tuple[int | None, Callable[[Runtime], Any]]] = {
    "complete_all": (None, lambda rt: finalize_job_with_media(rt, JOB, None, source="a",
                                                              outputs=PNG)),
    "complete_3": (3, lambda rt: finalize_job_with_media(rt, JOB, None, source="b",
                                                         outputs=PNG)),
    "fail": (None, lambda rt: lifecycle.fail_job(rt, JOB, "UPSTREAM_FAILED", "boom", None)),
    "cancel": (None, lambda rt: lifecycle.fail_job(rt, JOB, "CANCELLED", "user", None,
                                                   status=Status.CANCELLED)),
    "legacy_4": (None, _in_txn(lambda s: credits.import_legacy_refund(s, JOB, 4, "legacy-a",
                                                                      now=T0))),
    "refund": (None, _in_txn(lambda s: credits.refund(s, JOB, now=T0))),
    "write_back": (None, _in_txn(_stale_write_back)),
}

PLATFORMS_DOING = {"completed_after_refund", "completed_job_in_flight"}
RECOMPLETED = {"complete_all", "complete_3", "cancel", "fail"}
PAIRS = [
    ("complete_all", "cancel"), ("cancel", "complete_all"),
    ("complete_3", "fail"), ("fail", "complete_3"),
    ("complete_all", "complete_3"), ("complete_3", "complete_all"),
    ("complete_all", "legacy_4"), ("legacy_4", "complete_3"),
    ("complete_3", "refund"), ("refund", "complete_all"),
    ("complete_all", "write_back"), ("write_back", "complete_3"),
]


def _run(op: str, rt: Runtime) -> Any:
    try:
        return ("ok", OPS[op][1](rt))
    except Exception as exc:  # noqa: BLE001 - the outcome is compared
        return ("raise", type(exc).__name__)


def _state(factory: sessionmaker[Session]) -> dict[str, Any]:
    out: dict[str, Any] = dump(factory)
    queries = {
        "job": "SELECT status, credits_actual, display_cost, progress, output_data, "
               "completed_at, next_poll_at FROM jobs",
        "assets": 'SELECT "index", storage_key, media_type, created_at FROM reconcile_assets '
                  'ORDER BY "index"',
        "events": "SELECT type, payload, created_at FROM reconcile_job_events ORDER BY id",
    }
    with factory() as s:
        out.update({k: [tuple(r) for r in s.execute(text(q))] for k, q in queries.items()})
        out["audit"] = sorted(d.kind for d in credits.audit(s, now=T0))
    return out


def _money_rules(state: dict[str, Any]) -> None:
    """What holds whichever order: a completed job has its one asset and one completed event
    carrying its ``credits_actual``, which is what its commit took (nothing committed when a
    refund came first); a failed or cancelled one has neither. (A row written back in flight
    says nothing: its completion is repaired by the next one.)"""
    [(status, actual, *_)] = state["job"]
    completed_events = [e for e in state["events"] if e[0] == "completed"]
    commits = [t for t in state["txns"] if t[3] == "COMMIT"]
    if status == "completed":
        assert len(completed_events) == 1 and len(state["assets"]) == 1, state
        assert completed_events[0][1]["credits_actual"] == actual, state
        if refund_txn_id(JOB) in [t[0] for t in state["txns"]]:
            assert not commits, state
        else:
            assert sum(t[4] for t in commits) == actual, state
    elif status in ("failed", "cancelled"):
        assert not completed_events and not state["assets"], state


def _serial(factory: sessionmaker[Session], tmp: Path, share: str, first: str,
            second: str, back: Path | None) -> tuple[Any, Any, Any]:
    _setup(factory, back)
    a = _run(first, _rt(factory, tmp / "s1", share, OPS[first][0]))
    b = _run(second, _rt(factory, tmp / "s2", share, OPS[second][0]))
    return a, b, _state(factory)


def _b_waits_or_done(engine: Engine, pid: list[int], done: threading.Event) -> bool:
    with engine.connect() as probe:
        while not done.is_set():
            if pid:
                waiting = probe.execute(text(
                    "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = :p"),
                    {"p": pid[-1]}).scalar()
                if waiting:
                    return True
            probe.rollback()
            done.wait(0.005)  # polling an observable condition, not a synchronisation sleep
    return False


def _cases() -> list[tuple[str, str, str, str]]:
    """Each pair with everything refunded; the pairs with a failure or a cancel also under a
    policy keeping half; the completions and the cancel also on a completed row written back."""
    out = []
    for first, second in PAIRS:
        out.append((first, second, "1", "in_flight"))
        if {"fail", "cancel"} & {first, second}:
            out.append((first, second, "1/2", "in_flight"))
        if {first, second} <= RECOMPLETED:
            out.append((first, second, "1", "written_back"))
    return out


@pytest.mark.parametrize(("first", "second", "share", "start"), _cases(),
                         ids=[f"{a}-then-{b}-share{c.replace('/', '_')}-{d}"
                              for a, b, c, d in _cases()])
def test_the_completion_interleaved_with_another_writer_is_a_serial_order(
        pg: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, first: str, second: str,
        share: str, start: str) -> None:
    factory, engine, pauser = pg
    statements: list[uuid.UUID] = []  # the one statement is what the completions run
    real = completion.complete
    monkeypatch.setattr(completion, "complete", lambda session, job_id, **kw: (
        statements.append(job_id), real(session, job_id, **kw))[1])
    back = tmp_path / "first" if start == "written_back" else None
    ab = _serial(factory, tmp_path / "ab", share, first, second, back)
    ba = (lambda b, a, st: (a, b, st))(*_serial(factory, tmp_path / "ba", share, second, first,
                                                back))
    for _, _, state in (ab, ba):
        if back is None:  # a re-completion adds its own event; a cancel of it is the platform's
            _money_rules(state)
        # the audit is clean, but for what the platform's own writes did (its refund of a job
        # that then completed, its write-back of a completed row)
        # (and a cancel of a completed row written back: a committed job now cancelled)
        allowed = PLATFORMS_DOING | ({"failed_job_committed"} if back else set())
        assert set(state["audit"]) <= allowed, state["audit"]
    assert statements, "the serial orders never ran the one statement"
    _setup(factory, back)
    pauser.at, pauser.count = 0, 0
    counted: dict[str, Any] = {}
    ta = threading.Thread(target=lambda: counted.update(
        a=_run(first, _rt(factory, tmp_path / "count", share, OPS[first][0]))), name="A")
    ta.start()
    ta.join()
    total = pauser.count
    assert total > 0
    waited = []
    for k in range(1, total + 1):
        _setup(factory, back)
        pauser.at, pauser.count = k, 0
        pauser.paused.clear()
        pauser.go.clear()
        out: dict[str, Any] = {}
        rt_a = _rt(factory, tmp_path / f"a{k}", share, OPS[first][0])
        rt_b = _rt(factory, tmp_path / f"b{k}", share, OPS[second][0])
        pauser.b_pid.clear()
        b_done = threading.Event()

        def run_b(out: dict[str, Any] = out, b_done: threading.Event = b_done,
                  rt_b: Runtime = rt_b) -> None:
            try:
                out["b"] = _run(second, rt_b)
            finally:
                b_done.set()

        ta = threading.Thread(target=lambda out=out, rt_a=rt_a: out.update(a=_run(first, rt_a)),
                              name="A")
        ta.start()
        if not pauser.paused.wait(30):  # A took a shorter path
            ta.join()
            continue
        tb = threading.Thread(target=run_b, name="B")
        tb.start()
        waited.append(_b_waits_or_done(engine, pauser.b_pid, b_done))
        pauser.go.set()
        ta.join(60)
        tb.join(60)
        assert not ta.is_alive() and not tb.is_alive()
        got = (out.get("a"), out.get("b"), _state(factory))
        assert got in (ab, ba), (first, second, k, got[:2], ab[:2], ba[:2],
                                 {n: got[2][n] for n in ("job", "txns", "usage_logs")},
                                 {n: ab[2][n] for n in ("job", "txns", "usage_logs")},
                                 {n: ba[2][n] for n in ("job", "txns", "usage_logs")})
        assert all(sub >= 0 and topup >= 0 for _, sub, topup, _ in got[2]["balances"])
    assert any(waited), (first, second)  # B really ran into a lock A held


# ----------------------------------------------------------------------------- odd data


class Credits(int):  # a platform's int subclass for a price
    __slots__ = ()


def _bare(factory: sessionmaker[Session], prepare: Callable[[Session], Any]) -> None:
    wipe(factory)
    with factory.begin() as s:
        s.add(Job(id=JOB, user_id=USER, job_type="image", status="processing",
                  submission_state="accepted", provider_task_id="task-1"))
    with factory.begin() as s:
        prepare(s)


def _funded(s: Session) -> None:
    credits.grant(s, USER, "sub", 6, "g-sub", now=T0)
    credits.grant(s, USER, "topup", 6, "g-topup", now=T0)
    credits.reserve(s, USER, JOB, 10, now=T0)


def _sql(*statements: str) -> Callable[[Session], Any]:
    return lambda s: [s.execute(text(q), {"j": JOB, "u": USER, "t": T0}) for q in statements]


def _then(*steps: Callable[[Session], Any]) -> Callable[[Session], Any]:
    return lambda s: [step(s) for step in steps]


PLATFORM_LOG = ("INSERT INTO usage_logs (id, job_id, user_id, status, credits, metadata, "
                "created_at) VALUES (gen_random_uuid(), :j, :u, 'reserved', 10, "
                "'{\"from_sub\": 10, \"from_topup\": 0}', :t)")
ODD: dict[str, tuple[Callable[[Session], Any], Any]] = {
    "all_held": (_funded, None),
    "zero": (_funded, 0),
    "exactly_held": (_funded, 10),
    "above_held": (_funded, 11),
    "negative": (_funded, -1),
    "bool": (_funded, True),
    "int_subclass": (_funded, Credits(4)),
    "float": (_funded, 3.0),
    "just_below_pg_max": (_funded, 2**62 - 1),
    "pg_max": (_funded, 2**62),
    "beyond_bigint": (_funded, 2**63),
    "metadata_a_string": (_then(_funded, _sql("UPDATE usage_logs SET metadata = '\"junk\"'")), 3),
    "metadata_a_list": (_then(_funded, _sql("UPDATE usage_logs SET metadata = '[1, 2]'")), None),
    "metadata_json_null": (_then(_funded, _sql("UPDATE usage_logs SET metadata = 'null'")), 3),
    "metadata_sql_null": (_then(_funded, _sql("UPDATE usage_logs SET metadata = NULL")), None),
    "platform_reservation_no_balance": (_sql(PLATFORM_LOG), 4),
    "platform_reservation_all_held": (_sql(PLATFORM_LOG), None),
    "platform_reservation_beside_the_ledgers": (_then(_funded, _sql(PLATFORM_LOG)), 4),
    "no_reservation": (lambda s: None, None),
    "no_reservation_priced": (lambda s: None, 5),
    "pending_job": (_then(_funded, _sql("UPDATE jobs SET status = 'pending'")), 2),
    "stale_cost_in_flight": (_then(_funded, _sql("UPDATE jobs SET credits_actual = 99, "
                                                 "display_cost = 99")), None),
    "job_of_another_user": (_then(_funded, _sql("UPDATE jobs SET user_id = gen_random_uuid()")),
                            None),
    "already_committed": (_then(_funded, lambda s: credits.commit(s, JOB, 7, now=T0)), None),
    "legacy_refund_first": (_then(_funded, lambda s: credits.import_legacy_refund(
        s, JOB, 4, "legacy-a", now=T0)), None),
    "legacy_refund_then_price": (_then(_funded, lambda s: credits.import_legacy_refund(
        s, JOB, 4, "legacy-a", now=T0)), 7),
}


def _complete_once(factory: sessionmaker[Session], tmp: Path, monkeypatch: pytest.MonkeyPatch,
                   one_statement: bool, price: Any) -> tuple[Any, int]:
    rt = _rt(factory, tmp, "1", None)
    rt.pricing_hook = lambda job, result: price
    calls: list[uuid.UUID] = []
    real = completion.complete
    with monkeypatch.context() as m:
        if not one_statement:
            m.setattr(completion, "usable", lambda *a, **k: False)

        def counted(session: Session, job_id: uuid.UUID, **kw: Any) -> Any:
            calls.append(job_id)
            return real(session, job_id, **kw)

        m.setattr(completion, "complete", counted)
        try:
            got: Any = ("ok", finalize_job_with_media(rt, JOB, None, source="odd", outputs=PNG))
        except Exception as exc:  # noqa: BLE001 - the outcome is compared
            got = ("raise", type(exc).__name__, getattr(exc, "reason", None))
    return got, len(calls)


@pytest.mark.parametrize("case", list(ODD))
def test_odd_data_completes_as_the_two_statement_path_does(
        pg: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    factory = pg[0]
    prepare, price = ODD[case]
    results = []
    for one in (True, False):
        _bare(factory, prepare)
        got, calls = _complete_once(factory, tmp_path / str(one), monkeypatch, one, price)
        results.append((got, _state(factory)))
        if not one:
            assert calls == 0
        elif isinstance(price, (bool, float)) or (isinstance(price, int) and price >= 2**62):
            assert calls == 0, case  # the old path takes what the function cannot
    assert results[0][0] == results[1][0], (case, results[0][0], results[1][0])
    for name in results[0][1]:
        assert results[0][1][name] == results[1][1][name], (case, name)


# ----------------------------------------------------------------------------- the event


@pytest.mark.parametrize(("case", "one_statement_wins"), [
    ("all_held", True), ("zero", True), ("int_subclass", True), ("legacy_refund_first", True),
    ("platform_reservation_no_balance", False), ("no_reservation_priced", False),
    ("already_committed", False)])
def test_the_published_event_is_the_stored_one(pg: Any, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch, case: str,
                                               one_statement_wins: bool) -> None:
    """With a publisher: the message names the event row written (which is then marked
    published), carries the job's ``credits_actual`` as stored, and the assets are exactly the
    stored outputs. Both when the one statement settles and when its CAS won but the commit
    wrote nothing (the two-statement steps finish it)."""
    factory = pg[0]
    prepare, price = ODD[case]
    _bare(factory, prepare)
    rt = _rt(factory, tmp_path, "1", None)
    rt.pricing_hook = lambda job, result: price
    messages: list[dict[str, Any]] = []
    rt.event_hooks.append(messages.append)
    settled: list[bool] = []
    real = completion.complete

    def watched(session: Session, job_id: uuid.UUID, **kw: Any) -> Any:
        got = real(session, job_id, **kw)
        settled.append(got is not None and got.settlement is not None and bool(got.settlement))
        return got

    monkeypatch.setattr(completion, "complete", watched)
    outputs = (Output(data=b"a", media_type="image/png"), Output(text="hello"))
    assert finalize_job_with_media(rt, JOB, None, source="evt", outputs=outputs) is True
    assert settled == [one_statement_wins]
    with factory() as s:
        job = s.get(Job, JOB)
        assert job is not None and job.status == "completed"
        events = s.execute(text("SELECT event_id, type, payload, published_at FROM "
                                "reconcile_job_events")).all()
        assets = s.execute(text('SELECT "index", storage_key, media_type, user_id FROM '
                                'reconcile_assets ORDER BY "index"')).all()
    [(event_id, kind, payload, published_at)] = events
    [message] = messages
    assert (message["event_id"], message["type"]) == (event_id, kind) == (event_id, "completed")
    assert published_at is not None  # the row the publisher took is the row marked
    assert message["payload"] == payload
    assert payload["credits_actual"] == job.credits_actual == job.display_cost
    assert payload["outputs"] == 2 and payload["via"] == "evt"
    assert [(i, m) for i, _, m, _ in assets] == [(0, "image/png"), (1, "text/plain")]
    assert all(u == job.user_id for *_, u in assets)
    assert [a[1] for a in assets] == [o["key"] for o in job.output_data["outputs"]]
    assert sorted(rt.storage.keys("")) == sorted(key for _, key, _, _ in assets)


# ----------------------------------------------------------------------------- time zones


@pytest.fixture(scope="module", params=["naive-columns-library-engine",
                                        "tz-columns-platform-engine-in-session-zone"])
def kolkata(request: pytest.FixtureRequest,
            pg_databases: PgDatabases) -> Iterator[sessionmaker[Session]]:
    """A platform-shaped database whose sessions start in Asia/Kolkata (+05:30): naive
    ``timestamp`` columns behind the library's engine (which puts its sessions in UTC), or
    ``timestamptz`` columns behind a platform's own engine that stays in the zone."""
    import psycopg
    from sqlalchemy import create_engine

    from reconcile.testing.platform_schema import create_platform_tables, set_database_timezone
    from tests.conftest import PG_ADMIN_URL

    naive = request.param.startswith("naive")
    url = pg_databases.create("xctz")
    plain = url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(plain, autocommit=True) as conn:
        create_platform_tables(conn, naive=naive)
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
        set_database_timezone(admin, url.rsplit("/", 1)[1], "Asia/Kolkata")
    upgrade(url)
    engine = make_engine(url) if naive else create_engine(
        url, connect_args={"options": "-c TimeZone=Asia/Kolkata"})
    with engine.connect() as conn:
        zone = conn.execute(text("SHOW TimeZone")).scalar_one()
    assert zone == ("UTC" if naive else "Asia/Kolkata")
    yield make_sessionmaker(engine)
    engine.dispose()


@pytest.mark.parametrize("case", ["all_held", "zero", "platform_reservation_no_balance"])
def test_a_zone_that_is_not_utc_writes_the_same_instants_on_both_paths(
        kolkata: sessionmaker[Session], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        case: str) -> None:
    prepare, price = ODD[case]
    written = []
    for one in (True, False):
        _bare(kolkata, prepare)
        got, _ = _complete_once(kolkata, tmp_path / str(one), monkeypatch, one, price)
        assert got == ("ok", True)
        with kolkata() as s:  # as text: what the columns hold, read in UTC
            s.execute(text("SET LOCAL TimeZone = 'UTC'"))
            written.append([tuple(r) for r in s.execute(text(
                "SELECT 'job', completed_at::text FROM jobs UNION ALL "
                "SELECT 'asset', created_at::text FROM reconcile_assets UNION ALL "
                "SELECT 'event', created_at::text FROM reconcile_job_events UNION ALL "
                "SELECT 'txn ' || type, created_at::text FROM reconcile_credit_transactions "
                "UNION ALL SELECT 'lot ' || kind, created_at::text FROM reconcile_credit_lots "
                "UNION ALL SELECT 'balance', updated_at::text FROM reconcile_credit_balances "
                "ORDER BY 1, 2"))])
    assert written[0] == written[1]
    assert all(at.startswith("2026-01-01 00:00:00") for _, at in written[0]), written[0]


# ----------------------------------------------------------------------------- replaced commits


def _replaced_on_the_instance() -> Any:
    from reconcile.ledger import BuiltinLedger

    ledger = BuiltinLedger()
    real = ledger.commit_settled
    ledger.calls = []  # type: ignore[attr-defined]

    def metered(session: Session, job_id: uuid.UUID, *a: Any, **kw: Any) -> Any:
        ledger.calls.append(job_id)  # type: ignore[attr-defined]
        return real(session, job_id, *a, **kw)

    ledger.commit_settled = metered  # type: ignore[method-assign]
    return ledger


def _a_wrapping_mock() -> Any:
    from unittest import mock

    from reconcile.ledger import DEFAULT, BuiltinLedger

    ledger = mock.MagicMock(spec=BuiltinLedger, wraps=DEFAULT)
    ledger.name, ledger.records_settlement = DEFAULT.name, DEFAULT.records_settlement
    return ledger


@pytest.mark.parametrize("make", [_replaced_on_the_instance, _a_wrapping_mock],
                         ids=["commit_settled-set-on-the-instance", "mock-spec-wrapping"])
def test_a_ledger_whose_commit_is_replaced_otherwise_than_by_subclassing_is_called(
        pg: Any, tmp_path: Path, make: Callable[[], Any]) -> None:
    """The one statement runs the built-in commit in SQL, so it may only stand in for a ledger
    whose commit *is* the built-in one. A ``commit_settled`` replaced on the instance (a
    platform's metering wrapper) is a replacement as much as a subclass's: it must be called,
    as it was before. A ``MagicMock(spec=BuiltinLedger, wraps=…)`` passes ``isinstance`` but
    has no class attributes: its completion must not crash (it did: AttributeError from the
    check, after the media was stored, the job left in flight)."""
    factory = pg[0]
    _bare(factory, _funded)
    rt = _rt(factory, tmp_path, "1", 4)
    rt.ledger = make()
    assert finalize_job_with_media(rt, JOB, None, source="wrapped", outputs=PNG) is True
    calls = rt.ledger.calls if hasattr(rt.ledger, "calls") and isinstance(rt.ledger.calls, list) \
        else [c.args[1] for c in rt.ledger.commit_settled.call_args_list]
    assert calls == [JOB]
    state = _state(factory)
    assert state["job"][0][:3] == ("completed", 4, 4)
    assert [t[3] for t in state["txns"] if t[2] == JOB] == ["COMMIT", "RELEASE", "USAGE"]


@pytest.mark.parametrize("case", ["all_held", "legacy_refund_first",
                                  "platform_reservation_no_balance", "stale_cost_in_flight"])
def test_the_completion_hook_and_the_provider_cost_as_on_the_two_statement_path(
        pg: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    """The hook sees the completed row at the cost decided; the provider's cost and text kept."""
    from decimal import Decimal

    from reconcile.providers.base import PollResult, PollStatus
    factory = pg[0]
    prepare, price = ODD[case]
    result = PollResult(status=PollStatus.SUCCEEDED, cost_usd=Decimal("0.123456"),
                        outputs=(Output(text="caption"), *PNG))
    seen = []
    for one in (True, False):
        _bare(factory, prepare)
        rt = _rt(factory, tmp_path / str(one), "1", None)
        rt.pricing_hook = lambda job, result: price
        rt.completion_hooks[""] = lambda session, job, got, one=one: seen.append(
            (one, job.status, job.credits_actual, job.display_cost, got is result))
        with monkeypatch.context() as m:
            if not one:
                m.setattr(completion, "usable", lambda *a, **k: False)
            assert finalize_job_with_media(rt, JOB, result, source="hook") is True
        with factory() as s:
            seen.append((one, *s.execute(text(
                "SELECT provider_cost, output_data->>'text', credits_actual FROM jobs")).one()))
    assert [x[1:] for x in seen[:2]] == [x[1:] for x in seen[2:]], seen
    assert seen[0][1] == "completed" and seen[1][1:3] == (Decimal("0.123456"), "caption")
    assert seen[0][2] == seen[1][3]  # the hook saw the cost that was stored
