"""Internal: the audit's checks of the job row against the ledger, where a platform may change
the row under the library: deleted it (``orphaned_reservation``), moved its status back
(``settled_job_in_flight``; ``completed_job_in_flight`` at once when its assets are stored), or
rewritten a user id (``job_user_mismatch``,
``usage_log_user_mismatch``). Each check is one statement."""

from __future__ import annotations

from typing import Any

from sqlalchemy import and_, func, literal, or_, select

from ..db.models import Asset, table_of
from ..states import IN_FLIGHT
from ._base import J, T, U, _Audit

A = table_of(Asset)


def _job_rows(a: _Audit) -> None:
    """``orphaned_reservation``, ``settled_job_in_flight``, ``completed_job_in_flight``,
    ``job_user_mismatch`` and ``usage_log_user_mismatch`` (module docstring)."""
    for check in (_orphaned_reservations, _settled_in_flight, _completed_in_flight,
                  _user_mismatches):
        check(a)


def _usage_row(a: _Audit, job_col: Any) -> Any:
    """The condition "this ``T`` row is the job's own USAGE row" for the job id ``job_col``."""
    return and_(T.c.job_id == job_col, T.c.type == "USAGE",
                T.c.id == literal("job-usage:") + a.job_text(job_col))


def _orphaned_reservations(a: _Audit) -> None:
    """A reservation the ledger holds (a ``reserved`` log with its USAGE row) whose job row is
    gone, past the grace: nothing will ever settle it (``reconcile credits release-orphan``)."""
    stmt = a.scoped(
        select(U.c.job_id, U.c.user_id, U.c.credits, U.c.created_at)
        .where(U.c.status == "reserved", U.c.job_id.is_not(None),
               U.c.created_at < a.now - a.grace,
               ~select(J.c.id).where(J.c.id == U.c.job_id).exists(),
               select(T.c.id).where(_usage_row(a, U.c.job_id)).exists())
        .order_by(U.c.created_at), U.c.user_id)
    for r in a.session.execute(stmt):
        a.report("orphaned_reservation", r.user_id, r.job_id,
                 f"{r.credits} credits reserved since {r.created_at.isoformat()} for a job whose "
                 f"row was deleted (release them: reconcile credits release-orphan {r.job_id} "
                 f"--reason ...)")


def _settled_before_grace(a: _Audit) -> Any:
    """The condition "the library settled this ``J`` job (its ``job-commit:`` or
    ``job-refund:``) before the grace" on the ``T`` row joined with it."""
    jid = a.job_text(J.c.id)  # from the (few) jobs in flight, by the settlement's exact id
    settles = or_(and_(T.c.id == literal("job-commit:") + jid, T.c.type == "COMMIT"),
                  and_(T.c.id == literal("job-refund:") + jid, T.c.type == "REFUND"))
    return and_(T.c.job_id == J.c.id, settles, T.c.created_at < a.now - a.grace)


def _settled_in_flight(a: _Audit) -> None:
    """A job in flight whose reservation the library settled (its ``job-commit:`` or
    ``job-refund:``) before the grace: a terminal status was moved back."""
    stmt = a.scoped(
        select(J.c.id, J.c.user_id, J.c.status, T.c.type, T.c.created_at.label("at"))
        .select_from(J.join(T, _settled_before_grace(a)))
        .where(J.c.status.in_(IN_FLIGHT)), J.c.user_id)
    for r in a.session.execute(stmt):
        verb = "committed" if r.type == "COMMIT" else "refunded"
        a.report("settled_job_in_flight", r.user_id, r.id,
                 f"job {r.status} but its reservation was {verb} at {r.at.isoformat()} "
                 f"(a terminal status moved back)")


def _completed_in_flight(a: _Audit) -> None:
    """A job in flight with stored assets, which only a winning completion writes (in its own
    transaction): a completion moved back, with no grace and whatever it charged (a stale ORM
    save of the row; the next finalize re-completes it). Reported once: a job past the grace
    of its settlement is ``settled_job_in_flight``."""
    stmt = a.scoped(
        select(J.c.id, J.c.user_id, J.c.status)
        .where(J.c.status.in_(IN_FLIGHT),
               select(A.c.id).where(A.c.job_id == J.c.id).exists(),
               ~select(T.c.id).where(_settled_before_grace(a)).exists()), J.c.user_id)
    for r in a.session.execute(stmt):
        a.report("completed_job_in_flight", r.user_id, r.id,
                 f"job {r.status} but its completion stored assets (a completed row written "
                 f"back: the next poll re-completes it)")


def _user_mismatches(a: _Audit) -> None:
    """A job whose ``user_id`` is not the user its USAGE row charged; a usage log whose
    ``user_id`` is neither (the USAGE row's user, else its job's): a settlement would pay it."""
    stmt = a.scoped(
        select(J.c.id, J.c.user_id, T.c.user_id.label("charged"))
        .select_from(J.join(T, _usage_row(a, J.c.id)))
        .where(J.c.user_id != T.c.user_id), T.c.user_id)
    for r in a.session.execute(stmt):
        a.report("job_user_mismatch", r.charged, r.id,
                 f"job user {r.user_id} != user {r.charged} its USAGE charged")
    owner = func.coalesce(T.c.user_id, J.c.user_id)
    stmt = a.scoped(
        select(U.c.id, U.c.job_id, U.c.user_id, owner.label("owner"))
        .select_from(U.outerjoin(J, J.c.id == U.c.job_id)
                     .outerjoin(T, _usage_row(a, U.c.job_id)))
        .where(U.c.job_id.is_not(None), owner.is_not(None), U.c.user_id != owner), U.c.user_id)
    for r in a.session.execute(stmt):
        a.report("usage_log_user_mismatch", r.owner, r.job_id,
                 f"usage log {r.id} names user {r.user_id}, its job's is {r.owner}")
