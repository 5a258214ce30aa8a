"""Internal: Settlement policy: what a finished job commits and what goes back to the user.

Pure (no database, no session): :func:`decide` takes plain values — how the job ended, what its
reservation holds when the caller knows it, what the pricing hook priced it at — and a
:class:`SettlementPolicy`, and returns a frozen :class:`Decision`. The ledger only executes a
decision (:mod:`reconcile.ledger`: its CAS, idempotent ids and pool bookkeeping are unchanged);
``lifecycle.finalize`` and ``lifecycle.settle`` are the two callers.

The rules (the library's behaviour; the default policy):

* **completed, no price** (no pricing hook, or it returned None): commit everything the
  reservation still holds (``commit=None``), refund nothing.
* **completed, priced** ``n`` (a whole number of credits ≥ 0, 0 included): commit ``n``; the
  rest of the reservation goes back to its pools (the ledger's commit for less).
* **priced above what is held**: never clamped. The ledger refuses the commit
  (``LedgerError`` reason ``commit_exceeds_held``), the completion transaction rolls back and
  the attempt counts (the job retries and fails, refunded, at its exhaustion horizon). When the
  caller passes ``reserved``, :func:`decide` raises that refusal itself.
* **priced with a value that is not credits** (a bool, a float, a Decimal, a negative number):
  the ledger refuses it as above (the completion's CAS writes ``credits_actual`` first, so a
  value PostgreSQL cannot store fails there); :func:`decide` passes it through, with the note
  ``not_whole_credits``, so the refusal and its message stay the ledger's.
* **failed** and **cancelled**: give back :func:`refund_share` of what the reservation holds
  — the one rule, from the job's :class:`Cause` and whether the provider ever accepted it
  (:func:`settlement_cause` derives both from the row): everything for a job never accepted,
  whatever the policy; otherwise ``cancel_refund`` for the user's cancel and ``failure_refund``
  for every other cause — all of it by default (``Fraction(1)``), executed as the ledger's
  ``refund``. A smaller share is executed as a commit for the kept part (the ledger releases
  the rest); a half credit goes to the user (the kept part rounds down).

The policy is deployment configuration, read from the environment by
:class:`~reconcile.settings.Settings` (``RECONCILE_FAILURE_REFUND=1/2``,
``RECONCILE_CANCEL_REFUND=1``: exact fractions or decimals, checked by
:class:`SettlementPolicy` itself) and taken by every ``Runtime`` from its settings
(``Settings.settlement_policy``); a ``Runtime`` given or assigned a different one raises
``ValueError``, so the worker, beat, the gateway, the ``reconcile`` command and the audit
settle and check alike. A share other than 1 needs the reserved amount, so
``lifecycle.settle`` reads the job's reserved usage log once more for such a share — under its
user's balance lock, so that a legacy refund imported meanwhile is counted (the default path
reads nothing extra).

**The record.** A failed or cancelled job whose policy keeps a part (a share below 1, 0
included) is settled by a commit that carries :attr:`Decision.record`; the built-in ledger
writes it into the job's usage log, ``metadata["settlement"] = {"status": "cancelled",
"refund_share": "1/2", "kept": 20}`` (``refund_share`` the exact fraction refunded, always
``"n/d"`` in lowest terms; ``kept`` the amount committed), by the same statement as the commit's
CAS — so the record exists exactly when the commit does, in the settlement's transaction (a
crash leaves both or neither). A full refund records nothing (it is the ledger's refund). A
ledger other than the built-in one is never handed the record (``records_settlement``), and a
usage log whose metadata is not a JSON object (a platform's own value) is left as it is. The
key is the ledger's: the built-in commit without a record (a completion, a platform's own commit,
a subclass whose ``commit_settled`` takes no ``record=``) drops a ``"settlement"`` key the log
already carried (a platform's own, a copy of another job's metadata, a forgery written before
the settlement), so a committed log's record is always the one its own commit wrote. The merge
and the drop are SQL (``jsonb ||`` / ``json_set``): the rest of the metadata is never decoded
and re-encoded, so a platform's numbers stay exactly as written.

**The audit.** It checks with the deployment's policy (``settings.settlement_policy``; an
explicit ``credits.audit(..., policy=...)`` must agree with the settings given).
``failed_job_committed`` accepts the commit of a failed or cancelled job when either

* it is what the rule keeps of what the reservation held (USAGE net of legacy refunds):
  ``held − ⌈held × share⌉`` with the share :func:`refund_share` gives the job's
  (cause, accepted) under that policy — the audit selects the candidate rows in SQL and calls
  :func:`settlement_cause` and :func:`refund_share` for each, never a copy of the rule (never,
  under a share of 1: any commit is a finding) — the rule for jobs settled before the record
  existed; or
* its (one) committed usage log carries a record whose ``refund_share`` is ``n/d`` (digits,
  ``0 ≤ n ≤ d``, ``d ≥ 1``) and whose ``kept`` equals the commit, **and** the audit's own
  recomputation ``⌊held × (d − n) / d⌋`` — the same rounding as :func:`decide` (the kept part
  rounds down) — equals the commit, in exact integer/numeric SQL.

Anything else is flagged: a commit with no record that the given policy does not keep, a
record whose kept amount or share does not produce the commit, a malformed record (a float, a
boolean, a share above 1, a zero denominator, a leading zero, a numerator or denominator of more
than 18 digits — 9 on SQLite, whose integers are 64-bit — or more than one committed log).
So a policy change no longer flags the jobs settled under the earlier one, while a record
cannot make an arbitrary commit pass: its arithmetic must agree with the ledger. The record's
``status`` is informative only (the library itself relabels a failure the user had cancelled).
A record is evidence written by the library, not a signature: whoever can rewrite usage logs
after the commit can write a self-consistent one, as they can rewrite the log's status.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import StrEnum
from fractions import Fraction
from typing import Any

from .errors import LedgerError


class Finished(StrEnum):
    """How the job ended (the terminal statuses)."""

    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


# the largest denominator a policy share may have (9 digits): the audit recomputes a recorded
# share in 64-bit integers on SQLite, where (h mod d) × n < d² must fit (reconcile.audit._jobs;
# the policy's own share is applied in Python); a realistic share is 1/2, 1/3, 3/10
MAX_SHARE_DENOMINATOR = 999_999_999


@dataclass(frozen=True)
class SettlementPolicy:
    """The shares of what a reservation holds that go back on failure and on a user's cancel
    (``Fraction(1)``: everything, the default; ``Fraction(0)``: nothing). Exact fractions, never
    floats."""

    failure_refund: Fraction = Fraction(1)
    cancel_refund: Fraction = Fraction(1)

    def __post_init__(self) -> None:
        for name in ("failure_refund", "cancel_refund"):
            given = getattr(self, name)
            if isinstance(given, bool) or not isinstance(given, (int, Fraction)):
                raise ValueError(f"{name} must be a Fraction between 0 and 1, not {given!r}")
            # checked as the plain Fraction that is stored (an int or Fraction subclass may
            # compare as one value and convert to another)
            share = Fraction(given.numerator, given.denominator)
            if not 0 <= share <= 1:
                raise ValueError(f"{name} must be a Fraction between 0 and 1, not {given!r}")
            if share.denominator > MAX_SHARE_DENOMINATOR:
                raise ValueError(f"{name} {share} has a denominator above "
                                 f"{MAX_SHARE_DENOMINATOR:,}: the audit recomputes a recorded "
                                 "share exactly in 64-bit integers on SQLite; use a coarser "
                                 "fraction")
            object.__setattr__(self, name, share)

    def checked(self) -> SettlementPolicy:
        """This policy, its shares checked again as the constructor checks them (a share set
        past construction — ``object.__setattr__``, an unpickled copy, a subclass skipping
        ``__post_init__`` — raises ``ValueError``): a plain :class:`SettlementPolicy`."""
        return SettlementPolicy(**{f.name: getattr(self, f.name) for f in fields(SettlementPolicy)})


DEFAULT_POLICY = SettlementPolicy()


class Cause(StrEnum):
    """Why a job ended failed or cancelled: the first input of :func:`refund_share`."""

    USER_CANCEL = "user_cancel"  # the user's cancel, whichever reader wrote the terminal state
    UPSTREAM_FAILURE = "upstream_failure"  # the provider reported the task failed (or no output)
    REJECTED_CREATE = "rejected_create"  # the provider refused the create (or nothing was sent)
    NOT_SUBMITTED = "not_submitted"  # an operator established nothing was created upstream
    EXHAUSTION = "exhaustion"  # attempts spent, or the sweep found the row past its horizon
    OPERATOR_FAIL = "operator_fail"  # ``reconcile fail``
    SYNC_FAILURE = "sync_failure"  # a sync call that failed


# causes that by definition never reached an accepted task
NEVER_ACCEPTED = frozenset({Cause.REJECTED_CREATE, Cause.NOT_SUBMITTED})


class Path(StrEnum):
    """How the job reached its provider; "accepted" is read per path (:func:`settlement_cause`)."""

    ASYNC = "async"  # a library job of an async kind: accepted = a task id saved or adopted
    SYNC = "sync"  # a library job of a sync kind: accepted = the provider answered (2xx)
    PLATFORM = "platform"  # a row the library did not submit: the platform's own task id


def refund_share(cause: Cause | str, accepted: bool, policy: SettlementPolicy) -> Fraction:
    """THE rule for the share of what a failed or cancelled job's reservation holds that goes
    back to the user: everything for a job the provider never accepted, whatever the policy
    (only a confirmed rejection permits compensation, and it is complete); otherwise the
    policy's ``cancel_refund`` for the user's cancel and its ``failure_refund`` for every other
    cause. Settlement, the audit and the reports all call this; nothing else decides a share."""
    cause = Cause(cause)
    if not accepted or cause in NEVER_ACCEPTED:
        return Fraction(1)
    return policy.cancel_refund if cause is Cause.USER_CANCEL else policy.failure_refund


# the code a status read (the poll chain, a webhook, the sweep) writes for a task the provider
# reports failed — among them our own upstream cancel read back as ``canceled``: the one failure
# that a recorded cancel request makes the user's cancel (and that the cancel relabels,
# ``jobstore.cancelled_over_failure``). Any other failure written after the request (an
# operator's ``reconcile fail``, an exhaustion) stays what it is, as the cancel then answers 409
CANCEL_READ_CODE = "UPSTREAM_FAILED"

# a sync call's failures written only after the provider answered it with a result (the row
# records no status code: the block returned, so the call got its 2xx, then the answer was
# unusable); every other failure of a sync call is read as never accepted
_SYNC_ANSWERED = frozenset({"UPSTREAM_EMPTY_RESULT", "UPSTREAM_OUTPUT_LIMIT",
                            "UPSTREAM_MEDIA_EXPIRED"})


def path_of(row: Any, kind: Any) -> Path:
    """A job row's :class:`Path`: a platform row has no ``submission_state``; a library row is
    sync when its kind is (``kind``: the row's registered kind, None when unknown — read as
    async: its acceptance is its task id)."""
    if getattr(row, "submission_state", None) is None:
        return Path.PLATFORM
    return Path.SYNC if kind is not None and kind.sync else Path.ASYNC


def settlement_cause(row: Any, *, kind: Any, cancel_requested: bool = False) -> tuple[Cause, bool]:
    """THE derivation of a failed/cancelled job's (cause, accepted) from its row (``status``,
    ``error_code``, ``error_detail``, ``submission_state``, ``provider_task_id``), its
    registered ``kind`` (``kinds.get_kind(row.provider_kind)``, None when unknown) and whether
    the user asked to cancel it before its terminal state was written (``cancel_requested``:
    its ``cancel_requested`` event, :func:`reconcile.jobstore.events.cancel_requested`); a
    request makes a failed row the user's cancel only when a status read failed it
    (:data:`CANCEL_READ_CODE`: the read of our own upstream cancel), never an operator's fail
    or an exhaustion written meanwhile (the cancel answers 409 for those).

    Accepted, per :class:`Path`: an async job has a task id (saved or adopted); a sync job's
    failure was written after the provider answered (the row records no status code; a failure
    of the call itself — a provider error, a raising block, a crash the sweep fails — reads as
    never accepted, the user's side of the doubt); a platform row has the platform's own task
    id, and is never accepted without one. A ``rejected`` submission was never accepted."""
    from .states import Status, Submission

    detail = row.error_detail if isinstance(getattr(row, "error_detail", None), dict) else {}
    code = getattr(row, "error_code", None)
    state = getattr(row, "submission_state", None)
    path = path_of(row, kind)
    if row.status == Status.CANCELLED or (cancel_requested and code == CANCEL_READ_CODE):
        cause = Cause.USER_CANCEL
    elif detail.get("resolved") == "not_submitted":
        cause = Cause.NOT_SUBMITTED
    elif detail.get("by") == "operator":
        cause = Cause.OPERATOR_FAIL
    elif path is Path.SYNC:
        cause = Cause.SYNC_FAILURE
    elif state == Submission.REJECTED:
        cause = Cause.REJECTED_CREATE
    elif detail.get("via") == "sweep" or "attempts" in detail:
        cause = Cause.EXHAUSTION
    else:
        cause = Cause.UPSTREAM_FAILURE
    if state == Submission.REJECTED:
        accepted = False
    elif path is Path.SYNC:
        accepted = code in _SYNC_ANSWERED
    else:
        accepted = bool(getattr(row, "provider_task_id", None))
    return cause, accepted


# the job event the user's cancel writes, while the job is still in flight, before it asks the
# provider to cancel: whichever reader then writes the terminal state, the job settles as a cancel
CANCEL_REQUESTED_EVENT = "cancel_requested"

# the key of a usage log's metadata under which the ledger records a partial refund's decision
RECORD_KEY = "settlement"


class SettleOutcome(StrEnum):
    """What ``lifecycle.settle`` did. Every member is a non-empty string, so never test one for
    truthiness: compare with ``is SettleOutcome.SETTLED``."""

    SETTLED = "settled"  # the ledger executed the decision and ``credits_actual`` is written
    ALREADY_SETTLED = "already_settled"  # ``credits_actual`` was written before: nothing done
    NOT_DUE = "not_due"  # no such job, or it is not failed/cancelled: nothing done
    BACKED_OFF = "backed_off"  # the ledger (or the database) raised: retry later, with backoff


@dataclass(frozen=True)
class Decision:
    """What to do with a finished job's reservation.

    ``commit``: credits charged — None means everything the reservation still holds (the caller
    did not know it). ``refund``: credits given back — None means whatever the commit leaves
    (unknown to the caller). ``full_refund``: execute as the ledger's ``refund`` (no commit).
    ``reason`` names the rule, ``notes`` what was unusual about the inputs.
    """

    commit: Any
    refund: int | None
    reason: str
    notes: tuple[str, ...] = ()
    # the refund share of a failed/cancelled job that keeps a part (None otherwise)
    share: Fraction | None = None

    @property
    def full_refund(self) -> bool:
        return self.reason in ("failed_refunded", "cancelled_refunded")

    @property
    def record(self) -> dict[str, str] | None:
        """What the ledger records with the commit of a failed/cancelled job that keeps a part
        (``usage_logs.metadata["settlement"]``, written by the settling statement itself, which
        adds ``kept``: the committed amount): how it ended and the share refunded as an exact
        ``"numerator/denominator"`` string. None for every other decision (nothing recorded)."""
        if self.share is None:
            return None
        return {"status": self.reason.removesuffix("_partly_refunded"),
                "refund_share": share_text(self.share)}


def whole_credits(value: Any) -> bool:
    """A whole, non-negative number of credits (what the ledger accepts to commit)."""
    return not isinstance(value, bool) and isinstance(value, int) and value >= 0


def decide(finished: Finished | str, *, reserved: int | None = None, priced: Any = None,
           policy: SettlementPolicy = DEFAULT_POLICY, cause: Cause | str | None = None,
           accepted: bool = True) -> Decision:
    """The settlement of a job that ended ``finished``; see the module docstring's rules.

    ``reserved``: what the reservation still holds, if the caller knows it (None: it does not;
    the ledger knows). ``priced``: the pricing hook's answer, completions only (None: no hook,
    or it priced nothing). ``cause`` / ``accepted`` (failed and cancelled jobs): what
    :func:`settlement_cause` derives from the row; the share is :func:`refund_share`'s (without
    a cause: the user's cancel for ``cancelled``, an upstream failure for ``failed``, accepted).
    Raises :class:`LedgerError` (``commit_exceeds_held``) for a price above a known
    ``reserved``, and ``ValueError`` for an unknown ``finished``.
    """
    finished = Finished(finished)
    if finished is Finished.COMPLETED:
        return _completed(reserved, priced)
    if cause is None:
        cause = Cause.USER_CANCEL if finished is Finished.CANCELLED else Cause.UPSTREAM_FAILURE
    share = refund_share(cause, accepted, policy)
    if share == 1:
        return Decision(0, reserved, f"{finished}_refunded")
    if reserved is None:
        raise ValueError(f"a refund of {share} of the reservation needs the reserved amount")
    kept = kept_of(reserved, share)
    return Decision(kept, reserved - kept, f"{finished}_partly_refunded",
                    (f"refund_share={share}",), share)


def kept_of(held: int, share: Fraction) -> int:
    """What a refund of ``share`` keeps of ``held`` credits: ``held − ⌈held × share⌉`` (the kept
    part rounds down; a half credit goes to the user). The audit recomputes a recorded share
    with this rule."""
    return held - _ceil(held * share)


def share_text(share: Fraction) -> str:
    """A refund share as the record stores it: ``"1/2"``, ``"0/1"`` (always both parts, in
    lowest terms)."""
    return f"{share.numerator}/{share.denominator}"


def _completed(reserved: int | None, priced: Any) -> Decision:
    if priced is None:
        return Decision(None, 0, "completed_all_held")
    if not whole_credits(priced):
        return Decision(priced, None, "completed_priced", ("not_whole_credits",))
    if reserved is None:
        return Decision(priced, None, "completed_priced")
    if priced > reserved:
        raise LedgerError(f"cannot commit {priced!r} of the {reserved} credits held",
                          reason="commit_exceeds_held")
    notes = ("priced_zero",) if priced == 0 else ()
    return Decision(priced, reserved - priced, "completed_priced", notes)


def _ceil(value: Fraction) -> int:
    return -((-value.numerator) // value.denominator)


__all__ = ["CANCEL_READ_CODE", "CANCEL_REQUESTED_EVENT", "DEFAULT_POLICY", "MAX_SHARE_DENOMINATOR", "NEVER_ACCEPTED",
           "RECORD_KEY", "Cause", "Decision", "Finished", "Path", "SettleOutcome",
           "SettlementPolicy", "decide", "kept_of", "path_of", "refund_share", "settlement_cause",
           "share_text", "whole_credits"]
