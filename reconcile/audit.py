"""The ledger audit: a proof of conservation, per job, per pool and per user.

An empty list means the ledger balances. The audit reads the library's tables (and the jobs it
knows) and never writes. What it proves:

* **Per transaction**: ``amount = from_sub + from_topup``, nothing negative, and an id under the
  library's own prefixes (``job-usage:`` …) names its type and job (``txn_split_mismatch``,
  ``txn_id_mismatch``).
* **Per job** the ledger knows (it has a ``job-usage:{job}`` USAGE row, written or imported),
  per pool: ``USAGE (+ re-charge USAGE) = COMMIT (+ re-charge COMMIT) + RELEASE + REFUND +
  legacy refunds + what is still held`` (``commit_exceeds_reservation``, ``job_unbalanced``,
  ``pool_mismatch``, ``legacy_refund_exceeds_reservation``); the usage log agrees (one log, one
  ``reserved`` at most, its credits = the USAGE amount, its status = the settlement:
  ``usage_log_missing``, ``duplicate_reserved_log``, ``usage_amount_mismatch``,
  ``settled_twice``, ``reserved_but_settled``, ``settlement_missing``); and the job row agrees
  (``failed_job_committed``, ``completed_after_refund`` unless re-charged,
  ``credits_actual_mismatch``, ``terminal_job_reserved`` past the grace,
  ``in_flight_past_horizon``). A COMMIT/RELEASE/REFUND for a job with no USAGE row is
  ``refund_without_reservation`` / ``settlement_without_reservation``.
* **Per lot**: ``0 ≤ remaining ≤ amount`` (``negative_lot``, ``lot_out_of_range``); every GRANT,
  RELEASE and REFUND transaction has exactly the lots it says, per pool
  (``grant_lot_mismatch``, ``release_lot_mismatch``, ``refund_lot_mismatch``), and no lot lacks
  its transaction (``lot_without_txn``).
* **Per user**, per pool: balance = Σ open lots (``balance_mismatch``, ``negative_balance``,
  ``balance_missing`` when lots or transactions exist without a balance row); what the lots gave
  up = Σ USAGE (``lot_consumption_mismatch``: credits taken from a lot with no transaction);
  and granted = balance + held + committed (``unbalanced``).

Legacy refunds are counted exactly as the ledger counts them: a REFUND for the job under any id
but ``job-refund:{job}`` (:func:`reconcile.credits.legacy_refunded`). Platform rows from before
adoption without a USAGE row are outside the per-job classes until imported.

**The in-flight horizon.** A job still ``pending``/``processing`` must be failed by the time its
kind allows (DESIGN §6): a sync kind at its threshold; an async kind once its attempts are spent,
``max(start + threshold, last attempt) + (MAX_ATTEMPTS − attempts) × 5 min`` (all scaled by
``TIME_SCALE``; attempts beyond the maximum move it back), plus the grace and one sweep interval of slack. An ``uncertain`` job (held on
purpose), an observe-only kind and a kind this process does not know are excepted.

**Incremental mode** (``since``): the users touched since the watermark (a transaction, a usage
log, a balance update or a job finishing since then), plus every user with a job in flight or a
reservation held, and everything of theirs, checked with the same rules. It cannot replace the
full audit: lots change in place (``remaining_amount`` carries no time), and a platform can
rewrite a usage log or a job without any timestamp moving, so damage to a user untouched since
the watermark is invisible to it. Run it often; run the full audit as the proof.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Select, or_, select
from sqlalchemy.orm import Session

from .db.models import CreditBalance, CreditLot, CreditTransaction, Job, UsageLog
from .kinds import get_kind
from .settings import Settings
from .states import ATTEMPT_SPACING, IN_FLIGHT, MAX_ATTEMPTS, Submission

POOLS = ("sub", "topup")
CHUNK = 1000  # ids per IN (…) list in the incremental mode
STREAM = 20_000  # rows per fetch in the full mode


@dataclass(frozen=True)
class Discrepancy:
    kind: str
    user_id: uuid.UUID | None
    job_id: uuid.UUID | None
    detail: str


class _Pools:
    """A mutable (sub, topup) pair."""

    __slots__ = ("sub", "topup")

    def __init__(self, sub: int = 0, topup: int = 0) -> None:
        self.sub, self.topup = sub, topup

    def add(self, sub: int, topup: int) -> None:
        self.sub += sub
        self.topup += topup

    @property
    def total(self) -> int:
        return self.sub + self.topup

    def pair(self) -> tuple[int, int]:
        return self.sub, self.topup


# the job-level classes of a transaction (by its exact id)
_USAGE, _R_USAGE, _COMMIT, _R_COMMIT, _RELEASE, _REFUND, _LEGACY = (
    "usage", "r_usage", "commit", "r_commit", "release", "refund", "legacy")


def _classify(txn_id: str, type_: str, job_id: uuid.UUID) -> str | None:
    exact = {
        f"job-usage:{job_id}": ("USAGE", _USAGE),
        f"job-commit:{job_id}": ("COMMIT", _COMMIT),
        f"job-release:{job_id}": ("RELEASE", _RELEASE),
        f"job-refund:{job_id}": ("REFUND", _REFUND),
        f"job-recharge:{job_id}:usage": ("USAGE", _R_USAGE),
        f"job-recharge:{job_id}:commit": ("COMMIT", _R_COMMIT),
    }.get(txn_id)
    if exact is not None:
        return exact[1] if exact[0] == type_ else None
    if type_ == "REFUND":
        return _LEGACY  # the ledger's rule: any other id (prefixed or not) is a legacy refund
    return None


@dataclass
class _JobFacts:
    user_id: uuid.UUID
    parts: dict[str, _Pools] = field(default_factory=dict)

    def get(self, cls: str) -> _Pools:
        return self.parts.get(cls) or _Pools()


@dataclass
class _UserFacts:
    flows: dict[str, _Pools] = field(default_factory=lambda: defaultdict(_Pools))
    remaining: _Pools = field(default_factory=_Pools)
    consumed: _Pools = field(default_factory=_Pools)
    has_lots: bool = False
    held: int = 0
    balance: int | None = None  # the balance row's sub + topup (None: no row)


@dataclass
class _Audit:
    session: Session
    now: datetime
    grace: timedelta
    settings: Settings
    users: set[uuid.UUID] | None  # None: every user (the full audit)
    found: list[Discrepancy] = field(default_factory=list)
    per_user: dict[uuid.UUID, _UserFacts] = field(default_factory=lambda: defaultdict(_UserFacts))
    jobs: dict[uuid.UUID, _JobFacts] = field(default_factory=dict)
    # lot source id → (txn type, pool, amount) a GRANT/RELEASE/REFUND promises
    expected_lots: dict[str, tuple[str, str, int]] = field(default_factory=dict)

    def report(self, kind: str, user_id: uuid.UUID | None, job_id: uuid.UUID | None,
               detail: str) -> None:
        self.found.append(Discrepancy(kind, user_id, job_id, detail))

    def rows(self, stmt: Select[Any], column: Any) -> Iterator[Any]:
        """``stmt`` for every user (streamed) or for the audited users only (chunked)."""
        if self.users is None:
            yield from self.session.execute(stmt.execution_options(yield_per=STREAM))
            return
        ids = sorted(self.users)
        for i in range(0, len(ids), CHUNK):
            yield from self.session.execute(stmt.where(column.in_(ids[i:i + CHUNK])))


def run(session: Session, *, now: datetime, grace: timedelta = timedelta(minutes=10),
        settings: Settings | None = None, since: datetime | None = None) -> list[Discrepancy]:
    """The full audit, or with ``since`` the incremental one (see the module docstring)."""
    settings = settings or Settings.model_construct()
    users = None if since is None else touched_users(session, since)
    a = _Audit(session, now, grace, settings, users)
    _transactions(a)
    _lots(a)
    _balances(a)
    _jobs(a)
    return a.found


def touched_users(session: Session, since: datetime) -> set[uuid.UUID]:
    """Users with a transaction, usage log or balance change since ``since``, a job finished
    since then, a job in flight, or a reservation held."""
    queries: Iterable[Select[Any]] = (
        select(CreditTransaction.user_id).where(CreditTransaction.created_at >= since).distinct(),
        select(CreditBalance.user_id).where(CreditBalance.updated_at >= since),
        select(UsageLog.user_id).where(or_(UsageLog.created_at >= since,
                                           UsageLog.status == "reserved")).distinct(),
        select(Job.user_id).where(or_(Job.completed_at >= since,
                                      Job.status.in_(IN_FLIGHT))).distinct(),
    )
    users: set[uuid.UUID] = set()
    for stmt in queries:
        users.update(session.execute(stmt).scalars())
    return users


# ----------------------------------------------------------------------------- transactions


def _transactions(a: _Audit) -> None:
    t = CreditTransaction
    stmt = select(t.id, t.user_id, t.job_id, t.type, t.amount, t.from_sub, t.from_topup)
    orphans: list[tuple[str, uuid.UUID, uuid.UUID | None, str]] = []
    for txn_id, user_id, job_id, type_, amount, f_sub, f_topup in a.rows(stmt, t.user_id):
        if amount != f_sub + f_topup or f_sub < 0 or f_topup < 0:
            a.report("txn_split_mismatch", user_id, job_id,
                     f"{txn_id}: amount {amount} != sub {f_sub} + topup {f_topup}")
        a.per_user[user_id].flows[type_].add(f_sub, f_topup)
        _expect_lots(a, txn_id, type_, f_sub, f_topup)
        if job_id is None:
            if type_ != "GRANT":
                orphans.append((txn_id, user_id, job_id, type_))
            continue
        cls = _classify(txn_id, type_, job_id)
        if cls is None:
            a.report("txn_id_mismatch", user_id, job_id, f"{txn_id} is a {type_} for job {job_id}")
            continue
        facts = a.jobs.get(job_id)
        if facts is None:
            facts = a.jobs[job_id] = _JobFacts(user_id)
        facts.parts.setdefault(cls, _Pools()).add(f_sub, f_topup)
    for txn_id, user_id, job_id, type_ in orphans:
        a.report(_orphan_kind(type_), user_id, job_id, f"{txn_id} names no job")
    for job_id, facts in list(a.jobs.items()):
        if _USAGE not in facts.parts:
            for cls in facts.parts:
                a.report(_orphan_kind("REFUND" if cls in (_REFUND, _LEGACY) else "COMMIT"),
                         facts.user_id, job_id, f"{cls} for a job with no USAGE row")
            del a.jobs[job_id]


def _orphan_kind(type_: str) -> str:
    return "refund_without_reservation" if type_ == "REFUND" else "settlement_without_reservation"


def _expect_lots(a: _Audit, txn_id: str, type_: str, f_sub: int, f_topup: int) -> None:
    if type_ == "GRANT":
        if f_sub or f_topup:
            pool = "sub" if f_sub else "topup"
            a.expected_lots[txn_id] = (type_, pool, f_sub + f_topup)
    elif type_ in ("RELEASE", "REFUND"):
        for pool, part in zip(POOLS, (f_sub, f_topup), strict=True):
            if part > 0:
                a.expected_lots[f"{txn_id}:{pool}"] = (type_, pool, part)


# ----------------------------------------------------------------------------- lots & balances


def _lots(a: _Audit) -> None:
    lot = CreditLot
    stmt = select(lot.id, lot.user_id, lot.pool, lot.kind, lot.source_txn_id, lot.amount,
                  lot.remaining_amount)
    for lot_id, user_id, pool, kind, source, amount, remaining in a.rows(stmt, lot.user_id):
        facts = a.per_user[user_id]
        facts.has_lots = True
        if pool not in POOLS:
            a.report("lot_out_of_range", user_id, None, f"lot {lot_id}: pool {pool!r}")
            continue
        as_pair = (lambda n: (n, 0)) if pool == "sub" else (lambda n: (0, n))
        facts.remaining.add(*as_pair(remaining))
        facts.consumed.add(*as_pair(amount - remaining))
        if remaining < 0:
            a.report("negative_lot", user_id, None, f"lot {lot_id}: {remaining}/{amount}")
        elif remaining > amount or amount <= 0:
            a.report("lot_out_of_range", user_id, None, f"lot {lot_id}: {remaining}/{amount}")
        want = a.expected_lots.pop(source, None)
        if want is None:
            a.report("lot_without_txn", user_id, None, f"lot {lot_id} ({kind}) from {source}")
        elif want != (kind, pool, amount):
            a.report(f"{want[0].lower()}_lot_mismatch", user_id, None,
                     f"{source}: the transaction gives {want[2]} to {want[1]}, lot {lot_id} "
                     f"got {amount} in {pool} ({kind})")
    for source, (type_, pool, amount) in a.expected_lots.items():
        a.report(f"{type_.lower()}_lot_mismatch", None, None,
                 f"{source}: the transaction gives {amount} to {pool}, no lot got it")


def _balances(a: _Audit) -> None:
    b = CreditBalance
    seen: set[uuid.UUID] = set()
    for user_id, sub, topup in a.rows(select(b.user_id, b.sub, b.topup), b.user_id):
        seen.add(user_id)
        facts = a.per_user[user_id]
        facts.balance = sub + topup
        for pool, have, in_lots in (("sub", sub, facts.remaining.sub),
                                    ("topup", topup, facts.remaining.topup)):
            if have != in_lots:
                a.report("balance_mismatch", user_id, None, f"{pool}: balance {have} != lots {in_lots}")
            if have < 0:
                a.report("negative_balance", user_id, None, f"{pool}: {have}")
    for user_id, facts in a.per_user.items():
        if user_id not in seen and (facts.has_lots or facts.flows):
            a.report("balance_missing", user_id, None,
                     f"no balance row; lots hold {facts.remaining.pair()}")
        usage = facts.flows.get("USAGE") or _Pools()
        for pool in POOLS:
            consumed, used = getattr(facts.consumed, pool), getattr(usage, pool)
            if consumed != used:
                a.report("lot_consumption_mismatch", user_id, None,
                         f"{pool}: lots gave up {consumed}, USAGE took {used}")


# ----------------------------------------------------------------------------- jobs


@dataclass
class _Log:
    status: str
    credits: int
    reserved: int = 0
    count: int = 0


def _logs(a: _Audit) -> dict[uuid.UUID, _Log]:
    logs: dict[uuid.UUID, _Log] = {}
    u = UsageLog
    stmt = select(u.job_id, u.status, u.credits).order_by(u.created_at, u.id)
    ids = sorted(a.jobs)
    chunks = ([stmt.where(u.job_id.is_not(None)).execution_options(yield_per=STREAM)]
              if a.users is None else
              [stmt.where(u.job_id.in_(ids[i:i + CHUNK])) for i in range(0, len(ids), CHUNK)])
    for chunk in chunks:
        for job_id, status, credits_ in a.session.execute(chunk):
            if job_id not in a.jobs:
                continue
            log = logs.get(job_id)
            if log is None:
                log = logs[job_id] = _Log(status, credits_)  # the first, as the ledger reads it
            log.count += 1
            log.reserved += status == "reserved"
    return logs


def _job_rows(a: _Audit) -> dict[uuid.UUID, Any]:
    j = Job
    cols = (j.id, j.status, j.credits_actual, j.submission_state, j.provider_kind,
            j.provider_call_started_at, j.started_at, j.created_at, j.completed_at,
            j.reconcile_attempts, j.reconcile_last_attempt_at, j.poll_lease_expires_at)
    ids = sorted(a.jobs)
    rows: dict[uuid.UUID, Any] = {}
    if a.users is None:
        for row in a.session.execute(select(*cols).execution_options(yield_per=STREAM)):
            if row.id in a.jobs:
                rows[row.id] = row
        return rows
    for i in range(0, len(ids), CHUNK):
        for row in a.session.execute(select(*cols).where(j.id.in_(ids[i:i + CHUNK]))):
            rows[row.id] = row
    return rows


def _jobs(a: _Audit) -> None:
    logs = _logs(a)
    rows = _job_rows(a)
    for job_id, facts in a.jobs.items():
        log = logs.get(job_id)
        held = _job_identity(a, job_id, facts, log)
        a.per_user[facts.user_id].held += held
        row = rows.get(job_id)
        if row is not None:
            _job_row(a, job_id, facts, log, row)
    for user_id, facts in a.per_user.items():
        if a.users is not None and user_id not in a.users:
            continue
        granted = facts.flows["GRANT"].total if "GRANT" in facts.flows else 0
        committed = facts.flows["COMMIT"].total if "COMMIT" in facts.flows else 0
        balance = facts.balance if facts.balance is not None else facts.remaining.total
        if granted != balance + facts.held + committed:
            a.report("unbalanced", user_id, None,
                     f"granted {granted} != balance {balance} + reserved {facts.held} + "
                     f"committed {committed}")


def _job_identity(a: _Audit, job_id: uuid.UUID, facts: _JobFacts, log: _Log | None) -> int:
    """The per-job, per-pool identity and the log's agreement; returns what is still held."""
    user = facts.user_id
    usage, legacy = facts.get(_USAGE), facts.get(_LEGACY)
    status = log.status if log is not None else None
    if log is None:
        a.report("usage_log_missing", user, job_id, "a USAGE row and no usage log")
    else:
        if log.reserved > 1:
            a.report("duplicate_reserved_log", user, job_id, f"{log.reserved} reserved usage logs")
        if log.credits != usage.total:
            a.report("usage_amount_mismatch", user, job_id,
                     f"USAGE {usage.total} != usage log credits {log.credits}")
    held = (_Pools(usage.sub - legacy.sub, usage.topup - legacy.topup)
            if status == "reserved" else _Pools())
    if held.sub < 0 or held.topup < 0:
        a.report("legacy_refund_exceeds_reservation", user, job_id,
                 f"legacy refunds {legacy.pair()} on a reservation of {usage.pair()}")
    _identity(a, job_id, facts, held)
    _settlement(a, job_id, facts, status)
    return held.total


def _identity(a: _Audit, job_id: uuid.UUID, facts: _JobFacts, held: _Pools) -> None:
    lhs, rhs = _Pools(), _Pools()
    for cls in (_USAGE, _R_USAGE):
        lhs.add(*facts.get(cls).pair())
    for cls in (_COMMIT, _R_COMMIT, _RELEASE, _REFUND, _LEGACY):
        rhs.add(*facts.get(cls).pair())
    rhs.add(*held.pair())
    terms = ", ".join(f"{cls} {p.pair()}" for cls, p in sorted(facts.parts.items()))
    if lhs.total != rhs.total:
        usage, legacy, commit = facts.get(_USAGE), facts.get(_LEGACY), facts.get(_COMMIT)
        kind = ("commit_exceeds_reservation" if commit.total > usage.total - legacy.total
                else "job_unbalanced")
        a.report(kind, facts.user_id, job_id,
                 f"USAGE {lhs.total} != COMMIT + RELEASE + REFUND + held {rhs.total} ({terms}, "
                 f"held {held.pair()})")
    elif lhs.pair() != rhs.pair():
        a.report("pool_mismatch", facts.user_id, job_id,
                 f"per pool USAGE {lhs.pair()} != settled + held {rhs.pair()} ({terms})")


def _settlement(a: _Audit, job_id: uuid.UUID, facts: _JobFacts, status: str | None) -> None:
    ids = [f"job-{cls}:{job_id}" for cls in (_COMMIT, _REFUND) if cls in facts.parts]
    if len(ids) > 1:
        a.report("settled_twice", facts.user_id, job_id, ", ".join(ids))
    want = {"committed": _COMMIT, "refunded": _REFUND}.get(status or "")
    if status == "reserved" and ids:
        a.report("reserved_but_settled", facts.user_id, job_id, ", ".join(ids))
    elif want is not None and want not in facts.parts:
        a.report("settlement_missing", facts.user_id, job_id,
                 f"usage log {status} without its transaction")


def _job_row(a: _Audit, job_id: uuid.UUID, facts: _JobFacts, log: _Log | None, row: Any) -> None:
    user, status = facts.user_id, log.status if log is not None else None
    recharged = _R_COMMIT in facts.parts
    if row.status in ("failed", "cancelled") and status == "committed":
        a.report("failed_job_committed", user, job_id, f"job {row.status}, reservation committed")
    if row.status == "completed" and status == "refunded" and not recharged:
        a.report("completed_after_refund", user, job_id,
                 "job completed and its reservation refunded (keep the refund, or re-charge: "
                 "credits.recharge)")
    if row.status in ("completed", "failed", "cancelled") and status == "reserved":
        if (row.completed_at or row.created_at) < a.now - a.grace:
            a.report("terminal_job_reserved", user, job_id,
                     f"job {row.status} still holds a reserved usage log")
    if row.credits_actual is not None:
        cost = None if status == "reserved" else (
            (facts.get(_COMMIT).total if status == "committed" else 0) + facts.get(_R_COMMIT).total)
        if cost != row.credits_actual:
            a.report("credits_actual_mismatch", user, job_id,
                     f"credits_actual {row.credits_actual} != ledger {cost}")
    if row.status in IN_FLIGHT:
        late = _past_horizon(a, row)
        if late is not None:
            a.report("in_flight_past_horizon", user, job_id, late)


def _past_horizon(a: _Audit, row: Any) -> str | None:
    """Why an in-flight job is past its kind's exhaustion horizon, or None (module docstring)."""
    kind = get_kind(row.provider_kind)
    if kind is None or row.submission_state == Submission.UNCERTAIN \
            or kind.name in (a.settings.observe_only_kinds or ()):
        return None
    scaled = a.settings.scaled
    start = row.provider_call_started_at or row.started_at or row.created_at
    base = start + scaled(kind.stale_threshold)
    if kind.sync:
        deadline = base
    else:
        last = row.reconcile_last_attempt_at
        if last is None and row.poll_lease_expires_at is not None:
            last = row.poll_lease_expires_at  # adopted or resumed: attempts start over
        if last is not None:
            base = max(base, last)
        # attempts beyond MAX_ATTEMPTS (hole 2: 39 of 18) move the deadline back, not forward
        deadline = base + scaled(ATTEMPT_SPACING) * (MAX_ATTEMPTS - (row.reconcile_attempts or 0))
    slack = a.grace + scaled(timedelta(seconds=a.settings.sweep_interval))
    if a.now <= deadline + slack:
        return None
    return (f"{kind.name} job {row.status} ({row.submission_state}), attempts "
            f"{row.reconcile_attempts}/{MAX_ATTEMPTS}, exhausted by {deadline.isoformat()}")
