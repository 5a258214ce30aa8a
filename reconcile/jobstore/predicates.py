"""Internal: the shared predicates over ``jobs``, the last error's code and the provider's status.

SQL expressions (in flight, settlement pending or due, a create claim gone, uncertain with its
claim gone), each with a Python twin where a caller decides on a loaded row; the last
error's code (the column, or the legacy text's prefix) with the values that write it; and the
provider's status as ``jobs.provider_status`` stores it (:func:`stored_status`). No writes
here: the writers are the sibling modules.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import and_, case, literal, or_, text

from ..core.limits import storable
from ..db import models
from ..db.models import Job
from ..states import UNKNOWN_OUTCOME, Status, Submission

# Literal text where a partial index must match it (migrations 0019/0020 and models.Job): the
# sweep's keyset walk reads through jobs_inflight_keyset_idx and
# jobs_unsettled_idx, and PostgreSQL matches a partial index only on the predicate's own text
# under generic plans.
_IN_FLIGHT_SQL = text("jobs.status IN ('pending', 'processing')")


_UNSETTLED_SQL = text("jobs.status IN ('failed', 'cancelled')")


_SETTLED_STATES = (Status.FAILED, Status.CANCELLED)

# jobs_uncertain_idx's predicate (migration 0025, models.UNKNOWN_OUTCOME_IN_FLIGHT), literal
_UNKNOWN_OUTCOME_SQL = text("jobs.submission_state IN ('submitting', 'uncertain')")


def in_flight() -> Any:
    """SQL: the job is pending or processing (the in-flight partial indexes' predicate)."""
    return _IN_FLIGHT_SQL


def unknown_outcome_in_flight() -> Any:
    """SQL: in flight with a submission whose outcome may be unknown (``submitting`` or
    ``uncertain``), as the literal text of ``jobs_uncertain_idx``'s predicate; narrow it with
    :func:`uncertain_expired` (a live claim is a create in progress, not unknown)."""
    return and_(_IN_FLIGHT_SQL, _UNKNOWN_OUTCOME_SQL)


def settlement_pending() -> Any:
    """SQL: a failed/cancelled job the library failed whose refund has not settled
    (``credits_actual`` NULL, ``next_poll_at`` set — never a platform's old row)."""
    return and_(_UNSETTLED_SQL, Job.credits_actual.is_(None), Job.next_poll_at.is_not(None))


def settlement_due(cutoff: datetime) -> Any:
    """SQL: :func:`settlement_pending` with its retry time reached by ``cutoff``."""
    return and_(settlement_pending(), Job.next_poll_at <= cutoff)


def must_settle(job: Job) -> bool:
    """Whether the library must settle this row: a failed/cancelled job whose failure the library
    persisted (``mark_failed`` writes ``next_poll_at`` with the status; only the settlement
    clears it, with ``credits_actual``). A platform's own failed row — never failed by the
    library: a legacy row, a platform worker's failure — has none, and its refund is the
    platform's (README, Design notes: Refunds need evidence). ``lifecycle.settle`` checks it
    first, so every caller (the sweep, the ``reconcile.settle`` task, a snapshot read, cancel,
    the CLI) gets the guard; :func:`settlement_pending` is its SQL twin."""
    return job.status in _SETTLED_STATES and job.next_poll_at is not None


def is_settlement_pending(job: Job) -> bool:
    """:func:`settlement_pending` on a loaded row: :func:`must_settle`, not settled yet."""
    return must_settle(job) and job.credits_actual is None


def is_settlement_due(job: Job, cutoff: datetime) -> bool:
    """:func:`settlement_due` on a loaded row."""
    return is_settlement_pending(job) and job.next_poll_at is not None \
        and job.next_poll_at <= cutoff


def platform_row_uncalled() -> Any:
    """SQL: a platform row (no ``submission_state``) with no trace of a provider call — no call
    start, no upstream id. The one claim on a platform row's call: ``sync_call`` takes it (a
    second call, a client's retry while the first runs, finds it gone: 409, as a library sync
    job's taken claim) and a user cancel needs it, so a call and a cancel never both win."""
    return and_(Job.submission_state.is_(None), Job.provider_call_started_at.is_(None),
                Job.provider_task_id.is_(None))


def claim_expired(now: datetime) -> Any:
    """SQL: no live create claim (none, or its lease ended before ``now``)."""
    return or_(Job.claim_expires_at.is_(None), Job.claim_expires_at < now)


def uncertain_expired(now: datetime) -> Any:
    """SQL: a submission whose outcome is unknown: ``uncertain``, or ``submitting`` with its
    claim gone (nobody is creating it now). Evidence adopts it; an operator resolves it."""
    return or_(Job.submission_state == Submission.UNCERTAIN,
               and_(Job.submission_state == Submission.SUBMITTING, claim_expired(now)))


def is_outcome_unknown(submission_state: str | None, *, call_started: bool,
                       task_id: str | None) -> bool:
    """The provider may have been called and nothing says yet what it did: a create in progress
    or lost (``submitting``, ``uncertain``), or a platform row whose provider call started
    (``provider_call_started_at``: ``sync_call``'s marker, or the platform's own) with no
    upstream id and no result yet. A cancel answers 409 for it and ``reconcile fail`` refuses
    it (``reconcile resolve`` is the operator's way); :func:`outcome_known` is its SQL twin."""
    if submission_state is None:
        return call_started and not task_id
    return submission_state in UNKNOWN_OUTCOME



def outcome_known() -> Any:
    """SQL: not :func:`is_outcome_unknown` (the guard of a failure that must not race a
    submission: NULL-safe, a platform row included)."""
    return or_(and_(Job.submission_state.is_not(None), Job.submission_state.not_in(UNKNOWN_OUTCOME)),
               and_(Job.submission_state.is_(None),
                    or_(Job.provider_call_started_at.is_(None), Job.provider_task_id.is_not(None))))


# ``reconcile_last_error`` is the text, ``reconcile_last_error_code`` its code (migration 0021):
# an ``UPSTREAM_…`` code is an upstream verdict (not found, expired media…), which an error that
# is no verdict (a failed read, a raising step) never overwrites.


def legacy_error_code(last_error: str | None) -> str | None:
    """The one fallback for rows written before migration 0021 (code NULL, text set): the code
    the text starts with, as the library wrote it then (``UPSTREAM_…: message`` or
    ``INTERNAL: …``); None for any other text. Never used when the column is set."""
    if last_error and last_error.startswith(("UPSTREAM_", "INTERNAL:")):
        return last_error.split(":", 1)[0]
    return None


def last_error_code(job: Job) -> str | None:
    """The code of the job's last error: the column, else (a legacy row) :func:`legacy_error_code`."""
    if job.reconcile_last_error_code is not None:
        return job.reconcile_last_error_code
    return legacy_error_code(job.reconcile_last_error)


def is_verdict(code: str | None) -> bool:
    """An upstream verdict's code (``UPSTREAM_…``)."""
    return code is not None and code.startswith("UPSTREAM_")


def _verdict_sql() -> Any:
    """SQL: the row's last error is an upstream verdict (:func:`is_verdict` of
    :func:`last_error_code`, the legacy text included)."""
    return or_(Job.reconcile_last_error_code.like("UPSTREAM\\_%", escape="\\"),
               and_(Job.reconcile_last_error_code.is_(None),
                    Job.reconcile_last_error.like("UPSTREAM\\_%", escape="\\")))


def _last_error(last_error: str | None, code: str | None, verdict: bool) -> dict[str, Any]:
    """The values writing a last error (text and code): ``verdict=False`` keeps the row's own
    when it is an upstream verdict."""
    if verdict:
        return {"reconcile_last_error": last_error, "reconcile_last_error_code": code}
    keep = _verdict_sql()
    return {"reconcile_last_error": case((keep, Job.reconcile_last_error),
                                         else_=literal(last_error)),
            "reconcile_last_error_code": case((keep, Job.reconcile_last_error_code),
                                              else_=literal(code))}


# ``provider_status`` (migration 0028): the provider's raw status token at the latest read of a
# job in flight. A provider's answer is not trusted to be short or storable: it is bounded here,
# once, before any writer stores it or a poll message carries it to the next turn.

#: the most characters ``jobs.provider_status`` stores (a longer status keeps its first ones;
#: its home is the column's mapping, which the table contract reads)
PROVIDER_STATUS_MAX = models.PROVIDER_STATUS_MAX


def stored_status(raw: object) -> str | None:
    """The value ``jobs.provider_status`` stores for a read's raw status (``PollResult.raw_status``
    as the adapter returned it): its text cut to :data:`PROVIDER_STATUS_MAX` characters, each
    NUL and unpaired surrogate as U+FFFD (``core.limits.storable``, as every provider text the
    library keeps). None: nothing to store (no status, or one whose text cannot be made), and
    the row keeps the status it has. Never raises: an odd status never fails the write
    carrying it (README, The provider's last status)."""
    if raw is None:
        return None
    try:  # a plain str: a subclass's own slicing or text is the adapter's, not trusted
        text = str.__str__(raw) if isinstance(raw, str) else str.__str__(str(raw))
        return storable(text[:PROVIDER_STATUS_MAX])
    except Exception:  # a status object whose text cannot be made: nothing stored
        return None
