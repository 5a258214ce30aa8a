"""Internal: The ledger seam: how the lifecycle, the sweep, cancel and the CLI reach credits.

The library never touches balances except through a :class:`Ledger`. The default,
:class:`BuiltinLedger`, is the library's own ledger (``reconcile.credits``: balances per pool,
FIFO lots, deterministic transactions). A platform that keeps its own balance table plugs in its
own implementation (``Runtime(ledger=...)``); ``reconcile.testing.platform_ledger`` is a tested
example over a ``user_credits(user_id, sub, topup)`` table.

Contract (every backend; ``tests/integration/test_ledger_contract.py`` checks it):

* **The caller's transaction.** Every operation runs in the ``session`` it is given and never
  commits, rolls back or opens a transaction of its own, so submit (insert + reserve) and
  finalize (complete + commit + assets + event) stay single transactions (README, Design notes:
  Completion). An operation may use a SAVEPOINT.
* **Idempotent on deterministic ids.** The job id names the reservation (``job-usage:{job}``),
  its commit (``job-commit:{job}``) and its refund (``job-refund:{job}``): reserving a job again
  returns the first reservation; a second commit or refund changes nothing and returns False.
* **A CAS on the usage log.** ``commit`` and ``refund`` move the job's ``usage_logs`` row from
  ``reserved`` (to ``committed`` / ``refunded``) by a compare-and-set; False means nothing was
  reserved any more (already settled, or never reserved), never an error.
* **A commit for less never exceeds what is held.** ``commit(amount)`` with ``amount`` above what
  the reservation still holds raises; the rest of a commit for less goes back to the user.
* **Legacy partial refunds count.** A refund ``p`` the platform made before the library on a log
  still ``reserved`` for ``a`` shrinks what it holds to ``a − p``: a later refund returns
  ``a − p``, a later commit commits at most ``a − p``.
* **Pools one by one.** What goes back (a release, a refund) returns to the pools the reservation
  took it from, each pool getting exactly its own unsettled remainder.
* **An error raises and leaves nothing written** (the operation's own writes are undone, the
  caller's are untouched): e.g. :class:`~reconcile.errors.InsufficientCredits` from ``reserve``,
  :class:`~reconcile.errors.LedgerError` from an over-commit.
* **Lock order: the balance, then the log.** An operation that moves credits locks the user's
  balance row first and only then the usage log, so concurrent settlements never deadlock.

Optional: ``commit_settled(session, job_id, amount=None, *, now=None) -> int | None``, a commit
that returns what the job finally cost (what :meth:`Ledger.settled_amount` would say), so
finalize needs no read after the commit; :func:`commit_settled` calls it when a ledger has it and
``commit`` then ``settled_amount`` otherwise (a ``commit`` returning a bool keeps working).

Optional: ``records_settlement = True``, for a ledger whose ``commit``/``commit_settled`` take
``record=`` (:attr:`reconcile.settlement.Decision.record`: a failed/cancelled job's partial
refund) and write it with the commit's CAS; :func:`commit_settled` hands the record only to such
a ledger. The built-in one does (``usage_logs.metadata["settlement"]``), so its audit accepts
commits settled under an earlier settlement policy.

The job-level audit checks (a terminal job still holding a reservation; a job completed after the
library refunded it) are the library's, for every backend: :func:`audit` adds them to the
backend's own :meth:`Ledger.audit`.
"""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Mapping
from contextlib import nullcontext
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, runtime_checkable

from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from . import credits
from .credits import Discrepancy, Reservation
from .db.models import COMPLETED_AFTER_FAILURE, CreditAnomaly, Job, UsageLog
from .settlement import DEFAULT_POLICY

TERMINAL = ("completed", "failed", "cancelled")
COMPLETED_AFTER_REFUND = "completed_after_refund"


@runtime_checkable
class Ledger(Protocol):
    """Reserve → commit (possibly for less) or refund; see the module docstring's contract."""

    name: str

    def reserve(self, session: Session, user_id: uuid.UUID, job_id: uuid.UUID, amount: int, *,
                now: datetime | None = None) -> Reservation:
        """Hold ``amount`` credits for ``job_id``; raises InsufficientCredits (nothing written)."""
        ...

    def commit(self, session: Session, job_id: uuid.UUID, amount: int | None = None, *,
               now: datetime | None = None) -> bool:
        """Charge ``amount`` (default: all held) of the reservation, release the rest."""
        ...

    def refund(self, session: Session, job_id: uuid.UUID, *, now: datetime | None = None) -> bool:
        """Give back what the reservation still holds (net of legacy refunds)."""
        ...

    def settled_amount(self, session: Session, job_id: uuid.UUID) -> int | None:
        """What the job finally cost: the committed amount, 0 when refunded or never reserved,
        None while still reserved."""
        ...

    def refunded(self, session: Session, job_id: uuid.UUID) -> int:
        """What the library's own settlement of ``job_id`` gave back and the user still keeps:
        its refund, or the rest a commit for less released (a partial refund: what was held
        minus what was kept). 0: none, or taken back by an operator's re-charge. The one
        answer to "what went back to the user": the CLI, the snapshot and the late-completion
        checks read it."""
        ...

    def audit(self, session: Session, *, now: datetime | None = None,
              grace: timedelta = timedelta(minutes=10), **options: Any) -> list[Discrepancy]:
        """The backend's own consistency checks (empty: clean); ``options`` are the backend's
        own (the built-in audit's ``settings``, ``since``, ``policy``). A backend that runs the
        job checks itself (``includes_job_checks``) is also given ``policy``, the settlement
        policy failed and cancelled jobs were settled under, whenever it is not the default."""
        ...


class BuiltinLedger:
    """The library's ledger (``reconcile.credits``). An error leaves nothing of an operation
    written: on PostgreSQL every operation raises before its first write (its writes are one
    statement), so it needs no SAVEPOINT; elsewhere (SQLite) each runs inside one."""

    name = "builtin"
    # credits.audit already runs the job-level checks (reconcile.audit)
    includes_job_checks = True
    # commit takes ``record=`` (a failed/cancelled job's partial refund, recorded with the CAS)
    records_settlement = True

    @staticmethod
    def _guard(session: Session) -> Any:
        if session.get_bind().dialect.name == "postgresql":
            return nullcontext()
        return session.begin_nested()

    def reserve(self, session: Session, user_id: uuid.UUID, job_id: uuid.UUID, amount: int, *,
                now: datetime | None = None) -> Reservation:
        with self._guard(session):
            return credits.reserve(session, user_id, job_id, amount, now=now)

    def commit(self, session: Session, job_id: uuid.UUID, amount: int | None = None, *,
               now: datetime | None = None, record: Mapping[str, str] | None = None) -> bool:
        with self._guard(session):
            return credits.commit(session, job_id, amount, now=now, record=record)

    def commit_settled(self, session: Session, job_id: uuid.UUID, amount: int | None = None, *,
                       now: datetime | None = None,
                       record: Mapping[str, str] | None = None) -> int | None:
        """:meth:`commit`, then :meth:`settled_amount` — without a re-read when the commit
        settled the job (the optional method :func:`commit_settled` looks for)."""
        session.info.pop(credits.SETTLED_KEY, None)
        with self._guard(session):
            done = credits.commit(session, job_id, amount, now=now, record=record)
        settled = session.info.pop(credits.SETTLED_KEY, None)
        if done and settled is not None and settled[0] == job_id:
            return settled[1]  # type: ignore[no-any-return]
        return self.settled_amount(session, job_id)

    def refund(self, session: Session, job_id: uuid.UUID, *, now: datetime | None = None) -> bool:
        with self._guard(session):
            return credits.refund(session, job_id, now=now)

    def settled_amount(self, session: Session, job_id: uuid.UUID) -> int | None:
        return credits.settled_amount(session, job_id)

    def refunded(self, session: Session, job_id: uuid.UUID) -> int:
        # the REFUND, or the RELEASE of a commit for less, net of a re-charge: the ledger's rule
        return credits.returned(session, job_id)

    def audit(self, session: Session, *, now: datetime | None = None,
              grace: timedelta = timedelta(minutes=10), **options: Any) -> list[Discrepancy]:
        return credits.audit(session, now=now, grace=grace, **options)


DEFAULT = BuiltinLedger()


def commits_inline(ledger: Ledger) -> bool:
    """Whether a completion may run this ledger's commit inside its own statement
    (``reconcile.lifecycle.completion``): the built-in ledger, whose ``commit`` and
    ``commit_settled`` nothing has replaced (a replaced one is called as it is): not a
    subclass, not an attribute set on the instance (a wrapper), not a test double that only
    passes ``isinstance`` (read as the ledger's own bound methods, never its class's)."""
    if not isinstance(ledger, BuiltinLedger):
        return False
    return all(getattr(getattr(ledger, name, None), "__func__", None) is getattr(BuiltinLedger, name)
               for name in ("commit", "commit_settled"))


def commit_settled(ledger: Ledger, session: Session, job_id: uuid.UUID,
                   amount: int | None = None, *, now: datetime | None = None,
                   record: Mapping[str, str] | None = None) -> int | None:
    """Commit the job's reservation (:meth:`Ledger.commit`) and return what the job finally
    cost (:meth:`Ledger.settled_amount`).

    A ledger may offer both in one call, an optional method ``commit_settled(session, job_id,
    amount, *, now)`` returning the settled amount (the built-in one does: no re-read after its
    commit); any other ledger — ``commit`` returning a bool — gets ``commit`` then
    ``settled_amount``, as before.

    ``record`` (:attr:`reconcile.settlement.Decision.record`) goes only to a ledger that says
    it records settlements (``records_settlement = True``: the built-in one, which writes it
    with the commit's own CAS); any other ledger never sees it."""
    method = getattr(ledger, "commit_settled", None)
    target = method if callable(method) else ledger.commit
    extra: dict[str, Any] = {}
    if record is not None and getattr(ledger, "records_settlement", False) \
            and _takes_record(target):  # a subclass may override commit without record=
        extra["record"] = record
    if callable(method):
        return method(session, job_id, amount, now=now, **extra)  # type: ignore[no-any-return]
    ledger.commit(session, job_id, amount, now=now, **extra)
    return ledger.settled_amount(session, job_id)


def _takes_record(method: Any) -> bool:
    try:
        params = inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False
    return "record" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def audit(ledger: Ledger, session: Session, *, now: datetime | None = None,
          grace: timedelta = timedelta(minutes=10), **options: Any) -> list[Discrepancy]:
    """The backend's audit plus the library's job-level checks (each finding once; the
    built-in audit runs them itself)."""
    now = now or datetime.now(UTC)
    policy = options.pop("policy", None)
    if getattr(ledger, "includes_job_checks", False):
        # its job checks judge a failed/cancelled job's commit by the settlement policy (passed
        # only when it is not the default: a backend written before the policy never sees it)
        if policy is not None and policy != DEFAULT_POLICY:
            options["policy"] = policy
        return list(ledger.audit(session, now=now, grace=grace, **options))
    found = list(ledger.audit(session, now=now, grace=grace, **options))
    seen = {(d.kind, d.job_id) for d in found}
    for extra in job_checks(ledger, session, now=now, grace=grace):
        if (extra.kind, extra.job_id) not in seen:
            found.append(extra)
            seen.add((extra.kind, extra.job_id))
    return found


def job_checks(ledger: Ledger, session: Session, *, now: datetime,
               grace: timedelta) -> list[Discrepancy]:
    """Checks on jobs, whatever the backend: no terminal job holds a ``reserved`` usage log
    past ``grace``; no job is ``completed`` while holding what the library's settlement
    returned (a refund, or a partial one)."""
    found: list[Discrepancy] = []
    stuck = session.execute(
        select(Job.id, Job.user_id, Job.status).join(UsageLog, UsageLog.job_id == Job.id).where(
            Job.status.in_(TERMINAL), UsageLog.status == "reserved",
            func.coalesce(Job.completed_at, Job.created_at) < now - grace))
    for job_id, user_id, status in stuck:
        found.append(Discrepancy("terminal_job_reserved", user_id, job_id,
                                 f"job {status} still holds a reserved usage log"))
    for job_id, user_id in completed_after_failure(session):
        refunded = ledger.refunded(session, job_id)
        if refunded > 0:
            found.append(Discrepancy(COMPLETED_AFTER_REFUND, user_id, job_id,
                                     f"completed with its output after the library's "
                                     f"settlement returned {refunded} credits"))
    return found


def completed_after_failure(session: Session, *, after: datetime | None = None,
                            limit: int | None = None) -> list[tuple[uuid.UUID, uuid.UUID]]:
    """(job id, user id) of completed jobs that still carry the library's failure code: the
    library clears ``error_code`` when it completes a job itself, so these were completed by
    someone else after it failed them (``jobs_completed_after_failure_idx``, partial)."""
    # the literal predicate, so PostgreSQL matches the partial index even under generic plans
    stmt = select(Job.id, Job.user_id).where(text(COMPLETED_AFTER_FAILURE))
    if after is not None:
        stmt = stmt.where(func.coalesce(Job.completed_at, Job.created_at) >= after)
    stmt = stmt.order_by(Job.completed_at, Job.id)
    if limit is not None:
        stmt = stmt.limit(limit)
    return [(j, u) for j, u in session.execute(stmt)]


def anomaly_recorded(session: Session, job_id: uuid.UUID, kind: str) -> bool:
    return session.execute(select(CreditAnomaly.id).where(
        CreditAnomaly.job_id == job_id, CreditAnomaly.kind == kind).limit(1)).first() is not None


class _CarriesLedger(Protocol):
    """A :class:`~reconcile.runtime.Runtime` as :func:`ledger_of` reads it (the runtime
    imports this module, so it is not imported back)."""

    @property
    def ledger(self) -> Ledger: ...


def ledger_of(rt: _CarriesLedger | None) -> Ledger:
    return rt.ledger if rt is not None else DEFAULT


__all__ = ["COMPLETED_AFTER_REFUND", "DEFAULT", "BuiltinLedger", "Ledger", "audit",
           "commit_settled", "completed_after_failure", "job_checks"]


from .core.facade import names_moved as _names_moved  # noqa: E402

_names_moved(__name__)
