"""The ledger's operator side (each on PostgreSQL and on the embedded SQLite default):
a reservation whose job row was deleted (finding 10), `credits import` on a platform that
granted its balances itself (finding 14) or still reserved after cut-over, and a grant id that
collides with another transaction's lot id."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import delete, select, text
from sqlalchemy.orm import Session, sessionmaker

from reconcile import credits
from reconcile.cli import main
from reconcile.credits import _pg_functions
from reconcile.db.models import (
    CreditAnomaly,
    CreditBalance,
    CreditTransaction,
    Job,
    UsageLog,
)
from reconcile.errors import LedgerError

NOW = datetime.now(UTC)
OLD = NOW - timedelta(hours=2)


@pytest.fixture
def factory(pg_and_sqlite: sessionmaker[Session]) -> Iterator[sessionmaker[Session]]:
    yield pg_and_sqlite  # PostgreSQL, then SQLite (tests/integration/conftest.py)
    # the varchar-keyed balance table below is this file's own shape: the PostgreSQL database
    # is shared by the worker's later files, whose platform ledger creates a uuid-keyed one
    with pg_and_sqlite.begin() as s:
        s.execute(text("DROP TABLE IF EXISTS user_credits"))


def _cli(factory: sessionmaker[Session], *args: str) -> Result:
    url = factory.kw["bind"].url.render_as_string(hide_password=False)
    return CliRunner().invoke(main, ["--database-url", url, *args])


def _balance(factory: sessionmaker[Session], user: uuid.UUID) -> int:
    with factory() as s:
        row = s.get(CreditBalance, user)
        return 0 if row is None else row.sub + row.topup


def _reserved_job(factory: sessionmaker[Session], amount: int = 40,
                  at: datetime = OLD) -> tuple[uuid.UUID, uuid.UUID]:
    user, job = uuid.uuid4(), uuid.uuid4()
    with factory.begin() as s:
        credits.grant(s, user, "sub", 100, f"g-{user}", now=at)
        s.add(Job(id=job, user_id=user, job_type="image", status="processing", created_at=at))
        s.flush()
        credits.reserve(s, user, job, amount, now=at)
    return user, job


def _kinds(factory: sessionmaker[Session]) -> list[tuple[str, uuid.UUID | None]]:
    with factory() as s:
        return [(d.kind, d.job_id) for d in credits.audit(s, now=NOW)]


# ----------------------------------------------------------------------------- finding 10


def test_a_reservation_whose_job_row_was_deleted_is_reported_and_released_once(
        factory: sessionmaker[Session]) -> None:
    """The platform deleted an in-flight job's row: the audit reports the orphaned reservation
    (it was clean before: the credits were held forever, unreported); `credits release-orphan`
    refunds it with the reason recorded, once; the audit is clean again."""
    user, job = _reserved_job(factory)
    assert _kinds(factory) == []
    with factory.begin() as s:
        s.execute(delete(Job).where(Job.id == job))
    assert _kinds(factory) == [("orphaned_reservation", job)]
    assert _cli(factory, "audit").exit_code == 1

    refused = _cli(factory, "credits", "release-orphan", str(job))
    assert refused.exit_code == 2 and "--reason" in refused.output  # the reason is required
    done = _cli(factory, "credits", "release-orphan", str(job), "--reason", "user deleted it")
    assert done.exit_code == 0, done.output
    assert "refunded 40 credits" in done.output
    assert _balance(factory, user) == 100
    again = _cli(factory, "credits", "release-orphan", str(job), "--reason", "user deleted it")
    assert again.exit_code == 0 and "nothing done" in again.output
    assert _balance(factory, user) == 100
    with factory() as s:
        refunds = s.execute(select(CreditTransaction.id).where(
            CreditTransaction.job_id == job, CreditTransaction.type == "REFUND")).scalars().all()
        notes = s.execute(select(CreditAnomaly.kind, CreditAnomaly.detail)
                          .where(CreditAnomaly.job_id == job)).all()
    assert refunds == [f"job-refund:{job}"]
    assert [(k, d["reason"]) for k, d in notes] == [("orphan_released", "user deleted it")]
    assert _kinds(factory) == []
    assert _cli(factory, "audit").exit_code == 0


def test_release_orphan_refuses_a_job_whose_row_exists(factory: sessionmaker[Session]) -> None:
    """A job row that exists is settled through its lifecycle, never as an orphan: refused,
    nothing written; a deleted job that was settled before holds nothing (safe to delete)."""
    user, job = _reserved_job(factory)
    refused = _cli(factory, "credits", "release-orphan", str(job), "--reason", "x")
    assert refused.exit_code == 2 and "exists" in refused.output
    assert _balance(factory, user) == 60
    with factory.begin() as s, pytest.raises(LedgerError) as err:
        credits.release_orphan(s, job, "x")
    assert err.value.reason == "orphan_job_exists"

    _, settled = _reserved_job(factory)
    with factory.begin() as s:
        credits.commit(s, settled)
        s.execute(update_status(settled, "completed"))
    with factory.begin() as s:
        s.execute(delete(Job).where(Job.id == settled))
    assert _kinds(factory) == []  # a settled job's row may go
    with factory.begin() as s:
        assert credits.release_orphan(s, settled, "cleanup") is False


def update_status(job: uuid.UUID, status: str) -> object:
    from sqlalchemy import update

    return update(Job).where(Job.id == job).values(status=status, completed_at=NOW)


def test_an_orphan_within_the_grace_is_not_reported(factory: sessionmaker[Session]) -> None:
    """A reservation just made may precede its job row's commit on a platform that writes them
    in two transactions: only past the grace is it an orphan."""
    _, job = _reserved_job(factory, at=NOW - timedelta(minutes=1))
    with factory.begin() as s:
        s.execute(delete(Job).where(Job.id == job))
    assert _kinds(factory) == []


# ----------------------------------------------------------------------------- finding 14


def _platform_balances(factory: sessionmaker[Session], rows: list[tuple[uuid.UUID, int, int]]
                       ) -> None:
    with factory.begin() as s:
        s.execute(text("DROP TABLE IF EXISTS user_credits"))
        s.execute(text("CREATE TABLE user_credits (user_id VARCHAR(36) PRIMARY KEY, "
                       "sub BIGINT, topup BIGINT)"))
        for user, sub, topup in rows:
            s.execute(text("INSERT INTO user_credits VALUES (:u, :s, :t)"),
                      {"u": str(user), "s": sub, "t": topup})


def _platform_log(factory: sessionmaker[Session], user: uuid.UUID, amount: int,
                  at: datetime) -> uuid.UUID:
    job = uuid.uuid4()
    with factory.begin() as s:
        s.add(Job(id=job, user_id=user, job_type="image", status="processing", created_at=at))
        s.add(UsageLog(id=uuid.uuid4(), job_id=job, user_id=user, status="reserved",
                       credits=amount, metadata_={"from_sub": amount, "from_topup": 0},
                       created_at=at))
    return job


def test_import_does_not_grant_again_a_balance_the_platform_granted(
        factory: sessionmaker[Session]) -> None:
    """A platform granted its users' balances with its own ids, then runs the import for the
    reservations: the balances are not granted a second time (they were: 200 → 400), with or
    without `--only reservations`; `--only balances` imports nothing else."""
    alice, bob = uuid.uuid4(), uuid.uuid4()
    _platform_balances(factory, [(alice, 150, 50), (bob, 30, 0)])
    with factory.begin() as s:
        credits.grant(s, alice, "sub", 150, "platform-grant-a-sub", now=OLD)
        credits.grant(s, alice, "topup", 50, "platform-grant-a-topup", now=OLD)
    job = _platform_log(factory, alice, 40, OLD - timedelta(minutes=5))

    preview = _cli(factory, "credits", "import", "--dry-run", "--json")
    assert preview.exit_code == 0, preview.output
    out = json.loads(preview.stdout)
    assert out["users"] == 1 and out["users_granted_already"] == 1  # bob only
    assert out["granted"] == {"sub": 30, "topup": 0} and out["reservations"] == 1

    only = _cli(factory, "credits", "import", "--only", "reservations", "--json")
    assert only.exit_code == 0, only.output
    assert json.loads(only.stdout)["users"] == 0 and json.loads(only.stdout)["reservations"] == 1
    assert _balance(factory, alice) == 200 and _balance(factory, bob) == 0

    both = _cli(factory, "credits", "import", "--json")
    assert both.exit_code == 0, both.output
    assert json.loads(both.stdout)["reservations_skipped"] == 1
    assert _balance(factory, alice) == 200 and _balance(factory, bob) == 30
    with factory() as s:
        assert s.get(CreditTransaction, f"job-usage:{job}") is not None
    assert _kinds(factory) == []


def test_import_only_balances_leaves_the_reservations(factory: sessionmaker[Session]) -> None:
    """`--only balances` grants the balances and imports no reservation; a later
    `--only reservations` takes the reservation made before that cut-over."""
    user = uuid.uuid4()
    _platform_balances(factory, [(user, 60, 0)])
    job = _platform_log(factory, user, 40, OLD)
    result = _cli(factory, "credits", "import", "--only", "balances", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["reservations"] == 0
    with factory() as s:
        assert s.get(CreditTransaction, f"job-usage:{job}") is None
    assert _balance(factory, user) == 60
    result = _cli(factory, "credits", "import", "--only", "reservations", "--json")
    assert json.loads(result.stdout)["reservations"] == 1, result.output
    assert _kinds(factory) == []
    assert _cli(factory, "credits", "import", "--only", "everything").exit_code == 2


def test_a_re_run_after_cut_over_does_not_fund_a_later_reservation_with_a_fresh_grant(
        factory: sessionmaker[Session]) -> None:
    """Suspected in issue 24, confirmed: old billing code reserved 40 from the platform's own
    table after the cut-over import; re-running the import funded it with a fresh
    `import-hold:` grant while the ledger's balance still held those 40 credits (refunding it
    then gave the user 140 of 100). It is reported and not imported."""
    user = uuid.uuid4()
    _platform_balances(factory, [(user, 100, 0)])
    with factory.begin() as s:
        from reconcile.credits.importer import import_credits

        import_credits(s, now=OLD)
    assert _balance(factory, user) == 100
    late = _platform_log(factory, user, 40, NOW - timedelta(minutes=30))
    result = _cli(factory, "credits", "import", "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["reservations"] == 0
    assert any(str(late) in p and "after" in p for p in out["problems"])
    with factory() as s:
        assert s.get(CreditTransaction, f"job-usage:{late}") is None
        granted = s.execute(select(CreditTransaction.amount).where(
            CreditTransaction.user_id == user, CreditTransaction.type == "GRANT")).scalars().all()
    assert sum(granted) == 100


# ----------------------------------------------------------------------------- lot id collisions


def test_a_grant_cannot_take_the_lot_id_of_the_librarys_own_refund(
        factory: sessionmaker[Session]) -> None:
    """Suspected in issue 24, confirmed: a grant under `job-refund:{job}:sub` took the lot id
    the library's refund of that job writes, and that refund then failed on every try (a
    unique violation: the credits held forever). The library's prefixes are refused for grants."""
    user, job = _reserved_job(factory)
    refused = None
    with factory.begin() as s:
        try:
            credits.grant(s, user, "sub", 5, f"job-refund:{job}:sub")
        except LedgerError as exc:
            refused = exc.reason
    with factory.begin() as s:  # old code: IntegrityError here, on every try
        assert credits.refund(s, job) is True
    assert refused == "grant_reserved_id"
    assert _balance(factory, user) == 100
    assert _kinds(factory) == []


def test_a_grant_and_a_legacy_refund_cannot_share_a_lot_id(factory: sessionmaker[Session]) -> None:
    """Suspected in issue 24, confirmed: a grant `x:sub` and a legacy refund `x` (whose lot is
    `x:sub`) collided on the lot's unique id: whichever came second failed with a database
    error on every try. Now the second is refused with a clear reason, nothing written."""
    user, job = _reserved_job(factory)
    with factory.begin() as s:
        credits.grant(s, user, "sub", 5, "legacy-1:sub")
    with factory.begin() as s, pytest.raises(LedgerError) as err:
        credits.import_legacy_refund(s, job, 10, "legacy-1")
    assert err.value.reason == "legacy_refund_lot_id_taken"
    with factory.begin() as s:
        assert credits.import_legacy_refund(s, job, 10, "legacy-2") is True
    with factory.begin() as s, pytest.raises(LedgerError) as err:
        credits.grant(s, user, "topup", 5, "legacy-2:sub")
    assert err.value.reason == "grant_id_taken"
    with factory.begin() as s:
        assert credits.refund(s, job) is True
    assert _balance(factory, user) == 105
    assert _kinds(factory) == []


# ----------------------------------------------------------------------------- the FIFO walk


def _branches_swapped(sql: str) -> str:
    """The PostgreSQL reserve statement with every ``(sub lot) UNION ALL (topup lot)`` pair
    emitted topup first: what a plan that reorders the UNION ALL's children returns (each
    branch given its column names, so the swapped statement stays valid)."""
    import re

    sql = sql.replace("SELECT 1, l.id, l.remaining_amount, l.remaining_amount FROM",
                      "SELECT 1 AS p, l.id, l.remaining_amount AS rem, l.remaining_amount AS cum FROM")
    sql = sql.replace("SELECT 1, l.id, l.remaining_amount FROM",
                      "SELECT 1 AS p, l.id, l.remaining_amount AS rem FROM")
    pair = re.compile(r"\((SELECT 0 AS p,.*?LIMIT 1)\)(\s*UNION ALL\s*)\((SELECT 1 AS p,.*?LIMIT 1)\)",
                      re.DOTALL)
    swapped, n = pair.subn(lambda m: f"({m.group(3)}){m.group(2)}({m.group(1)})", sql)
    assert n == 2, sql
    return swapped


def _install_reserve(db: sessionmaker[Session], body: str) -> None:
    from reconcile.credits import _pg
    from reconcile.db.functions import install

    with db.begin() as s:
        install(s.connection(), _pg.RESERVE_FN, _pg_functions.FUNCTIONS[_pg.RESERVE_FN][0], body)


@pytest.mark.parametrize("swap", [False, True])
def test_the_postgresql_fifo_walk_takes_sub_first_whatever_the_union_order(
        db: sessionmaker[Session], request: pytest.FixtureRequest, swap: bool) -> None:
    """Suspected in issue 24, confirmed: the walk took `sub` before `topup` only because
    PostgreSQL happened to emit UNION ALL's children in order. With the branches swapped (a plan
    that reorders them), the old walk took topup first. Now each step orders by the pool."""
    from reconcile.credits import _pg

    if swap:  # the reserve function rebuilt around the swapped statements, the real one after
        swapped = _pg_functions.reserve_body(_branches_swapped(_pg._PG_RESERVE),
                                             _branches_swapped(_pg._PG_RESERVE_GIVEN_ID))
        assert swapped != _pg_functions.FUNCTIONS[_pg.RESERVE_FN][1]
        _install_reserve(db, swapped)
        request.addfinalizer(lambda: _install_reserve(db, _pg_functions.FUNCTIONS[_pg.RESERVE_FN][1]))
    user = uuid.uuid4()
    with db.begin() as s:
        credits.grant(s, user, "topup", 50, f"t-{user}")
        credits.grant(s, user, "sub", 30, f"s1-{user}")
        credits.grant(s, user, "sub", 20, f"s2-{user}")
    taken = []
    for amount in (10, 30, 20):  # within sub, across the sub lots, then into topup
        job = uuid.uuid4()
        with db.begin() as s:
            s.add(Job(id=job, user_id=user, job_type="image", status="processing"))
            s.flush()
            r = credits.reserve(s, user, job, amount)
            taken.append((r.from_sub, r.from_topup))
    assert taken == [(10, 0), (30, 0), (10, 10)]
    with db() as s:
        assert credits.audit(s) == []
