"""Internal: what a sweep tick reports — one :class:`SweepAction` per handled row, the
:class:`SweepReport` counts (and its log line), and the tally a tick keeps while it runs."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from .table import RECOVERING, Action, Decision

log = logging.getLogger("reconcile.sweep")


@dataclass(frozen=True)
class SweepAction:
    """What a tick did to one job (rows it merely looked at are not listed)."""

    job_id: uuid.UUID
    row: str
    action: str
    outcome: str


@dataclass(frozen=True)
class SweepReport:
    """One tick's counts. ``recovered``/``failed``: settled inside the tick (a retried refund
    counts as failed); rows left in flight, or handed to workers, count as ``still_running``."""

    scanned: int
    recovered: int
    failed: int
    still_running: int
    errors: int
    elapsed_ms: int
    fanned_out: int = 0
    actions: tuple[SweepAction, ...] = ()
    dry_run: bool = False
    # what observe-only rows (LEGACY_SWEEP=observe, OBSERVE_ONLY_KINDS) would have had done
    observed: int = 0
    observed_would_fail: int = 0
    # dry run: the decided actions that would run (observe-only rows excluded)
    would: tuple[tuple[str, int], ...] = ()
    late_completions: int = 0  # completed_after_refund anomalies found this tick

    def line(self) -> str:
        if self.dry_run:
            return self._dry_line()
        observed = (f"observed={self.observed} would_fail={self.observed_would_fail} "
                    if self.observed else "")
        return (f"[reconcile] scanned={self.scanned} recovered={self.recovered} "
                f"failed={self.failed} stillRunning={self.still_running} "
                f"errors={self.errors} {observed}({self.elapsed_ms}ms)")

    def _dry_line(self) -> str:
        would = dict(self.would)
        recover = sum(would.get(a, 0) for a in RECOVERING)
        other = sum(would.get(a, 0) for a in (Action.MARK_UNCERTAIN, Action.ANOMALY))
        return (f"[reconcile] DRY RUN scanned={self.scanned} would_recover={recover} "
                f"would_fail={would.get(Action.FAIL, 0)} would_settle={would.get(Action.SETTLE, 0)} "
                f"would_other={other} observed={self.observed} "
                f"observed_would_fail={self.observed_would_fail} errors={self.errors} "
                f"({self.elapsed_ms}ms)")


#: how long the stored ticks are kept (the health page shows the newest)
TICKS_KEPT = timedelta(days=7)


def record(sessions: Any, report: SweepReport, started_at: datetime) -> None:
    """Store a (real, not dry-run) tick's counts and its decisions by row, action and outcome,
    and drop the ticks older than :data:`TICKS_KEPT`: one transaction; a failure is logged,
    never raised (the tick's work is done)."""
    from sqlalchemy import delete, insert

    from ..db.models import SweepTick, table_of

    decisions: dict[str, int] = {}
    for a in report.actions:
        key = f"{a.row} {a.action} {a.outcome}"
        decisions[key] = decisions.get(key, 0) + 1
    try:
        with sessions.begin() as session:
            session.execute(insert(table_of(SweepTick)).values(
                started_at=started_at, elapsed_ms=report.elapsed_ms, scanned=report.scanned,
                recovered=report.recovered, failed=report.failed,
                still_running=report.still_running, errors=report.errors,
                fanned_out=report.fanned_out, observed=report.observed,
                late_completions=report.late_completions, decisions=decisions or None))
            session.execute(delete(SweepTick).where(SweepTick.started_at
                                                    < started_at - TICKS_KEPT))
    except Exception:
        log.exception("sweep_tick_record_failed")


@dataclass
class _Tally:
    scanned: int = 0
    recovered: int = 0
    failed: int = 0
    still_running: int = 0
    errors: int = 0
    fanned_out: int = 0
    actions: list[SweepAction] = field(default_factory=list)
    observed: int = 0
    observed_would_fail: int = 0
    would: dict[str, int] = field(default_factory=dict)

    def add(self, job_id: uuid.UUID, decision: Decision, outcome: str) -> None:
        self.scanned += 1
        if outcome == "observe_only":
            self.observed += 1
            self.observed_would_fail += decision.action is Action.FAIL
        elif outcome == "dry_run":
            self.would[str(decision.action)] = self.would.get(str(decision.action), 0) + 1
        if outcome == "completed":
            self.recovered += 1
        elif outcome in ("failed", "settled"):
            self.failed += 1
        elif outcome in ("error", "settle_failed"):
            self.errors += 1
        elif outcome != "lost":
            self.still_running += 1
            self.fanned_out += outcome == "fanned_out"
        if outcome != "left":
            self.actions.append(SweepAction(job_id, decision.row, str(decision.action), outcome))
            log.info("sweep_action job_id=%s row=%s action=%s outcome=%s", job_id, decision.row,
                     decision.action, outcome)
