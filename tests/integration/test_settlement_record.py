"""A settlement policy change does not make the audit cry wolf: a failed/cancelled job's partial
refund is recorded with its commit (``usage_logs.metadata["settlement"]``: the refund share and
the kept amount, written by the ledger's CAS), and the audit accepts that commit under any later
policy because the recorded share, recomputed over what the reservation held, keeps exactly it.
A commit with no record is judged by the policy the audit is given (jobs settled before the
record existed); a record whose arithmetic does not agree is flagged.

Lifecycle tests run on PostgreSQL; the ledger-level ones on PostgreSQL and on SQLite."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Uuid, bindparam, select, text, update
from sqlalchemy.orm import Session, sessionmaker

from reconcile import Runtime, credits, lifecycle
from reconcile.db.models import Job, UsageLog
from reconcile.ledger import DEFAULT as LEDGER, BuiltinLedger, audit as library_audit
from reconcile.lifecycle.cancel import cancel_job
from reconcile.settlement import DEFAULT_POLICY, SettlementPolicy, SettleOutcome
from reconcile.testing.simulator import Simulator
from tests.integration.harness import Clock, fund, make_runtime, use_policy

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
FULL = DEFAULT_POLICY  # policy A: every failure and cancel refunded in full
HALF = SettlementPolicy(cancel_refund=Fraction(1, 2))  # policy B: half of a cancel kept
THIRD_FAIL = SettlementPolicy(failure_refund=Fraction(1, 3), cancel_refund=Fraction(1, 2))


def _findings(db: sessionmaker[Session], policy: SettlementPolicy) -> list[tuple[str, Any, str]]:
    with db() as s:
        return [(d.kind, d.job_id, d.detail)
                for d in library_audit(LEDGER, s, now=T0, policy=policy)]


def _meta(db: sessionmaker[Session], job_id: uuid.UUID) -> Any:
    with db() as s:
        return s.execute(select(UsageLog.metadata_).where(UsageLog.job_id == job_id)).scalar_one()


def _set_meta(db: sessionmaker[Session], job_id: uuid.UUID, meta: Any) -> None:
    with db.begin() as s:
        s.execute(update(UsageLog).where(UsageLog.job_id == job_id).values(metadata_=meta))


# ----------------------------------------------------------------------------- the lifecycle


@pytest.fixture
def rt(db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> Runtime:
    runtime, _ = make_runtime(db, simulator, tmp_path, clock=Clock(T0))
    return runtime


def _submit(rt: Runtime, user: uuid.UUID, credits_: int) -> uuid.UUID:
    """A job the provider accepted (its task id saved): the policy's shares apply to it."""
    job_id = lifecycle.submit_job(rt, user, "kie-standard", "seedream/4.5-edit",
                                  {"prompt": "a cat"}, credits_, job_type="image").job_id
    assert lifecycle.create_step(rt, job_id).action == "accepted"
    return job_id


def _submitted_under_half(rt: Runtime, db: sessionmaker[Session],
                          ledger: BuiltinLedger) -> tuple[uuid.UUID, uuid.UUID]:
    """A funded user's 40-credit job submitted through ``ledger`` under policy B (half of a
    cancel kept): (user, job)."""
    rt.ledger = ledger
    use_policy(rt, HALF)
    user = uuid.uuid4()
    fund(db, user)
    return user, _submit(rt, user, 40)


def _fail(rt: Runtime, job_id: uuid.UUID) -> None:
    assert lifecycle.fail_job(rt, job_id, "UPSTREAM_FAILED", "upstream failed", None)


def test_jobs_settled_under_two_policies_audit_clean_under_either(
        rt: Runtime, db: sessionmaker[Session]) -> None:
    """Cancels under A (full refund) and under B (half kept), failures under a third-refund
    policy, from both pools: the audit is clean under A, under B, under the third policy and
    under one nobody used. On main the audit judged every commit by the policy it was given, so
    B's cancels were ``failed_job_committed`` under A (and the failures under A and B)."""
    user = uuid.uuid4()
    fund(db, user, 50, "sub")
    fund(db, user, 950, "topup")
    use_policy(rt, FULL)
    refunded = [_submit(rt, user, n) for n in (40, 41)]
    for job_id in refunded:
        assert cancel_job(rt, user, job_id).credits_actual == 0
    use_policy(rt, HALF)
    halved = {_submit(rt, user, n): kept for n, kept in ((40, 20), (41, 20), (1, 0), (77, 38))}
    for job_id, kept in halved.items():
        assert cancel_job(rt, user, job_id).credits_actual == kept
    use_policy(rt, THIRD_FAIL)
    thirds = {_submit(rt, user, n): kept for n, kept in ((10, 6), (40, 26))}
    for job_id, kept in thirds.items():
        _fail(rt, job_id)
        with db() as s:
            assert s.get(Job, job_id).credits_actual == kept  # type: ignore[union-attr]

    for policy in (FULL, HALF, THIRD_FAIL, SettlementPolicy(cancel_refund=Fraction(1, 4))):
        assert _findings(db, policy) == [], policy
    some = next(iter(halved))
    assert _meta(db, some)["settlement"] == {"status": "cancelled", "refund_share": "1/2",
                                             "kept": 20}
    failed = next(iter(thirds))
    assert _meta(db, failed)["settlement"] == {"status": "failed", "refund_share": "1/3",
                                               "kept": 6}
    assert "settlement" not in _meta(db, refunded[0])  # a full refund records nothing


def test_a_crash_inside_the_settlement_leaves_neither_commit_nor_record(
        rt: Runtime, db: sessionmaker[Session]) -> None:
    """The record is written by the commit's own statement, in the settlement's transaction: a
    crash after the ledger's commit (``mid_refund``) rolls both back; the retry commits and
    records once, and the audit under the default policy is clean."""
    user = uuid.uuid4()
    fund(db, user)
    use_policy(rt, HALF)
    job_id = _submit(rt, user, 40)

    def crash(point: str) -> None:
        if point == "mid_refund":
            raise Killed(point)

    rt.crash_hook = crash
    with pytest.raises(Killed):
        cancel_job(rt, user, job_id)
    with db() as s:
        job = s.get(Job, job_id)
        assert job is not None and job.status == "cancelled" and job.credits_actual is None
        log = s.execute(select(UsageLog).where(UsageLog.job_id == job_id)).scalar_one()
        assert log.status == "reserved" and "settlement" not in log.metadata_
    rt.crash_hook = None
    use_policy(rt, FULL)  # the retry decides under the policy of its own time
    assert lifecycle.settle(rt, job_id) is SettleOutcome.SETTLED
    assert "settlement" not in _meta(db, job_id)
    with db() as s:
        assert s.get(Job, job_id).credits_actual == 0  # type: ignore[union-attr]
    assert _findings(db, HALF) == [] and _findings(db, FULL) == []


class Killed(BaseException):
    """The process dies at a crash point: not an Exception, so nothing in the lifecycle catches
    it, and the open transaction is rolled back as a dead connection's would be."""


# ----------------------------------------------------------------------------- the ledger


@pytest.fixture
def factory(pg_and_sqlite: sessionmaker[Session]) -> sessionmaker[Session]:
    return pg_and_sqlite  # PostgreSQL, then SQLite (tests/integration/conftest.py)


def _settled(factory: sessionmaker[Session], status: str, amount: int, commit: int,
             record: dict[str, str] | None, *, sub: int = 1000, topup: int = 0) -> uuid.UUID:
    """A job the provider accepted (its task id) that ended ``status`` and whose reservation
    of ``amount`` was committed for ``commit`` with ``record`` (None: no record), as the
    ledger writes it."""
    user, job = uuid.uuid4(), uuid.uuid4()
    with factory.begin() as s:
        s.add(Job(id=job, user_id=user, job_type="t", status="pending",
                  provider_task_id=f"t-{job}"))
        if sub:
            credits.grant(s, user, "sub", sub, f"g-sub-{user}", now=T0)
        if topup:
            credits.grant(s, user, "topup", topup, f"g-topup-{user}", now=T0)
        credits.reserve(s, user, job, amount, now=T0)
    with factory.begin() as s:
        s.execute(update(Job).where(Job.id == job)
                  .values(status=status, completed_at=T0, credits_actual=commit))
        assert credits.commit(s, job, commit, now=T0, record=record)
    return job


def _kinds(factory: sessionmaker[Session], policy: SettlementPolicy) -> list[tuple[str, Any]]:
    with factory() as s:
        return [(d.kind, d.job_id) for d in credits.audit(s, now=T0, policy=policy)]


def test_recorded_commits_are_clean_under_any_policy_on_both_databases(
        factory: sessionmaker[Session]) -> None:
    """The record the ledger writes (both pools, an odd amount, a zero kept part, a share of
    0 that keeps everything) passes under A and B; the commit it writes is what it records."""
    half = {"status": "cancelled", "refund_share": "1/2"}
    jobs = [
        _settled(factory, "cancelled", 41, 20, half, sub=30, topup=100),
        _settled(factory, "cancelled", 1, 0, half),
        _settled(factory, "failed", 10, 6, {"status": "failed", "refund_share": "1/3"}),
        _settled(factory, "failed", 9, 9, {"status": "failed", "refund_share": "0/1"}),
    ]
    with factory() as s:
        log = s.execute(select(UsageLog).where(UsageLog.job_id == jobs[0])).scalar_one()
    assert log.metadata_ == {"from_sub": 30, "from_topup": 11,
                             "settlement": {"status": "cancelled", "refund_share": "1/2",
                                            "kept": 20}}
    assert _kinds(factory, FULL) == [] and _kinds(factory, HALF) == []


def test_a_commit_without_a_record_is_judged_by_todays_policy(
        factory: sessionmaker[Session]) -> None:
    """No record (settled before the record existed, or committed by anything but the
    settlement): today's rule. Half of a cancel is clean under B and flagged under A; all of it
    is flagged under both."""
    half_kept = _settled(factory, "cancelled", 40, 20, None)
    all_kept = _settled(factory, "failed", 40, 40, None)
    assert _kinds(factory, HALF) == [("failed_job_committed", all_kept)]
    assert sorted(_kinds(factory, FULL), key=str) == sorted(
        [("failed_job_committed", half_kept), ("failed_job_committed", all_kept)], key=str)


@pytest.mark.parametrize(("name", "settlement"), [
    # the share does not produce the commit (30 of 40 kept is a quarter refund, not a half)
    ("share_disagrees", {"status": "cancelled", "refund_share": "1/2", "kept": 30}),
    # the share produces the commit but the record's kept says another amount
    ("kept_disagrees", {"status": "cancelled", "refund_share": "1/4", "kept": 25}),
    ("no_kept", {"status": "cancelled", "refund_share": "1/4"}),
    ("no_share", {"status": "cancelled", "kept": 30}),
    ("float_kept", {"status": "cancelled", "refund_share": "1/4", "kept": 30.0}),
    ("float_share", {"status": "cancelled", "refund_share": 0.25, "kept": 30}),
    ("share_above_one", {"status": "cancelled", "refund_share": "5/4", "kept": 30}),
    ("zero_denominator", {"status": "cancelled", "refund_share": "1/0", "kept": 30}),
    ("not_a_share", {"status": "cancelled", "refund_share": "a quarter", "kept": 30}),
    ("negative", {"status": "cancelled", "refund_share": "-1/4", "kept": 30}),
    ("huge_denominator", {"status": "cancelled", "refund_share": "1/" + "9" * 40, "kept": 30}),
    ("not_an_object", "settled"),
    ("trailing_newline", {"status": "cancelled", "refund_share": "1/4\n", "kept": 30}),
    ("leading_zero", {"status": "cancelled", "refund_share": "01/4", "kept": 30}),
])
def test_a_forged_record_is_flagged_under_both_policies(
        factory: sessionmaker[Session], name: str, settlement: Any) -> None:
    """A cancel that kept 30 of 40 (a quarter refund, neither A nor B) whose record is rewritten
    so that its arithmetic no longer agrees — or that is not a record at all — is flagged under
    A and under B, and nothing else is; the untouched record passes."""
    quarter = {"status": "cancelled", "refund_share": "1/4"}
    job = _settled(factory, "cancelled", 40, 30, quarter)
    assert _kinds(factory, FULL) == [] and _kinds(factory, HALF) == []
    with factory() as s:
        meta = s.execute(select(UsageLog.metadata_).where(UsageLog.job_id == job)).scalar_one()
    _set_meta(factory, job, {**meta, "settlement": settlement})
    assert _kinds(factory, FULL) == [("failed_job_committed", job)], name
    assert _kinds(factory, HALF) == [("failed_job_committed", job)], name


def test_a_forged_detail_names_the_record_and_what_its_share_keeps(
        factory: sessionmaker[Session]) -> None:
    job = _settled(factory, "cancelled", 40, 30, {"status": "cancelled", "refund_share": "1/4"})
    with factory() as s:
        meta = s.execute(select(UsageLog.metadata_).where(UsageLog.job_id == job)).scalar_one()
    _set_meta(factory, job, {**meta, "settlement": {"status": "cancelled",
                                                    "refund_share": "1/2", "kept": 30}})
    with factory() as s:
        found = credits.audit(s, now=T0, policy=HALF)
    assert [d.detail for d in found] == [
        "job cancelled, reservation committed 30 (the settlement policy keeps 20 of 40); "
        "recorded refund share 1/2, kept 30 (that share keeps 20 of 40)"]


def test_a_record_on_metadata_that_is_not_an_object_is_not_written(
        factory: sessionmaker[Session]) -> None:
    """A platform's own non-object metadata is left as it is: no record, so the job is judged
    by today's policy (flagged under A, clean under B, whose share it kept)."""
    user, job = uuid.uuid4(), uuid.uuid4()
    with factory.begin() as s:
        s.add(Job(id=job, user_id=user, job_type="t", status="pending",
                  provider_task_id=f"t-{job}"))  # accepted: the policy's share applies
        credits.grant(s, user, "sub", 100, f"g-{user}", now=T0)
        credits.reserve(s, user, job, 40, now=T0)
    _set_meta(factory, job, ["platform", "list"])
    with factory.begin() as s:
        s.execute(update(Job).where(Job.id == job)
                  .values(status="cancelled", completed_at=T0, credits_actual=20))
        assert credits.commit(s, job, 20, now=T0,
                              record={"status": "cancelled", "refund_share": "1/2"})
    assert _meta(factory, job) == ["platform", "list"]
    assert _kinds(factory, HALF) == []
    assert _kinds(factory, FULL) == [("failed_job_committed", job)]


def test_a_repeated_commit_records_nothing(factory: sessionmaker[Session]) -> None:
    """The record goes with the CAS: a second commit (already settled) changes nothing, not
    even the record, whatever record it carries."""
    job = _settled(factory, "cancelled", 40, 20, {"status": "cancelled", "refund_share": "1/2"})
    before = _meta(factory, job)
    with factory.begin() as s:
        assert not credits.commit(s, job, 30, now=T0,
                                  record={"status": "cancelled", "refund_share": "1/4"})
    assert _meta(factory, job) == before
    assert _kinds(factory, FULL) == []


def test_a_boolean_kept_is_not_a_number(factory: sessionmaker[Session]) -> None:
    """A JSON true is not the amount 1 (SQLite's json_extract would say 1): a commit of 1 of 4
    whose record's share keeps 1 but whose kept is ``true`` is flagged under A and B."""
    job = _settled(factory, "cancelled", 4, 1, {"status": "cancelled", "refund_share": "3/4"})
    assert _kinds(factory, FULL) == [] and _kinds(factory, HALF) == []
    meta = _meta(factory, job)
    _set_meta(factory, job, {**meta, "settlement": {**meta["settlement"], "kept": True}})
    assert _kinds(factory, FULL) == [("failed_job_committed", job)]
    assert _kinds(factory, HALF) == [("failed_job_committed", job)]


@pytest.mark.parametrize("den", [999_999_937, 999_999_999_999_999_989])
def test_the_recomputation_is_exact_at_the_largest_amounts(
        factory: sessionmaker[Session], den: int) -> None:
    """Near 2⁶² credits and a share with a 9- or 18-digit denominator (floats would be off by
    hundreds): the recorded share keeps exactly ``decide``'s amount, and one credit more or less
    with a record claiming it is flagged. SQLite computes in 64-bit integers, so it accepts
    denominators of 9 digits at most: an 18-digit one there is not a share it can check."""
    from reconcile.settlement import MAX_SHARE_DENOMINATOR, decide, kept_of

    sqlite = factory.kw["bind"].dialect.name == "sqlite"
    held = 4_611_686_018_427_387_000
    share = Fraction(1, den)
    if den <= MAX_SHARE_DENOMINATOR:
        kept = decide("cancelled", reserved=held,
                      policy=SettlementPolicy(cancel_refund=share)).commit
    else:  # no policy may hold this share any more: a record from an older library, or forged
        kept = kept_of(held, share)
    assert kept == held - -(-held // den) and kept != int(held * (1 - 1 / den))
    record = {"status": "cancelled", "refund_share": f"1/{den}"}
    good = _settled(factory, "cancelled", held, kept, record, sub=held)
    more = _settled(factory, "cancelled", held, kept + 1, record, sub=held)
    less = _settled(factory, "cancelled", held, kept - 1, record, sub=held)
    flagged = {more, less} | ({good} if sqlite and den > 10**9 else set())
    for policy in (FULL, HALF):
        assert {job for kind, job in _kinds(factory, policy) if kind == "failed_job_committed"} \
            == flagged


class OldSignatureLedger(BuiltinLedger):
    """A platform's BuiltinLedger subclass written before ``record=``: its ``commit_settled``
    has the old signature."""

    def commit_settled(self, session: Session, job_id: uuid.UUID,  # type: ignore[override]
                       amount: int | None = None, *, now: datetime | None = None) -> Any:
        return super().commit_settled(session, job_id, amount, now=now)


def test_a_subclassed_ledger_whose_commit_takes_no_record_still_settles(
        rt: Runtime, db: sessionmaker[Session]) -> None:
    """A platform's BuiltinLedger subclass that overrides ``commit_settled`` with the old
    signature is not handed the record (it would raise and the settlement back off forever):
    the cancel settles, nothing is recorded, and the audit judges it by the policy given."""
    user, job_id = _submitted_under_half(rt, db, OldSignatureLedger())
    assert cancel_job(rt, user, job_id).credits_actual == 20
    assert _findings(db, HALF) == []
    assert [kind for kind, _, _ in _findings(db, FULL)] == ["failed_job_committed"]
    assert "settlement" not in _meta(db, job_id)


# ----------------------------------------------------------------------------- atk2: hostile numbers


def _set_raw_meta(factory: sessionmaker[Session], job_id: uuid.UUID, raw: str) -> None:
    """The log's metadata set to the JSON text ``raw`` exactly (no Python round trip)."""
    cast_ = "CAST(:m AS jsonb)" if factory.kw["bind"].dialect.name == "postgresql" else ":m"
    with factory.begin() as s:
        s.execute(text(f"UPDATE usage_logs SET metadata = {cast_} WHERE job_id = :j")
                  .bindparams(bindparam("j", type_=Uuid())), {"m": raw, "j": job_id})


def _printed(factory: sessionmaker[Session], job_id: uuid.UUID, key: str) -> str | None:
    """The log's metadata member ``key`` as the database prints it (None: not JSON)."""
    if factory.kw["bind"].dialect.name == "postgresql":
        sql = "SELECT (metadata -> :k)::text FROM usage_logs WHERE job_id = :j"
    else:
        sql = ("SELECT CASE WHEN json_valid(metadata) THEN metadata -> ('$.' || :k) END "
               "FROM usage_logs WHERE job_id = :j")
    with factory() as s:
        return s.execute(text(sql).bindparams(bindparam("j", type_=Uuid())),
                         {"k": key, "j": job_id}).scalar_one()


# numbers a float cannot hold: beyond its range (1e400, and 10^400 + 0.5 as PostgreSQL prints
# it), and more digits than it keeps
_HOSTILE_NUMBERS = {"cost_usd": "0.30000000000000000001", "huge": "1e400",
                    "huge_fraction": "1" + "0" * 400 + ".5", "exact": "12345678901234567890.5"}


def test_a_recorded_commit_keeps_the_platforms_numbers_exactly(
        factory: sessionmaker[Session]) -> None:
    """The metadata a platform wrote (numbers no float holds) survives the recorded commit
    as it was, and the record is readable by the audit: the Core path (SQLite always) merged the
    record in Python, through json.loads/json.dumps, so it rewrote 0.30000000000000000001 as
    0.3 and 1e400 as ``Infinity`` — not JSON, so SQLite's audit saw no record and flagged the
    half kept under the full-refund policy."""
    user, job = uuid.uuid4(), uuid.uuid4()
    with factory.begin() as s:
        s.add(Job(id=job, user_id=user, job_type="t", status="pending"))
        credits.grant(s, user, "sub", 100, f"g-{user}", now=T0)
        credits.reserve(s, user, job, 40, now=T0)
    numbers = ", ".join(f'"{k}": {v}' for k, v in _HOSTILE_NUMBERS.items())
    _set_raw_meta(factory, job, '{"from_sub": 40, "from_topup": 0, ' + numbers + "}")
    before = {key: _printed(factory, job, key) for key in _HOSTILE_NUMBERS}
    assert None not in before.values()
    with factory.begin() as s:
        s.execute(update(Job).where(Job.id == job)
                  .values(status="cancelled", completed_at=T0, credits_actual=20))
        assert credits.commit(s, job, 20, now=T0,
                              record={"status": "cancelled", "refund_share": "1/2"})
    assert {key: _printed(factory, job, key) for key in _HOSTILE_NUMBERS} == before
    assert _meta(factory, job)["settlement"] == {"status": "cancelled", "refund_share": "1/2",
                                                 "kept": 20}
    assert _kinds(factory, FULL) == [] and _kinds(factory, HALF) == []


def test_a_platform_reservation_with_a_huge_number_still_settles(
        db: sessionmaker[Session]) -> None:
    """PostgreSQL's Core path (a platform's own reservation: no USAGE row): the recorded
    commit wrote the metadata back through a float, 10^400 + 0.5 became ``Infinity`` and
    PostgreSQL refused the UPDATE — the settlement raised (and backed off) on every retry,
    where the unrecorded commit settles."""
    from reconcile.db.models import CreditBalance

    user, job = uuid.uuid4(), uuid.uuid4()
    with db.begin() as s:
        s.add(Job(id=job, user_id=user, job_type="t", status="cancelled", completed_at=T0))
        credits.grant(s, user, "sub", 100, f"g-{user}", now=T0)
        s.flush()
        s.add(UsageLog(id=uuid.uuid4(), job_id=job, user_id=user, status="reserved", credits=40,
                       metadata_={"from_sub": 40, "from_topup": 0}))
    huge = _HOSTILE_NUMBERS["huge_fraction"]
    _set_raw_meta(db, job, f'{{"from_sub": 40, "from_topup": 0, "huge": {huge}}}')
    with db.begin() as s:
        assert credits.commit(s, job, 20, now=T0,
                              record={"status": "cancelled", "refund_share": "1/2"})
    assert _printed(db, job, "huge") == huge
    assert _meta(db, job)["settlement"] == {"status": "cancelled", "refund_share": "1/2",
                                            "kept": 20}
    with db() as s:
        balance = s.get(CreditBalance, user)
        assert balance is not None and balance.sub == 120  # 100 granted, 20 of 40 given back


# ----------------------------------------------------------------------------- atk2: planted records


@pytest.mark.parametrize("planted", [
    {"status": "cancelled", "refund_share": "0/1", "kept": 40},  # "nothing refunded": keeps all
    {"status": "cancelled", "refund_share": "1/2", "kept": 40},  # kept agrees, share does not
])
def test_a_record_planted_before_an_unrecorded_commit_is_not_the_settlements(
        factory: sessionmaker[Session], planted: dict[str, Any]) -> None:
    """A platform wrote a "settlement" key into the reservation's metadata before the job was
    settled (its own bookkeeping, a copy of another job's metadata, a forgery), then the job is
    committed without a record (a platform's own settling code, a BuiltinLedger subclass whose
    commit takes no record=): all 40 of a cancel kept, which no policy decided. The audit
    accepted it under every policy because it took the planted key for the ledger's record. An
    unrecorded commit now drops the key in its own CAS, so the record a committed log carries is
    always the one its commit wrote; the commit is flagged under both policies."""
    user, job = uuid.uuid4(), uuid.uuid4()
    with factory.begin() as s:
        s.add(Job(id=job, user_id=user, job_type="t", status="pending"))
        credits.grant(s, user, "sub", 100, f"g-{user}", now=T0)
        credits.reserve(s, user, job, 40, now=T0)
    _set_meta(factory, job, {**_meta(factory, job), "settlement": planted, "mine": [1, {"a": 2}]})
    with factory.begin() as s:
        s.execute(update(Job).where(Job.id == job)
                  .values(status="cancelled", completed_at=T0, credits_actual=40))
        assert credits.commit(s, job, now=T0)  # no record: all of it
    assert _kinds(factory, FULL) == [("failed_job_committed", job)]
    assert _kinds(factory, HALF) == [("failed_job_committed", job)]
    assert _meta(factory, job) == {"from_sub": 40, "from_topup": 0, "mine": [1, {"a": 2}]}


def test_a_subclassed_ledger_does_not_inherit_a_planted_record(
        rt: Runtime, db: sessionmaker[Session]) -> None:
    """The lifecycle form: a BuiltinLedger subclass whose commit_settled takes no record=
    settles a cancel under B (half kept, nothing recorded) after the platform planted a record
    saying exactly that. Unrecorded, the commit is judged by the policy given (flagged under A,
    as test_a_subclassed_ledger_whose_commit_takes_no_record_still_settles says) — the planted
    key made it pass under A."""
    user, job_id = _submitted_under_half(rt, db, OldSignatureLedger())
    _set_meta(db, job_id, {**_meta(db, job_id), "settlement": {
        "status": "cancelled", "refund_share": "1/2", "kept": 20}})
    assert cancel_job(rt, user, job_id).credits_actual == 20
    assert _findings(db, HALF) == []
    assert [kind for kind, _, _ in _findings(db, FULL)] == ["failed_job_committed"]
    assert "settlement" not in _meta(db, job_id)


def test_a_platform_ledger_is_never_handed_the_record(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """A platform's own Ledger (not a BuiltinLedger; no records_settlement) settles a cancel
    under B: half kept, its own metadata written, no "settlement" key, the audit clean."""
    from reconcile.db.models import CreditBalance
    from tests.integration.ledgers import make_backend

    backend = make_backend("platform", db)
    rt, _ = make_runtime(db, simulator, tmp_path, clock=Clock(T0))
    rt.ledger = backend.ledger
    use_policy(rt, HALF)
    user = uuid.uuid4()
    backend.fund(user, 100)
    job_id = _submit(rt, user, 40)
    assert cancel_job(rt, user, job_id).credits_actual == 20
    meta = _meta(db, job_id)
    assert "settlement" not in meta and "committed" in meta
    assert backend.balance(user) == (80, 0)
    with db() as s:
        assert library_audit(backend.ledger, s, now=T0, policy=HALF) == []
        assert s.execute(select(CreditBalance).limit(1)).first() is None  # built-in untouched


def test_a_subclass_overriding_commit_only_still_settles_and_records(
        rt: Runtime, db: sessionmaker[Session]) -> None:
    """A BuiltinLedger subclass that overrides ``commit`` with the old signature (no record=)
    but not ``commit_settled``: the settlement goes through the inherited commit_settled (the
    built-in CAS, as before the record existed: the override is not called at settlement), and
    the record is written by that CAS, so it is the commit's."""
    from reconcile.ledger import BuiltinLedger

    calls: list[uuid.UUID] = []

    class OldCommit(BuiltinLedger):
        def commit(self, session: Session, job_id: uuid.UUID,  # type: ignore[override]
                   amount: int | None = None, *, now: datetime | None = None) -> bool:
            calls.append(job_id)
            return super().commit(session, job_id, amount, now=now)

    user, job_id = _submitted_under_half(rt, db, OldCommit())
    assert cancel_job(rt, user, job_id).credits_actual == 20
    assert calls == []
    assert _meta(db, job_id)["settlement"] == {"status": "cancelled", "refund_share": "1/2",
                                               "kept": 20}
    assert _findings(db, HALF) == [] and _findings(db, FULL) == []
