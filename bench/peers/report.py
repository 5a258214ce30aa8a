"""The Markdown of a peers run (``bench/results/peers.md``, and figure 10 of ``make bench``)."""

from __future__ import annotations

from typing import Any

ORDER = ("plain-celery", "reconcile-chain", "reconcile-batch", "dbos")

WORKLOAD = (
    "Each job creates an upstream task in the shipped simulator (`kie-standard`; the task is "
    "done 30 s after its create), polls it every 5 s, downloads the output, writes the result "
    "and settles the job's credits (reserve at submit, commit at completion). Same simulator "
    "process, same PostgreSQL server (a fresh database per run), same Redis (a db of its own), "
    "two worker processes per system: plain Celery and `reconcile` run one `celery worker` "
    "(prefork, 2 pool processes; `reconcile` also runs `celery beat`, counted with the "
    "workers), DBOS two worker processes (executors `worker-0`, `worker-1`). The web tier is "
    "a process of its own that submits the N jobs one after another: `reconcile.api.submit`; "
    "plain Celery: insert + reserve (one transaction), then `.delay`; DBOS: insert + reserve + "
    "`DBOSClient.enqueue_in_transaction` (one transaction).")

NOTES = (
    "**Reading the columns.** *jobs/s*: completed jobs ÷ (last result written − first submit); "
    "every job waits 30 s upstream, so at these sizes it is bounded by the workload, not the "
    "system. *CPU ms/job*: psutil user+system CPU over that window ÷ jobs, per process group: "
    "workers (process trees) + PostgreSQL backends of the run's database + redis-server (shared "
    "with whatever else uses it) + the simulator. *web CPU/submit*: the web tier's own CPU "
    "over its submit loop ÷ jobs (its PostgreSQL backend counts under PG). *delay*: result "
    "written − upstream done (the task's create time in the simulator + 30 s), in 5-s poll "
    "intervals, p50/p99 over the jobs (30 s is 6 intervals, and every system starts its first "
    "wait when the create returns, so a poll that runs on time reads \"done\" just after it "
    "happened: the delay is how late the polls ran, plus the download and the final write). "
    "*xacts/job*: `pg_stat_database.xact_commit` delta of the "
    "run's database ÷ jobs (read-only transactions count too; the driver's reads commit none). "
    "*recovery p99*: 200 jobs (`make bench-peers`); once each has its upstream task and was polled, every worker "
    "process is SIGKILLed at once and new ones started at once; the p99 delay (intervals) of "
    "those jobs, with the time from the kill until the last one was terminal. \"≥\": jobs were "
    "still in flight at the cap (180 s after the kill), the figure is a lower bound. Each peer "
    "runs its own defaults: plain Celery its Redis visibility timeout (3600 s: a dead worker's "
    "held messages come back after it) and prefetch ×4; DBOS a thread per running workflow, "
    "each worker polling the queue every second; `reconcile` its shipped Celery settings.")


def _f(value: Any, suffix: str = "") -> str:
    return "—" if value is None else f"{value}{suffix}"


def _delay(d: dict[str, Any] | None) -> str:
    if not d or not d.get("n"):
        return "—"
    ge = "≥ " if d.get("lower_bound") else ""
    return f"{ge}{d['p50']} / {ge}{d['p99']}"


def _recovery(r: dict[str, Any] | None) -> str:
    if r is None:
        return "not run"
    if "error" in r:
        return "error"
    d = r.get("delay_intervals") or {}
    ge = "≥ " if d.get("lower_bound") else ""
    after = r.get("all_terminal_after_kill_s")
    tail = (f"all terminal {after} s after the kill" if after is not None else
            f"{r.get('in_flight')} of {r.get('jobs')} still in flight at the cap")
    return f"{ge}{d.get('p99', '—')} ({tail})"


def _row(name: str, r: dict[str, Any] | None, rec: dict[str, Any] | None) -> str:
    if r is None:
        return f"| {name} | not run | | | | | {_recovery(rec)} |"
    if "error" in r:
        return f"| {name} | **error** (below) | | | | | {_recovery(rec)} |"
    cpu = r.get("cpu_ms_per_job") or {}
    cpu_s = (f"**{cpu.get('total')}** = {cpu.get('workers')} + {cpu.get('postgres')} + "
             f"{cpu.get('redis')} + {cpu.get('simulator')}") if cpu else "—"
    return (f"| {name} | {_f(r.get('jobs_per_s'))} | {cpu_s} | "
            f"{_f((r.get('submit') or {}).get('web_cpu_ms_per_submit'))} | "
            f"{_delay(r.get('delay_intervals'))} | {_f(r.get('xacts_per_job'))} | "
            f"{_recovery(rec)} |")


def _limits(lim: dict[str, Any] | None) -> str:
    if not lim:
        return "Machine limits: not measured in this run.\n"
    parts = []
    pg = lim.get("pgbench_simple_update")
    if pg:
        parts.append("pgbench simple-update " + (pg.get("missing") or pg.get("error") or
                                                 f"**{pg.get('tps')} tps** (`{pg.get('command')}`)"))
    noop = lim.get("celery_noop")
    if noop:
        parts.append("no-op Celery tasks (1 worker, prefork -c 2) "
                     + (noop.get("error") or f"**{noop.get('tasks_per_s')}/s**"))
    reads = lim.get("simulator_status_reads")
    if reads:
        parts.append("simulator status reads from 2 plain processes "
                     + (reads.get("error") or f"**{reads.get('reads_per_s')}/s**"))
    return "Machine limits, same load level: " + "; ".join(parts) + ".\n"


def tables(passes: dict[str, Any]) -> str:
    out: list[str] = []
    for load, p in passes.items():
        out.append(f"### {load.capitalize()} host\n")
        out.append(_limits(p.get("limits")))
        recovery = p.get("recovery") or {}
        for n, runs in (p.get("runs") or {}).items():
            sizes = {r.get("jobs") for r in recovery.values() if "jobs" in r}
            out.append(f"**{int(n):,} jobs**" + (f" (recovery: {', '.join(map(str, sizes))} "
                                                  "jobs)" if sizes else "") + "\n")
            out.append("| system | jobs/s | CPU ms/job (workers + PG + Redis + sim) | web CPU "
                       "ms/submit | p50 / p99 delay (intervals) | xacts/job | recovery p99 "
                       "(intervals) |")
            out.append("|---|---|---|---|---|---|---|")
            names = [s for s in ORDER if s in runs or s in recovery] + \
                [s for s in runs if s not in ORDER]
            for name in names:
                out.append(_row(name, runs.get(name), recovery.get(name)))
            out.append("")
        for name, r in [*((f"{n} {s}", r) for n, runs in (p.get("runs") or {}).items()
                          for s, r in runs.items()),
                        *((f"recovery {s}", r) for s, r in recovery.items())]:
            if "error" in r:
                out.append(f"**{name} failed:**\n\n```text\n{r['error'][-2500:]}\n```\n")
            elif r.get("failures"):
                out.append(f"**{name} — checks failed:** " + "; ".join(r["failures"]) + "\n")
    return "\n".join(out)


def markdown(res: dict[str, Any]) -> str:
    env = res.get("environment", {})
    out = ["# Peers: `reconcile` beside plain Celery and DBOS, one workload\n",
           f"Run {env.get('date_utc')} UTC at `{env.get('git_head')}`, wall time "
           f"{res.get('wall_seconds')} s. Machine: {env.get('cpus')} CPUs; PostgreSQL "
           f"{env.get('postgresql')}, Redis {env.get('redis')}, Python {env.get('python')}, "
           f"Celery {env.get('celery')}, DBOS {env.get('dbos')}. Load average at the start "
           f"{env.get('loadavg_start')}. Figures are reported, never asserted (the checks — every "
           "job completed, the ledger balanced — are).\n",
           WORKLOAD + "\n", tables(res.get("passes", {})), NOTES + "\n"]
    if res.get("failures"):
        out.append("## Failed checks\n\n" + "\n".join(f"* {f}" for f in res["failures"]) + "\n")
    return "\n".join(out)
