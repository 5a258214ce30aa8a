"""The demo's report: the operator's view of the uncertain job, the per-job table (outcome, error
code, upstream creates, credits reserved / committed / refunded, how it was settled), the sweep
ticks and the credit totals. :func:`report` also gathers what the invariants of
:mod:`.checks` are checked against, and returns what they found broken."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import uuid
from collections.abc import Mapping
from typing import Any

from .checks import _is_sync, _provider, check, resumed_chains, run_failures
from .claims import finished_by, release
from .plan import Row, Story
from .processes import Printer, Setup, Sweeper, snapshot


def show_uncertain(setup: Setup, uncertain_ids: list[uuid.UUID], say: Printer) -> None:
    """The operator's view: ``python -m reconcile uncertain`` (or the same query, if the CLI is
    not installed)."""
    say("operator view of uncertain submissions:")
    if importlib.util.find_spec("reconcile.cli") is not None and \
            importlib.util.find_spec("reconcile.__main__") is not None:
        try:
            out = subprocess.run([sys.executable, "-m", "reconcile", "uncertain"], env=setup.env,
                                 capture_output=True, text=True, timeout=60)
            if out.returncode == 0:
                say("$ python -m reconcile uncertain", stamp=False)
                say(out.stdout.rstrip(), stamp=False)
                return
            say(f"(reconcile uncertain exited {out.returncode}: {out.stderr.strip()[-300:]})")
        except (OSError, subprocess.TimeoutExpired) as exc:
            say(f"(reconcile uncertain failed: {exc!r})")
    from sqlalchemy import select

    from .. import tasks
    from ..db.models import Job, UsageLog

    rt = tasks.get_runtime()
    say("$ SELECT … FROM jobs WHERE submission_state = 'uncertain'  (CLI not available)",
        stamp=False)
    with rt.sessions() as session:
        rows = session.execute(
            select(Job, UsageLog).join(UsageLog, UsageLog.job_id == Job.id, isouter=True)
            .where(Job.submission_state == "uncertain", Job.status.in_(["pending", "processing"]))
            .order_by(Job.created_at)).all()
    for job, log in rows:
        mine = " (this run)" if job.id in uncertain_ids else ""
        say(f"  {job.id}  {job.provider_kind:<14} {job.status}/{job.submission_state}  "
            f"{job.error_code}  reserved={log.credits if log else '-'} ({log.status if log else '-'})"
            f"  since {job.provider_call_started_at:%H:%M:%S}{mine}", stamp=False)


CONSOLE_PORT = 8800  # reconcile console's default port


def show_console(setup: Setup, uncertain_ids: list[uuid.UUID], say: Printer) -> None:
    """Where to see this run in the operator console: its ``--dev`` server on this run's
    database, and the example platform's mount at ``/ops``."""
    import shlex

    from ..core.redact import database_url

    url = database_url(setup.database_url)
    say("operator console: the uncertain job's story, its evidence and the resolve form:",
        stamp=False)
    say(f"  $ reconcile --database-url {shlex.quote(url)} console --dev", stamp=False)
    say(f"  then open the one-time URL it prints (http://127.0.0.1:{CONSOLE_PORT}/login?token=…)"
        + "".join(f"\n  and http://127.0.0.1:{CONSOLE_PORT}/jobs/{job_id}"
                  for job_id in uncertain_ids), stamp=False)
    say("  the example platform (examples/platform) mounts it at http://127.0.0.1:8000/ops/ "
        "behind its demo hook (GET /ops-login?as=ops@acme.test)", stamp=False)


def how_settled(job: Any, via: str | None,
                held: Mapping[uuid.UUID, str] | None = None) -> str:
    """The table's "settled by". ``held``: batch mode — the rows worker A held claimed when it
    died, each with how it came back (``released`` or ``due-again``); a row's generation
    says nothing there (a webhook's confirmed success starts a new one too)."""
    if job.status in ("pending", "processing"):
        return "left-uncertain" if job.submission_state == "uncertain" else "STILL IN FLIGHT"
    detail = job.error_detail if isinstance(job.error_detail, dict) else {}
    source = via or detail.get("via")
    if job.status == "failed" and detail.get("via") == "sweep":
        return "refunded-by-sweep"
    if source == "webhook":
        return "webhook"
    if source == "sync":
        return "request"
    if source == "sweep":
        return "sweep-poll"
    if held is not None:
        return held.get(job.id, "worker")
    return "sweep-resumed" if (job.poll_generation or 0) >= 2 else "worker"


def report(rt: Any, sim: Any, story: Story, sweeper: Sweeper, say: Printer) -> list[str]:
    from sqlalchemy import select

    from .. import credits
    from ..db.models import Asset, CreditTransaction, JobEvent, UsageLog

    by_id = story.by_id()
    jobs = snapshot(rt, story.ids)
    with rt.sessions() as session:
        logs = {u.job_id: u for u in session.execute(
            select(UsageLog).where(UsageLog.job_id.in_(story.ids))).scalars()}
        txns: dict[uuid.UUID, list[Any]] = {}
        for t in session.execute(select(CreditTransaction)
                                 .where(CreditTransaction.job_id.in_(story.ids))).scalars():
            txns.setdefault(t.job_id, []).append(t)
        assets: dict[uuid.UUID, list[Any]] = {}
        for a in session.execute(select(Asset).where(Asset.job_id.in_(story.ids))).scalars():
            assets.setdefault(a.job_id, []).append(a)
        vias = {e.job_id: (e.payload or {}).get("via") for e in session.execute(
            select(JobEvent).where(JobEvent.job_id.in_(story.ids),
                                   JobEvent.type == "completed")).scalars()}
        discrepancies = credits.audit(session, now=rt.now(), settings=rt.settings,
                                      policy=rt.settlement_policy)
    users, ids = set(story.users), set(story.ids)
    discrepancies = [d for d in discrepancies if d.user_id in users or d.job_id in ids]

    # sync calls carry no job id upstream: the simulator counts them per provider
    sync_calls: dict[str, int] = {}
    for entry in sim.counters()["creates"]:
        if entry["job_id"] is None:
            sync_calls[entry["provider"]] = sync_calls.get(entry["provider"], 0) + entry["count"]
    sync_jobs: dict[str, int] = {}
    for plan in story.plans:
        if _is_sync(plan.kind):
            sync_jobs[_provider(plan.kind)] = sync_jobs.get(_provider(plan.kind), 0) + 1

    came_back = ({job_id: release(claim, story.a_reaped_at)
                  for job_id, claim in story.held_at_crash.items()}
                 if story.mode == "batch" else None)
    rows: list[Row] = []
    failures: list[str] = []
    for job_id in story.ids:
        plan, job = by_id[job_id], jobs.get(job_id)
        if job is None:
            failures.append(f"{plan.name}: job row missing")
            continue
        amounts = {t.type: t.amount for t in txns.get(job_id, []) if t.id.endswith(str(job_id))}
        refunded = sum(t.amount for t in txns.get(job_id, []) if t.type == "REFUND")
        log = logs.get(job_id)
        if _is_sync(plan.kind):
            creates = f"{sync_calls.get(_provider(plan.kind), 0)}/{sync_jobs[_provider(plan.kind)]}ˢ"
        else:
            creates = str(sim.creates(str(job_id)))
        rows.append(Row(job_id, plan, job.status, job.submission_state, job.error_code, creates,
                        log.credits if log else 0, amounts.get("COMMIT", 0), refunded,
                        how_settled(job, vias.get(job_id), came_back)))
        failures.extend(check(plan, job, log, assets.get(job_id, []), refunded, sim, rt))

    failures.extend(run_failures(story, sweeper, rows, jobs, sync_calls, sync_jobs,
                                 discrepancies))

    print_table(rows, say)
    say("ˢ sync calls carry no job id upstream: calls/jobs per provider ("
        + ", ".join(f"{p} {sync_calls.get(p, 0)}/{n}" for p, n in sorted(sync_jobs.items()))
        + ")", stamp=False)
    if story.mode == "batch":
        show_claims(story, jobs, came_back or {}, say)
    else:
        resumed = resumed_chains(story, rows, jobs)
        say(f"in flight when worker A died: {len(story.in_flight_at_crash)} jobs; chains resumed "
            f"by the sweep and finished on worker B: {len(resumed)} (a chain whose next poll was "
            f"still waiting in the broker, not yet fetched by A, simply continues on B)",
            stamp=False)
    say("", stamp=False)
    say(f"sweep ticks ({len(sweeper.ticks)}):", stamp=False)
    for at, line, notes in sweeper.ticks:
        say(f"  {at:5.1f}s  {line}{'  ← ' + notes if notes else ''}", stamp=False)
    say("", stamp=False)
    total = {k: sum(getattr(r, k) for r in rows) for k in ("reserved", "committed", "refunded")}
    held = sum(r.reserved for r in rows if r.status == "pending")
    say(f"credits: reserved {total['reserved']} = committed {total['committed']} + refunded "
        f"{total['refunded']} + still held {held} (the uncertain job)", stamp=False)
    if discrepancies:
        say(f"ledger audit: {len(discrepancies)} discrepancies", stamp=False)
    else:
        say(f"ledger audit: clean (credits.audit == [] over {len(users)} users, "
            f"{len(story.ids)} jobs)", stamp=False)
    return failures


def show_claims(story: Story, jobs: dict[uuid.UUID, Any], came_back: Mapping[uuid.UUID, str],
                say: Printer) -> None:
    """Batch mode: what became of the rows worker A held claimed when it died."""
    done, _ = finished_by(story, jobs)
    labels = sorted(set(came_back.values()))
    how = ", ".join(f"{sum(1 for v in came_back.values() if v == k)} {k}" for k in labels)

    def after(when: Any) -> str:
        return f"{(when - story.crashed_at).total_seconds():.1f} s" if story.crashed_at else "?"

    say(f"in flight when worker A died: {len(story.in_flight_at_crash)} jobs; rows A held "
        f"claimed: {len(came_back)} ({how or '-'}); finished by worker B: {len(done)} "
        f"(released: a reaper saw A's heartbeat lapse and ended the claim before its lease; "
        f"due-again: the claim's lease ran out first)", stamp=False)
    holders = sorted({worker for worker, _ in story.held_at_crash.values()})
    for worker in sorted(story.a_workers):
        reaped = story.a_reaped_at.get(worker)
        leases = [until for w, until in story.held_at_crash.values() if w == worker]
        say(f"  worker A process {worker}: " + (
            f"reaped {after(reaped)} after A died by {story.reaped_by.get(worker, '?')}"
            if reaped is not None else "never reaped")
            + (f"; it held {len(leases)} claim(s), lease ending {after(max(leases))} after"
               if worker in holders else "; it held no claim"), stamp=False)
    say(f"poll_due ticks sent by this process: {story.poll_due_ticks}; poll_due messages "
        f"dropped unrun by the workers as expired (ticks, and the helpers and wakes the "
        f"workers sent): {story.poll_due_discarded} (the filesystem broker keeps an expired "
        f"message; the worker that receives it discards it)", stamp=False)


def print_table(rows: list[Row], say: Printer) -> None:
    header = ("job", "kind", "story", "outcome", "error code", "creates", "reserved",
              "committed", "refunded", "settled by")
    cells = [header] + [
        (str(r.job_id)[:8], r.plan.kind, r.plan.name,
         r.status if r.submission not in ("uncertain",) else f"{r.status}/{r.submission}",
         r.code or "-", r.creates, str(r.reserved), str(r.committed), str(r.refunded), r.how)
        for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(header))]
    numeric = {5, 6, 7, 8}

    def fmt(cols: tuple[str, ...]) -> str:
        return "  ".join(c.rjust(w) if i in numeric else c.ljust(w)
                         for i, (c, w) in enumerate(zip(cols, widths, strict=True))).rstrip()

    say("", stamp=False)
    say(fmt(header), stamp=False)
    say("  ".join("-" * w for w in widths), stamp=False)
    for row in cells[1:]:
        say(fmt(row), stamp=False)
