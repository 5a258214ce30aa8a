"""What a person may do to a job by hand, in one place: fail it, resolve an uncertain submission
(either way), retry a settlement the ledger refused, release a reservation whose job row is gone.

Every surface calls these functions — the ``reconcile`` CLI, the operator console, the Django
admin — so an action is refused or allowed exactly alike wherever it is asked for, and its
change always goes through the lifecycle's compare-and-set functions, never a second
implementation. Each action done is written to the operator record
(``reconcile_operator_actions``: who, through which surface, why, when), which customers never
read: the customer's event stream carries the job's own events, so it shows only the state
change.

:func:`refusal` says, without changing anything, why an action is refused for a job (None: it
is allowed now); :func:`run` does it or raises :class:`ActionRefused` (the job's state does not
allow it: the CLI's exit 2) or :class:`ActionLost` (the job changed meanwhile, or the ledger
refused again: exit 1).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from . import jobstore
from .db.models import Job, OperatorAction, table_of
from .runtime import Runtime
from .settlement import SettleOutcome
from .states import IN_FLIGHT, TERMINAL, UNKNOWN_OUTCOME, Status, Submission

log = logging.getLogger("reconcile.operator")

FAIL = "fail"
RESOLVE_UPSTREAM = "resolve_upstream"
RESOLVE_NOT_SUBMITTED = "resolve_not_submitted"
RETRY_SETTLE = "retry_settle"
RELEASE_ORPHAN = "release_orphan"
#: the surfaces an action comes through (the operator record's ``via``)
VIA = ("cli", "console", "django-admin")
REASON_MAX = 2000


class ActionRefused(Exception):
    """The job's state (or the request) does not allow the action; nothing was written."""


class ActionLost(Exception):
    """The job changed between the check and the change, or the ledger refused the settlement
    again; nothing was written by this action."""


@dataclass(frozen=True)
class Operator:
    """Who acts: an identity the platform vouches for, and the surface it acts through."""

    identity: str
    via: str = "cli"

    def __post_init__(self) -> None:
        if not isinstance(self.identity, str) or not self.identity.strip():
            raise ValueError("an operator needs an identity")
        if self.via not in VIA:
            raise ValueError(f"via must be one of {', '.join(VIA)}")


@dataclass(frozen=True)
class Done:
    """An action's result. ``changed`` False: there was nothing to do (a job already failed, an
    orphan already released): the action is answered, not refused, and nothing is recorded."""

    action: str
    job_id: uuid.UUID
    changed: bool
    message: str
    detail: dict[str, Any] = field(default_factory=dict)


Refusal = Callable[[Runtime, Session, uuid.UUID, "Job | None", "str | None", datetime], "str | None"]
Act = Callable[[Runtime, uuid.UUID, "str | None", str, Operator, "str | None"], Done]


@dataclass(frozen=True)
class Action:
    """One operator action, declared once: its rule (``refusal``: why it is refused now, None
    when allowed; it reads, never writes), its change (``act``, through the lifecycle), the
    anomaly kinds it answers (``resolves``), and ``command``: the ``reconcile`` command that runs
    it as ``reconcile <command> JOB_ID --reason …`` (None: the CLI writes its own command,
    as ``fail`` and ``resolve`` do). ``label`` is what the console and the Django admin show.
    ``needs_job``: refused for a job id with no row (False: an action on a job row that is
    gone, which a job's page never offers)."""

    name: str
    label: str
    refusal: Refusal
    act: Act
    resolves: frozenset[str] = frozenset()
    command: str | None = None
    needs_job: bool = True


def clean_reason(reason: str | None) -> str:
    """The reason as stored: stripped, at most :data:`REASON_MAX` characters. Refused when blank."""
    if not isinstance(reason, str) or not reason.strip():
        raise ActionRefused("give the reason for this action")
    from .core import redact

    return redact.text(reason.strip())[:REASON_MAX]


# ----------------------------------------------------------------------------- the rules


def refusal(rt: Runtime, action: str, job_id: uuid.UUID, *, upstream_id: str | None = None,
            now: datetime | None = None) -> str | None:
    """Why ``action`` is refused for the job now (None: allowed). Reads only; the same check
    :func:`run` makes first. For ``resolve_upstream`` without an ``upstream_id`` it answers
    whether an id could be adopted at all."""
    with rt.sessions() as session:
        job = session.get(Job, job_id)
        return _refusal(rt, session, action, job_id, job, upstream_id,
                        now if now is not None else rt.now())


def allowed(rt: Runtime, job_id: uuid.UUID) -> list[str]:
    """The actions :func:`refusal` allows for the job now and that would change something, in
    :data:`ACTIONS` order (failing a failed job is answered "nothing done", never offered)."""
    now = rt.now()
    with rt.sessions() as session:
        job = session.get(Job, job_id)
        return [a for a in ACTIONS
                if _refusal(rt, session, a, job_id, job, None, now) is None
                and not (a == FAIL and job is not None and job.status in TERMINAL)]


def _refusal(rt: Runtime, session: Session, action: str, job_id: uuid.UUID, job: Job | None,
             upstream_id: str | None, now: datetime) -> str | None:
    spec = REGISTRY.get(action)
    if spec is None:
        return f"unknown action {action!r}"
    if spec.needs_job and job is None:
        return f"no job {job_id}"
    return spec.refusal(rt, session, job_id, job, upstream_id, now)


def _resolve_refusal(rt: Runtime, session: Session, job_id: uuid.UUID, job: Job | None,
                     upstream_id: str | None, now: datetime) -> str | None:
    """Both resolutions: only an uncertain submission no worker holds."""
    assert job is not None
    if job.status not in IN_FLIGHT or job.submission_state not in UNKNOWN_OUTCOME:
        return (f"job {job_id} is {job.status}/{job.submission_state or 'no submission'}: "
                "only uncertain submissions are resolved")
    if job.submission_state == Submission.SUBMITTING and job.claim_expires_at is not None \
            and job.claim_expires_at >= now:
        return (f"a worker holds the submission claim of job {job_id} until "
                f"{job.claim_expires_at.isoformat()}; wait for it to finish or expire")
    return None


def _adopt_refusal(rt: Runtime, session: Session, job_id: uuid.UUID, job: Job | None,
                   upstream_id: str | None, now: datetime) -> str | None:
    refused = _resolve_refusal(rt, session, job_id, job, upstream_id, now)
    if refused is not None:
        return refused
    assert job is not None
    kind = rt.kind(job.provider_kind)
    if kind is None or kind.sync:
        return (f"job {job_id} is of kind {job.provider_kind!r}, which has no upstream id "
                "to adopt; use --not-submitted")
    if upstream_id is not None:
        from .jobstore import evidence
        from .lifecycle import usable_task_id

        if upstream_id and not usable_task_id(upstream_id):
            return (f"upstream id {upstream_id!r} cannot be stored (a NUL or an unpaired "
                    "surrogate): no provider answers with one")

        holder = evidence.holders(session, [upstream_id], job_id).get(upstream_id)
        if holder is not None:
            return (f"upstream id {upstream_id!r} is the task of job {holder}, not job "
                    f"{job_id}'s; nothing done (see `reconcile show {holder}`)")
    return None


def _fail_refusal(rt: Runtime, session: Session, job_id: uuid.UUID, job: Job | None,
                  upstream_id: str | None, now: datetime) -> str | None:
    assert job is not None
    if job.status == Status.COMPLETED:
        return f"job {job.id} is completed: its credits were committed; nothing to fail"
    if job.status in TERMINAL:
        return None  # answered "already failed; nothing done" by run
    # the rows a user's cancel answers 409 for (jobstore.is_outcome_unknown, one home)
    if jobstore.is_outcome_unknown(job.submission_state,
                                   call_started=job.provider_call_started_at is not None,
                                   task_id=job.provider_task_id):
        if job.submission_state is None:
            started = job.provider_call_started_at
            return (f"job {job.id} is a platform row whose provider call started at "
                    f"{started.isoformat() if started else '?'} and has no result yet: failing "
                    "it would throw a paid answer away. Wait for the call (the sweep fails "
                    "it past its kind's threshold)")
        return (f"job {job.id} is {job.submission_state}: the provider may have created it. "
                f"Use `reconcile resolve {job.id} --upstream-id ID` or `--not-submitted`")
    return None


def _settle_refusal(rt: Runtime, session: Session, job_id: uuid.UUID, job: Job | None,
                    upstream_id: str | None, now: datetime) -> str | None:
    assert job is not None
    if job.status not in (Status.FAILED, Status.CANCELLED):
        return f"job {job.id} is {job.status}: only a failed or cancelled job is settled"
    if job.credits_actual is not None:
        return f"job {job.id} is settled already (credits_actual {job.credits_actual})"
    if not jobstore.must_settle(job):
        return (f"job {job.id} was {job.status} by the platform, not the library: its "
                "reservation is the platform's to settle (`reconcile audit` reports it)")
    return None


def _release_refusal(rt: Runtime, session: Session, job_id: uuid.UUID, job: Job | None,
                     upstream_id: str | None, now: datetime) -> str | None:
    from .ledger import BuiltinLedger

    if not isinstance(rt.ledger, BuiltinLedger):
        return (f"this runtime uses the {rt.ledger.name!r} ledger: its own ledger settles "
                "orphans")
    if job is not None:
        return (f"job {job_id} exists: settle it through its lifecycle (reconcile fail), not "
                "as an orphan")
    return None


# ----------------------------------------------------------------------------- the actions


def run(rt: Runtime, action: str, job_id: uuid.UUID, *, operator: Operator, reason: str | None,
        upstream_id: str | None = None) -> Done:
    """Do ``action`` to the job as ``operator`` for ``reason`` (required), through the
    lifecycle function the CLI has always used, and record it when it changed something."""
    why = clean_reason(reason)
    if action == RESOLVE_UPSTREAM:
        upstream_id = (upstream_id or "").strip()
        if not upstream_id:
            raise ActionRefused("give the upstream id to adopt")
    elif upstream_id is not None:
        raise ActionRefused(f"{action} takes no upstream id")
    now = rt.now()
    with rt.sessions() as session:
        job = session.get(Job, job_id)
        refused = _refusal(rt, session, action, job_id, job, upstream_id, now)
        user_id = job.user_id if job is not None else None
        status = job.status if job is not None else None
    if refused is not None:
        raise ActionRefused(refused)
    done = REGISTRY[action].act(rt, job_id, status, why, operator, upstream_id)
    if done.changed:
        _record(rt, done, operator, why, user_id)
    return done


def _fail(rt: Runtime, job_id: uuid.UUID, status: str | None, why: str, operator: Operator,
          upstream_id: str | None) -> Done:
    from . import lifecycle
    from .errors import ErrorCode

    if status in TERMINAL:
        return Done(FAIL, job_id, False, f"job {job_id} is already {status}; nothing done")
    if not lifecycle.fail_job(rt, job_id, ErrorCode.RECONCILE_NO_RECOVERY,
                              "reconcile_no_recovery",
                              {"by": "operator", "reason": why},
                              where=(jobstore.outcome_known(),)):
        raise ActionLost(f"job {job_id} changed meanwhile; nothing done "
                         f"(see `reconcile show {job_id}`)")
    return Done(FAIL, job_id, True, f"job {job_id} failed")


def _resolve_upstream(rt: Runtime, job_id: uuid.UUID, status: str | None, why: str,
                      operator: Operator, upstream_id: str | None) -> Done:
    from . import lifecycle

    assert upstream_id
    if not lifecycle.adopt_upstream_id(rt, job_id, upstream_id, source="operator"):
        raise ActionLost(f"job {job_id} changed meanwhile; nothing done")
    return Done(RESOLVE_UPSTREAM, job_id, True,
                f"job {job_id} adopted upstream id {upstream_id}: processing, polling resumed",
                {"upstream_id": upstream_id})


def _resolve_not_submitted(rt: Runtime, job_id: uuid.UUID, status: str | None, why: str,
                           operator: Operator, upstream_id: str | None) -> Done:
    from . import lifecycle

    if not lifecycle.resolve_not_submitted(rt, job_id, reason="operator"):
        raise ActionLost(f"job {job_id} changed meanwhile; nothing done")
    return Done(RESOLVE_NOT_SUBMITTED, job_id, True, f"job {job_id} failed as not submitted")


def _retry_settle(rt: Runtime, job_id: uuid.UUID, status: str | None, why: str,
                  operator: Operator, upstream_id: str | None) -> Done:
    """Settle now a failed or cancelled job whose settlement is pending (the ledger refused it,
    or it waits for its backoff). Refused for a platform's own failed row: the library never
    failed it, so its reservation is the platform's to settle."""
    from . import lifecycle

    outcome = lifecycle.settle(rt, job_id)  # its own must_settle guard runs again, locked
    if outcome == SettleOutcome.SETTLED:
        with rt.sessions() as session:
            job = session.get(Job, job_id)
            returned = rt.ledger.refunded(session, job_id)
        kept = f", kept {job.credits_actual}" if job is not None and job.credits_actual else ""
        return Done(RETRY_SETTLE, job_id, True,
                    f"job {job_id} settled; refunded {returned} credits{kept}",
                    {"refunded": returned})
    if outcome == SettleOutcome.BACKED_OFF:
        raise ActionLost(f"job {job_id}: the settlement failed again; it stays pending and the "
                         f"sweep retries it (see `reconcile show {job_id}`)")
    raise ActionLost(f"job {job_id} changed meanwhile ({outcome.value}); nothing done")


def _release_orphan(rt: Runtime, job_id: uuid.UUID, status: str | None, why: str,
                    operator: Operator, upstream_id: str | None) -> Done:
    from .credits import release_orphan
    from .errors import LedgerError

    try:
        with rt.sessions.begin() as session:
            released = release_orphan(session, job_id, why, now=rt.now())
            after = rt.ledger.refunded(session, job_id)
    except LedgerError as exc:
        raise ActionRefused(str(exc)) from exc
    if not released:
        return Done(RELEASE_ORPHAN, job_id, False,
                    f"job {job_id}: no reservation held; nothing done")
    return Done(RELEASE_ORPHAN, job_id, True,
                f"job {job_id}: orphaned reservation released; refunded {after} credits",
                {"refunded": after})


#: every action by name: the one declaration each surface derives its list from
REGISTRY: dict[str, Action] = {a.name: a for a in (
    # in the order a surface lists them
    Action(RESOLVE_UPSTREAM, "Resolve: the provider created it — adopt this upstream id",
           _adopt_refusal, _resolve_upstream,
           # the sweep's "nobody resolved this uncertain submission" note
           resolves=frozenset({"uncertain_unresolved"})),
    Action(RESOLVE_NOT_SUBMITTED, "Resolve: nothing was created upstream — fail and refund",
           _resolve_refusal, _resolve_not_submitted,
           resolves=frozenset({"uncertain_unresolved"})),
    # a row of a kind this process does not know: failing it is the operator's answer
    Action(FAIL, "Fail the job and refund its credits", _fail_refusal, _fail,
           resolves=frozenset({"unknown_provider_kind"})),
    # the ledger refused the settlement (or its usage metadata was unusable): it settled now
    Action(RETRY_SETTLE, "Retry the settlement now", _settle_refusal, _retry_settle,
           resolves=frozenset({"ledger_error", "bad_usage_metadata"}), command="retry-settle"),
    # the release writes its own note: the release is its answer
    Action(RELEASE_ORPHAN, "Release the orphaned reservation", _release_refusal, _release_orphan,
           resolves=frozenset({"orphan_released"}), needs_job=False),
)}
#: every action, in the order a surface lists them
ACTIONS = tuple(REGISTRY)
#: the anomaly kinds an action answers: when it changes the job, the job's open anomalies of
#: these kinds are closed (``resolved_at``/``resolved_by``/``resolved_action``), in the
#: transaction that writes the operator record. A kind no action answers stays open.
RESOLVES: dict[str, frozenset[str]] = {a.name: a.resolves for a in REGISTRY.values()}
#: the actions the CLI runs as ``reconcile <command> JOB_ID --reason …``
COMMANDS: dict[str, Action] = {a.command: a for a in REGISTRY.values() if a.command}
#: the actions a job's page offers (the console, the Django admin), in :data:`ACTIONS` order
JOB_ACTIONS = tuple(a.name for a in REGISTRY.values() if a.needs_job)


# ----------------------------------------------------------------------------- the record


def _record(rt: Runtime, done: Done, operator: Operator, reason: str,
            user_id: uuid.UUID | None) -> None:
    """The operator record's row for a done action, and the closing of the job's open anomalies
    the action answers (:data:`RESOLVES`), in their own transaction after the change: a crash
    in between loses the record, never the change; the job's events hold the change."""
    from .core import redact

    try:
        with rt.sessions.begin() as session:
            now = rt.now()
            session.execute(insert(table_of(OperatorAction)).values(
                created_at=now, operator=redact.text(operator.identity)[:200],
                via=operator.via, action=done.action, job_id=done.job_id, user_id=user_id,
                reason=reason, detail=redact.value(done.detail) or None))
            jobstore.resolve_anomalies(session, done.job_id, RESOLVES.get(done.action, ()),
                                       now=now, by=f"{operator.identity} via {operator.via}",
                                       action=done.action)
    except Exception:  # the change is made; a lost record is logged, never raised
        log.exception("operator_record_failed job_id=%s action=%s", done.job_id, done.action)
    log.info("operator_action job_id=%s action=%s via=%s operator=%s", done.job_id, done.action,
             operator.via, operator.identity)


def records(session: Session, *, job_id: uuid.UUID | None = None,
            since: datetime | None = None, limit: int = 200) -> list[dict[str, Any]]:
    """The operator record's newest ``limit`` rows, oldest first: every action, or one job's, or
    those since ``since``."""
    query = select(OperatorAction).order_by(OperatorAction.created_at.desc(),
                                            OperatorAction.id.desc())
    if job_id is not None:
        query = query.where(OperatorAction.job_id == job_id)
    if since is not None:
        query = query.where(OperatorAction.created_at >= since)
    newest = list(session.execute(query.limit(limit)).scalars())[::-1]
    return [{"id": r.id, "at": r.created_at.isoformat(), "operator": r.operator, "via": r.via,
             "action": r.action, "job_id": str(r.job_id) if r.job_id else None,
             "user_id": str(r.user_id) if r.user_id else None, "reason": r.reason,
             "detail": r.detail}
            for r in newest]


__all__ = ["ACTIONS", "Action", "ActionLost", "ActionRefused", "COMMANDS", "Done", "JOB_ACTIONS",
           "Operator", "REGISTRY", "allowed", "clean_reason", "records", "refusal", "run"]
