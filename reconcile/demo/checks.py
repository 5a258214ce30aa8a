"""The demo's invariants: :func:`check` per job (created upstream at most once, the right
outcome, assets stored, the reservation committed, refunded or — uncertain — intact), and
:func:`run_failures` for the run (the crashes happened as scripted; chain mode: dead chains were
resumed; batch mode: the rows worker A held claimed were finished by worker B; the audit is
clean, the credits add up)."""

from __future__ import annotations

import signal
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .plan import Planned, Row, Story

if TYPE_CHECKING:
    from .processes import Sweeper


def _is_sync(kind: str) -> bool:
    from ..kinds import get_kind

    found = get_kind(kind)
    return bool(found and found.sync)


def _provider(kind: str) -> str:
    from ..kinds import provider_of

    return provider_of(kind) or kind


def check(plan: Planned, job: Any, log: Any, assets: list[Any], refunded: int, sim: Any,
          rt: Any) -> list[str]:
    """The invariants of one job; returns what is broken (empty: all hold)."""
    name = f"{plan.name} ({str(job.id)[:8]})"
    broken: list[str] = []
    if not _is_sync(plan.kind):
        creates, attempts = sim.creates(str(job.id)), sim.attempts(str(job.id))
        if creates > 1:
            broken.append(f"{name}: created {creates} times upstream")
        if plan.expect == "uncertain" and attempts != 1:
            broken.append(f"{name}: uncertain job was submitted {attempts} times")
    if log is None:
        return [*broken, f"{name}: no usage log"]
    if plan.expect == "uncertain":
        if (job.status, job.submission_state) != ("pending", "uncertain"):
            broken.append(f"{name}: expected pending/uncertain, got {job.status}/{job.submission_state}")
        if log.status != "reserved" or job.credits_actual is not None or refunded:
            broken.append(f"{name}: the uncertain job's reservation is not intact ({log.status})")
        return broken
    expected_status, _, expected_code = plan.expect.partition(":")
    if job.status != expected_status or (expected_code and job.error_code != expected_code):
        broken.append(f"{name}: expected {plan.expect}, got {job.status} {job.error_code or ''} "
                      f"{job.error_message or ''}".rstrip())
    if job.status == "completed":
        outputs = (job.output_data or {}).get("outputs") or []
        want = plan.outputs if not _is_sync(plan.kind) and plan.kind != "elevenlabs-async" else None
        if len(assets) != len(outputs) or not assets or (want is not None and len(assets) != want):
            broken.append(f"{name}: {len(assets)} asset rows for {len(outputs)} outputs "
                          f"(expected {want if want is not None else len(outputs)})")
        if sorted(a.index for a in assets) != list(range(len(assets))):
            broken.append(f"{name}: asset indexes {sorted(a.index for a in assets)}")
        missing = [a.storage_key for a in assets if not rt.storage.exists(a.storage_key)]
        if missing:
            broken.append(f"{name}: stored objects missing: {missing}")
        if log.status != "committed" or job.credits_actual != log.credits:
            broken.append(f"{name}: completed but usage log {log.status}, "
                          f"credits_actual {job.credits_actual}")
    elif job.status == "failed":
        if job.credits_actual != 0 or log.status != "refunded" or refunded != log.credits:
            broken.append(f"{name}: failed but not refunded (credits_actual {job.credits_actual}, "
                          f"log {log.status}, refunded {refunded}/{log.credits})")
    else:
        broken.append(f"{name}: not terminal ({job.status}/{job.submission_state})")
    return broken


def resumed_chains(story: Story, rows: Sequence[Row], jobs: dict[uuid.UUID, Any]) -> list[Row]:
    """The rows whose poll chain died with worker A and was resumed by the sweep."""
    return [r for r in rows if r.job_id in story.in_flight_at_crash
            and (jobs[r.job_id].poll_generation or 0) >= 2]


def batch_failures(story: Story, jobs: dict[uuid.UUID, Any]) -> list[str]:
    """Batch mode: worker A died holding claimed rows, and worker B finished every one."""
    from .claims import finished_by

    if story.crash_rc is None:
        return []  # reported as the crash that did not happen
    if not story.held_at_crash:
        return ["worker A held no claimed row when it died"]
    if not story.b_workers:
        return ["worker B's liveness rows were not found: cannot tell who finished A's rows"]
    _, wrong = finished_by(story, jobs)
    return (["rows claimed by worker A when it died were not all finished by worker B: "
             + "; ".join(wrong)] if wrong else [])


def run_failures(story: Story, sweeper: Sweeper, rows: Sequence[Row], jobs: dict[uuid.UUID, Any],
                 sync_calls: dict[str, int], sync_jobs: dict[str, int],
                 discrepancies: Sequence[Any]) -> list[str]:
    """The invariants of the whole run; returns what is broken (empty: all hold)."""
    failures: list[str] = []
    for provider, calls in sorted(sync_calls.items()):
        if calls > sync_jobs.get(provider, 0):
            failures.append(f"{provider}: {calls} sync calls for {sync_jobs.get(provider, 0)} jobs")
    if story.crash_rc != -signal.SIGKILL:
        where = "right after claiming a batch" if story.mode == "batch" else "mid-poll"
        failures.append(f"worker A was not SIGKILLed {where} (exit {story.crash_rc})")
    for name, rc in story.sync_rcs.items():
        want = -signal.SIGKILL if "dies" in name else 0
        if rc != want:
            failures.append(f"{name} process: exit {rc}, expected {want}")
    if story.worker_b_rc is not None:
        failures.append(f"worker B exited on its own (exit {story.worker_b_rc}): see its log")
    if story.mode == "batch":
        failures.extend(batch_failures(story, jobs))
    elif not resumed_chains(story, rows, jobs):
        failures.append("no poll chain that died with worker A was resumed by the sweep")
    if discrepancies:
        failures.extend(f"audit: {d.kind} {d.detail}" for d in discrepancies)
    if sweeper.errors:
        failures.append(f"the sweep reported {sweeper.errors} errors")
    if sweeper.ticks and sweeper.ticks[-1][2]:
        failures.append(f"the last tick, after everything settled, still acted: {sweeper.ticks[-1][2]}")
    total = {k: sum(getattr(r, k) for r in rows) for k in ("reserved", "committed", "refunded")}
    held = sum(r.reserved for r in rows if r.status == "pending")
    if total["reserved"] != total["committed"] + total["refunded"] + held:
        failures.append("credits do not add up: reserved != committed + refunded + held")
    return failures
