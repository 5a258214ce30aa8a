"""Internal: the library's own mechanics, not an import path for platforms (may move).

Safe adoption on a live platform (README, Design notes: Legacy rows): which rows are the library's.

A row with neither ``provider_kind`` nor ``submission_state`` was never submitted through the
library: a legacy row from before it, or another subsystem's (pipeline wrappers, jobs an old
worker still runs). So is a row without ``submission_state`` or task id whose ``provider_kind``
this process has not registered: it follows the same rules (:func:`is_foreign`), plus one
``unknown_kind`` anomaly where they fail nothing. The sweep treats such a row as a *legacy
candidate* only when

* it was created before the **legacy cutoff** — ``LEGACY_CUTOFF``, by default the adoption time
  the migration recorded in ``reconcile_meta`` (rows created later are never touched, in any
  mode);
* it is older (by ``started_at``, else ``created_at``) than ``LEGACY_AGE`` — by default the
  longest exhaustion horizon in the kind registry (stale threshold + 18 attempts 5 minutes
  apart: ``kie-lip-sync`` 75 + 90 = 165 minutes), so no row a live worker could still finish
  looks abandoned;
* its ``job_type`` is allowed (``LEGACY_JOB_TYPES``, empty: all) and not excluded
  (``LEGACY_EXCLUDE_JOB_TYPES``).

``LEGACY_SWEEP`` then decides: ``observe`` (the default) logs and counts the row as "would
fail", ``enforce`` fails it ``RECONCILE_NO_RECOVERY`` and refunds it, ``off``
ignores it.

``OBSERVE_ONLY_KINDS`` names kinds the sweep only logs; :data:`LEGACY` (``legacy``, the name the
CLI's ``stuck --kind legacy`` and the metrics use) covers the rows without a kind, :data:`ALL`
(``*``) every row. An unknown name is a start-up error (:func:`check_observe_only`), never a
silent no-op; so is a ``REQUIRED_KINDS`` name or a completion hook's kind that this process has
not registered (:func:`check_required_kinds`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from sqlalchemy import select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from ..db.models import Job, ReconcileMeta
from ..kinds import Kind, all_kinds
from .horizon import kind_horizon

if TYPE_CHECKING:
    from ..core.runtime_view import RuntimeView
    from ..settings import Settings

log = logging.getLogger("reconcile.adoption")

LEGACY = "legacy"
ALL = "*"


class SettingsError(ValueError):
    """A setting names something that does not exist (raised at start-up)."""


def default_legacy_age() -> timedelta:
    """The longest kind's exhaustion horizon in the registry (165 minutes with the built-ins;
    :func:`reconcile.jobstore.horizon.kind_horizon`)."""
    return max(kind_horizon(k) for k in all_kinds())


def legacy_age(settings: Settings) -> timedelta:
    return settings.legacy_age if settings.legacy_age is not None else default_legacy_age()


def check_observe_only(names: Iterable[str]) -> None:
    """Raise :class:`SettingsError` for a name that is no registered kind, ``legacy`` or ``*``."""
    known = {k.name for k in all_kinds()}
    unknown = sorted(n for n in names if n not in known and n not in (LEGACY, ALL))
    if unknown:
        raise SettingsError(
            f"OBSERVE_ONLY_KINDS names unknown provider kinds {unknown}: use registered kinds, "
            f"{LEGACY!r} (rows without a provider_kind) or {ALL!r} (every row)")


def check_required_kinds(names: Iterable[str], setting: str = "REQUIRED_KINDS") -> None:
    """Start-up check: raise :class:`SettingsError` for a name that is no kind registered in this
    process. Every process that may meet a row (worker, beat, gateway, the ``reconcile``
    command) registers the same kinds: a row of a kind its sweep does not know is never settled
    by a guess (an ``unknown_kind`` anomaly, or the adoption rules for a platform row), so a
    kind missing from one process is caught here, not by a row that waits."""
    known = {k.name for k in all_kinds()}
    unknown = sorted(set(names) - known)
    if unknown:
        raise SettingsError(
            f"{setting} names provider kinds this process has not registered: {unknown} "
            f"(register them — reconcile.kinds.register_kind — before building the Runtime or "
            f"starting the worker/beat; every process must register the same kinds)")


def observe_only(settings: Settings, job: Job) -> bool:
    """True when ``OBSERVE_ONLY_KINDS`` covers this row (its kind, ``legacy`` or ``*``)."""
    names = settings.observe_only_kinds
    if not names:
        return False
    if ALL in names:
        return True
    return (LEGACY in names) if job.provider_kind is None else job.provider_kind in names


def observe_only_platform_row(settings: Settings, job: Job) -> bool:
    """A row the library did not submit (no ``submission_state``) that ``OBSERVE_ONLY_KINDS``
    covers: the platform's own code runs it, so nothing automatic of the library's changes it —
    the sweep only logs it, and a webhook naming it is stored, never acted on."""
    return job.submission_state is None and observe_only(settings, job)


def adopted_at(session: Session) -> datetime | None:
    """The adoption time the migration recorded (None: the database predates revision 0015)."""
    try:
        with session.begin_nested():
            return session.execute(select(ReconcileMeta.adopted_at)).scalar_one_or_none()
    except DBAPIError:
        return None


def legacy_cutoff(rt: RuntimeView, session: Session | None = None) -> datetime | None:
    """``LEGACY_CUTOFF``, else the recorded adoption time (read once per runtime: it never
    changes). None: no row is a legacy candidate (the safe side), logged once."""
    if rt.settings.legacy_cutoff is not None:
        return rt.settings.legacy_cutoff
    cached = rt.adoption_cache.get("adopted_at")
    if cached is not None or "adopted_at" in rt.adoption_cache:
        return cached
    if session is not None:
        value = adopted_at(session)
    else:
        with rt.sessions() as own:
            value = adopted_at(own)
    if value is None:
        log.warning("legacy_cutoff_unknown: reconcile_meta has no adoption time; legacy rows "
                    "are left alone (run the migrations, or set RECONCILE_LEGACY_CUTOFF)")
    rt.adoption_cache["adopted_at"] = value
    return value


def legacy_candidate(rt: RuntimeView, job: Job, now: datetime) -> str | None:
    """Why a kind-less, never-submitted row is *not* a candidate now (``after_cutoff``,
    ``job_type``, ``young``), or None when it is one."""
    return legacy_reason(rt.settings, legacy_cutoff(rt), job, now)


def legacy_reason(s: Settings, cutoff: datetime | None, job: Job, now: datetime) -> str | None:
    """:func:`legacy_candidate` with the cutoff given (no database read: the sweep's pure
    decision table calls it with the cutoff its caller read)."""
    if cutoff is None or job.created_at is None or job.created_at >= cutoff:
        return "after_cutoff"
    if (s.legacy_job_types and job.job_type not in s.legacy_job_types) \
            or job.job_type in s.legacy_exclude_job_types:
        return "job_type"
    since = job.started_at or job.created_at
    if now - since < s.scaled(legacy_age(s)):
        return "young"
    return None


def is_foreign(job: Job, kind: Kind | None) -> bool:
    """A row the library never submitted (no ``submission_state``) that names no kind this
    process can act on — no kind at all (legacy or another subsystem's), or a kind it has not
    registered and no task id (``kind``: the row's kind as the registry resolves it, None when
    unknown). Such a row follows the adoption rules (README, Design notes: Legacy rows). A row
    the library submitted never does, nor an unknown kind's row with a task id (an upstream job
    only a process knowing the kind can read): both are one ``unknown_kind`` anomaly, left."""
    if job.submission_state is not None:
        return False
    return job.provider_kind is None or (kind is None and not job.provider_task_id)


__all__ = [
    "ALL", "LEGACY", "SettingsError", "adopted_at", "check_observe_only", "default_legacy_age",
    "is_foreign", "legacy_age", "legacy_candidate", "legacy_cutoff",
    "legacy_reason", "observe_only",
    "check_required_kinds", "observe_only_platform_row",
]
