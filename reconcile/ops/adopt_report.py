"""Internal: the library's own mechanics, not an import path for platforms (may move).

What the first enforcing tick would do (``reconcile adopt report``), and the rows behind a
dry run (``reconcile sweep --dry-run``).

The adoption report runs the sweep's own decision table as a dry run with the legacy sweep
enforced and no observe-only kinds — every other setting (cutoff, ``LEGACY_AGE``, job types) as
configured — so the rows it lists are exactly the rows an enforcing tick at that moment acts on.
Rows are grouped by action, job type, kind (``legacy`` for none), status and age, each group with
the credits its reservations hold: a ``fail`` or ``settle`` refunds them, a ``poll`` (or another
recovery) commits or refunds them depending on what the provider says.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select

from ..db.models import Job, UsageLog
from ..jobstore.adoption import LEGACY, legacy_age, legacy_cutoff
from ..runtime import Runtime
from ..sweep import SweepAction, SweepReport, sweep

AGE_BUCKETS: tuple[tuple[timedelta, str], ...] = (
    (timedelta(minutes=15), "<15m"), (timedelta(hours=1), "15m-1h"), (timedelta(hours=3), "1h-3h"),
    (timedelta(hours=12), "3h-12h"), (timedelta(hours=24), "12h-24h"),
)
MOVES = {"fail": "refund", "settle": "refund"}  # anything else: commit or refund, the provider decides


def age_bucket(age: timedelta) -> str:
    for limit, name in AGE_BUCKETS:
        if age < limit:
            return name
    return ">24h"


@dataclass(frozen=True)
class Row:
    job_id: uuid.UUID
    action: str
    row: str
    job_type: str
    kind: str
    status: str
    age: timedelta
    credits: int  # held by the job's reserved usage logs


@dataclass(frozen=True)
class Group:
    action: str
    job_type: str
    kind: str
    status: str
    age: str
    jobs: int
    credits: int
    moves: str


@dataclass(frozen=True)
class AdoptionReport:
    mode: str  # the configured LEGACY_SWEEP
    cutoff: datetime | None
    legacy_age: timedelta
    scanned: int
    rows: tuple[Row, ...]
    groups: tuple[Group, ...]
    errors: int = 0  # rows (or batches) the dry run could not decide: the report is incomplete

    def totals(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for g in self.groups:
            t = out.setdefault(g.action, {"jobs": 0, "credits": 0})
            t["jobs"] += g.jobs
            t["credits"] += g.credits
        return out


def enforcing(rt: Runtime) -> Runtime:
    """``rt`` with the legacy sweep enforced and nothing observe-only (all else unchanged)."""
    settings = rt.settings.model_copy(update={"legacy_sweep": "enforce", "observe_only_kinds": []})
    return dataclasses.replace(rt, settings=settings)


def rows_of(rt: Runtime, actions: Iterable[SweepAction], now: datetime) -> list[Row]:
    """The decided rows with what an operator groups by (one read of the jobs and their logs)."""
    acted = [a for a in actions if a.outcome not in ("left", "lost", "error")]
    ids = [a.job_id for a in acted]
    if not ids:
        return []
    with rt.sessions() as session:
        jobs = {j.id: j for j in session.execute(select(Job).where(Job.id.in_(ids))).scalars()}
        held = dict(session.execute(
            select(UsageLog.job_id, func.sum(UsageLog.credits))
            .where(UsageLog.job_id.in_(ids), UsageLog.status == "reserved")
            .group_by(UsageLog.job_id)).all())
    out: list[Row] = []
    for a in acted:
        job = jobs.get(a.job_id)
        if job is None:
            continue
        since = job.provider_call_started_at or job.started_at or job.created_at
        out.append(Row(a.job_id, a.action, a.row, job.job_type, job.provider_kind or LEGACY,
                       job.status, now - since, int(held.get(a.job_id) or 0)))
    return out


def group(rows: Iterable[Row]) -> list[Group]:
    buckets: dict[tuple[str, str, str, str, str], list[Row]] = {}
    for r in rows:
        buckets.setdefault((r.action, r.job_type, r.kind, r.status, age_bucket(r.age)), []).append(r)
    return [Group(*key, jobs=len(rs), credits=sum(r.credits for r in rs),
                  moves=MOVES.get(key[0], "commit or refund"))
            for key, rs in sorted(buckets.items())]


def build(rt: Runtime, *, now: datetime | None = None) -> AdoptionReport:
    """Decide every candidate as an enforcing tick would now; change nothing."""
    now = now or rt.now()
    report: SweepReport = sweep(enforcing(rt), dry_run=True, now=now)
    rows = rows_of(rt, report.actions, now)
    return AdoptionReport(mode=rt.settings.legacy_sweep, cutoff=legacy_cutoff(rt),
                          legacy_age=legacy_age(rt.settings), scanned=report.scanned,
                          rows=tuple(rows), groups=tuple(group(rows)), errors=report.errors)


def as_json(report: AdoptionReport) -> dict[str, Any]:
    return {
        "mode": report.mode, "cutoff": report.cutoff, "legacy_age": report.legacy_age,
        "scanned": report.scanned, "errors": report.errors, "totals": report.totals(),
        "groups": [dataclasses.asdict(g) for g in report.groups],
        "rows": [dataclasses.asdict(r) for r in report.rows],
    }
