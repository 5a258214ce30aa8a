"""Internal: the chaos run's two sweepers (see :mod:`reconcile.testing.chaos`): beat's ticks on
their own schedules, the second past its time budget from its first page at every tick (as on
a backlog), so the fan-out and, in batch mode, the hand-over to the batch poller run under the
faults too."""

from __future__ import annotations

from typing import Any

from .control import log


def sweeper(state: Any, rt: Any, interval: float, over_budget: bool = False) -> None:
    """Tick every ``interval`` seconds until the run stops, counting into ``state`` (the run's
    ``_Run``); ``over_budget``: each fanned-out row's per-job task runs at once."""
    from ...sweep import reconcile_job, sweep

    def fan_out(job_id: Any) -> None:
        reconcile_job(rt, job_id)

    while not state.stop.is_set():
        try:
            report = sweep(rt, budget=0.0 if over_budget else None,
                           fan_out=fan_out if over_budget else None)
            state.bump("sweeps")
            state.bump("sweep_errors", report.errors)
            state.bump("sweep_resumes", sum(1 for a in report.actions if a.outcome == "resumed"))
            with state.lock:
                for action in report.actions:
                    if action.outcome not in ("left", "lost", "error", "not_found", "anomaly"):
                        state.recovered_ids.add(action.job_id)
        except Exception as exc:
            state.bump("sweep_crashes")
            log.info("chaos_sweep_failed error=%s", exc)
        state.stop.wait(interval)
