"""Figure 3 — in-flight capacity: 2,000 concurrent 30-second generations through one worker
(prefork, -c 2), polled by the library's fenced poll chains.

The 2,000 jobs are seeded ``accepted``/``processing`` (kind ``kie-standard``: poll every 5 s)
with their reservations, and their upstream tasks created in the simulator at once. Generation
*i* starts at ``t0 + s_i`` (``s_i`` spread evenly over one poll interval, so the poll load is
steady rather than one synchronized burst) and succeeds 30 s later; its chain starts the way
``on_task_created`` starts it: a ``reconcile.poll`` message with a countdown of one interval.
Real time, no scaling. Overhead = ``completed_at`` − (generation start + 30 s): how late, after
the upstream finished, the job was stored as completed. Slots: the pool holds 2 processes whatever
the number of jobs in flight; their busy share comes from the worker log's task runtimes.

CPU per in-flight poll: psutil's user + system CPU of the worker (main process and pool
children), of the PostgreSQL backends serving the throwaway database, and of the bench process
(the in-process simulator's threads, plus this driver's 1 Hz sampler), each read at the start
and the end of the steady window (from one interval after t0, when every chain runs, to the
first completion at t0 + 30 s), divided by the status reads in that window.

Status reads are counted where they land: the in-process simulator's ``lookup`` is wrapped to
log (time, state) per task, in both modes (batch mode sends no ``reconcile.poll`` task, and its
claim lease is not the chain's poll lease, so task events and lease columns say nothing there).
From that log: the spacing of a job's reads, the first read's lateness, and the overhead split
into read lag (upstream end → the read that saw it) and write (that read → ``completed_at``).

Lease margin: per job, the worst time between two of its reads while in flight. A chain whose
gap exceeds the lease would be resumed by a sweep tick although it is alive (a *false resume*:
safe, the old chain is fenced, but wasted work); the figure reports the worst gaps and how many
jobs candidate leases would have resumed. Batch mode: n/a (the sweep never resumes a row with a
due time), the gap is reported.

Batch mode (``RECONCILE_POLL_MODE=batch``, beat sending ``reconcile.poll_due``) runs at 2,000
and 10,000 when the library has the task; otherwise it is recorded as not available.
"""

from __future__ import annotations

import os
import re
import tempfile
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import text

from .common import (
    ROOT,
    Proc,
    backend_pids,
    log,
    make_sender,
    poll_lease_seconds,
    process_cpu_seconds,
    process_tree,
    purge_broker,
    summary,
    task_runtimes,
    throwaway_db,
    wait_until,
    worker_env,
)
from .seed import add_inflight_jobs, add_users

GENERATION_S = 30.0
CANDIDATE_LEASES = (15.0, 20.0, 25.0, 30.0, 40.0, 60.0)  # seconds, for the false-resume count
INTERVAL_S = 5.0  # kie-standard's poll interval (kinds.py)
USERS = 100


def _cpu_split(window: dict[str, Any]) -> dict[str, Any] | None:
    """CPU ms per turn in the steady window, per side (a pid present at the end only counts
    from zero: it started inside the window)."""
    start, end = window.get("start"), window.get("end")
    if not start or not end:
        return None
    turns = end["turns"] - start["turns"]
    if turns <= 0:
        return None
    out: dict[str, Any] = {"turns_in_window": turns,
                           "window_s": round(end["t"] - start["t"], 1)}
    for side in ("worker", "postgres", "bench"):
        used = sum(v - start[side].get(pid, 0.0) for pid, v in end[side].items())
        out[side] = round(used / turns * 1000.0, 2)
    out["total"] = round(out["worker"] + out["postgres"] + out["bench"], 2)
    out["note"] = ("psutil user+system CPU in the steady window ÷ the status reads the "
                   "simulator answered in it; "
                   "bench = the in-process simulator threads + this driver's 1 Hz sampler")
    return out


def _rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def batch_available() -> bool:
    """Whether this library has the batch poll mode (``reconcile.poll_due`` registered)."""
    import subprocess
    import sys

    probe = subprocess.run(
        [sys.executable, "-c", "from reconcile.celery_app import app; "
         "import sys; sys.exit(0 if 'reconcile.poll_due' in app.tasks else 3)"],
        cwd=ROOT, capture_output=True, text=True)
    return probe.returncode == 0


# each run waits for completions until this long after t0 (the generations end at t0 + 30 s
# + up to one interval): 65 s measures every overhead up to ≈ 6 intervals exactly; a job still
# in flight then counts at its overhead so far (a lower bound, reported as "≥") — make
# bench-full waits much longer
CAP_S = 65.0
FULL_CAP_S = 400.0


def run(n: int = 2000, quick: bool = False, timeout: float = CAP_S,
        knee: int | None = 400, batch_sizes: tuple[int, ...] = (2000, 10_000),
        batch: bool | None = None) -> dict[str, Any]:
    """``n`` generations in chain mode, then (``knee``) a smaller load the worker can poll on
    time, then the batch mode at ``batch_sizes`` (when available, or forced by ``batch``).
    ``timeout``: each run's cap, in seconds after t0 (:data:`CAP_S`)."""
    n = min(n, 200) if quick else n
    lease = poll_lease_seconds("kie-standard")
    result: dict[str, Any] = {"jobs": n, "generation_s": GENERATION_S, "kind": "kie-standard",
                              "poll_interval_s": INTERVAL_S, "time_scale": 1.0,
                              "poll_lease_s": lease,
                              "worker": "1 worker, prefork -c 2", "runs": {}}
    available = batch_available() if batch is None else batch
    result["runs"][str(n)] = _run_once(n, timeout, "reconcile.celery_app", {})
    if knee and not quick and not available:  # the batch runs take its time in the budget
        result["runs"][str(knee)] = _run_once(knee, timeout, "reconcile.celery_app", {})
    result["batch"] = {"available": available, "runs": {}}
    if available:
        for size in ((min(batch_sizes), ) if quick else batch_sizes):
            size = min(size, 200) if quick else size
            try:
                result["batch"]["runs"][str(size)] = _run_once(
                    size, timeout, "reconcile.celery_app",
                    {"RECONCILE_POLL_MODE": "batch"}, mode="batch")
            except Exception as exc:  # recorded, the chain figures stay
                result["batch"]["runs"][str(size)] = {"error": f"{type(exc).__name__}: {exc}"}
    else:
        result["batch"]["note"] = ("not available: this library has no `reconcile.poll_due` "
                                   "task (RECONCILE_POLL_MODE=batch not merged)")
    head = result["runs"][str(n)]
    result["headline"] = {k: head[k] for k in (
        "overhead_s", "overhead_in_poll_intervals", "worker_slots_held", "seed_design_slots",
        "polls_per_s_achieved", "polls_per_s_demanded", "poll_ms_in_flight",
        "cpu_ms_per_poll", "lease_margin")}
    result["target"] = "p99 overhead <= 2 poll intervals (10 s) with 2 worker slots"
    return result


def _run_once(n: int, timeout: float, app: str, extra_env: dict[str, str],
              mode: str = "chain") -> dict[str, Any]:
    from reconcile.db.session import make_engine
    from reconcile.testing.simulator import Script, Simulator

    purge_broker()
    lease = poll_lease_seconds("kie-standard")
    with throwaway_db("capacity") as (url, _), tempfile.TemporaryDirectory() as tmp, \
            Simulator() as sim:
        engine = make_engine(url)
        db_name = url.rsplit("/", 1)[-1]
        users = [uuid.uuid4() for _ in range(USERS)]
        job_ids = [uuid.uuid4() for _ in range(n)]
        env = worker_env(url, sim.env(), Path(tmp) / "media", **extra_env)
        worker = Proc.worker(env, Path(tmp) / "worker.log", concurrency=2, app=app)
        beat = None
        try:
            reads = _record_reads(sim)
            worker.wait_ready()
            sender = make_sender()
            # seconds to seed and publish every first message before t0 (the slack is logged
            # and kept: a negative one means the chains started late)
            lead = 6.0 + n / (500 if mode == "chain" else 800)
            offsets = [INTERVAL_S * i / n for i in range(n)]
            tasks = []
            t0_mono = time.monotonic() + lead
            t0_wall = datetime.now(UTC) + timedelta(seconds=lead)
            for job_id, s in zip(job_ids, offsets, strict=True):
                shift = t0_mono + s - sim.now()  # the simulator's clock is time.monotonic
                sim.script(str(job_id), Script(timeline=(
                    (0.0, "queued"), (shift + 1.0, "running"), (shift + GENERATION_S, "succeeded"))))
                task_id = "task_m_" + sim.new_id(16, "0123456789abcdef")
                sim.create(provider="kie", api="kie-market", model="m", task_id=task_id,
                           callback_url=None, body={"model": "m", "input": {"prompt": "bench"}},
                           job_id=str(job_id))
                tasks.append(task_id)
            with engine.begin() as conn:
                add_users(conn, users)
                add_inflight_jobs(conn, [(j, users[i % USERS], t) for i, (j, t) in
                                         enumerate(zip(job_ids, tasks, strict=True))],
                                  kind="kie-standard", model="m", started=t0_wall,
                                  lease=t0_wall + timedelta(minutes=10))
            if mode == "batch":  # the batch poller finds them by their due time
                with engine.begin() as conn:
                    conn.execute(text(
                        "UPDATE jobs SET poll_due_at = d.due FROM unnest(CAST(:ids AS uuid[]), "
                        "CAST(:dues AS timestamptz[])) AS d(id, due) WHERE jobs.id = d.id"),
                        {"ids": [str(j) for j in job_ids],
                         "dues": [t0_wall + timedelta(seconds=s + INTERVAL_S) for s in offsets]})
                beat = Proc.beat(env, Path(tmp) / "beat.log", Path(tmp) / "beat-schedule")
            else:
                for job_id, s in zip(job_ids, offsets, strict=True):
                    countdown = max(0.0, t0_mono - time.monotonic()) + s + INTERVAL_S
                    sender.send_task("reconcile.poll", args=[str(job_id), 1, 3],
                                     countdown=countdown)
            slack = t0_mono - time.monotonic()
            log(f"fig3 [{app}]: {n} generations seeded, chains started {slack:.1f}s before t0 "
                f"(cap: t0 + {timeout:.0f} s)")
            rss: list[float] = []
            inflight_peak = 0
            window: dict[str, Any] = {}  # the steady window's CPU and turn counts

            def cpu_snapshot() -> dict[str, Any]:
                with engine.connect() as conn:
                    pg = backend_pids(conn, db_name)
                return {"t": time.monotonic(), "turns": reads.count(),
                        "worker": process_cpu_seconds(process_tree(worker.proc.pid)),
                        "postgres": process_cpu_seconds(pg),
                        "bench": process_cpu_seconds([os.getpid()])}

            def done() -> bool:
                nonlocal inflight_peak
                now_m = time.monotonic()
                if "start" not in window and now_m >= t0_mono + INTERVAL_S + 1.0:
                    window["start"] = cpu_snapshot()
                if "start" in window and "end" not in window and \
                        now_m >= t0_mono + GENERATION_S - 0.5:
                    window["end"] = cpu_snapshot()
                children = _children(worker.proc.pid)
                rss.append(_rss_mb(worker.proc.pid) + sum(_rss_mb(c) for c in children))
                with engine.connect() as conn:
                    left = int(conn.execute(text(
                        "SELECT count(*) FROM jobs WHERE status IN ('pending', 'processing')")
                    ).scalar_one())
                if time.monotonic() >= t0_mono + INTERVAL_S:
                    inflight_peak = max(inflight_peak, left)
                return left == 0

            finished = wait_until(done, max(1.0, t0_mono + timeout - time.monotonic()),
                                  interval=1.0)
            wall = time.monotonic() - t0_mono
            end_wall = datetime.now(UTC)
            log_text = worker.text()
            child_rss = [_rss_mb(c) for c in _children(worker.proc.pid)]
        finally:
            if beat is not None:
                beat.stop()
            worker.stop()
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT id, status, completed_at FROM jobs")).all()
        engine.dispose()
    offset_of = dict(zip(job_ids, offsets, strict=True))
    task_of = dict(zip(job_ids, tasks, strict=True))
    completed_rows = [r for r in rows if r.status == "completed" and r.completed_at is not None]
    overheads = [(r.completed_at - t0_wall).total_seconds() - offset_of[r.id] - GENERATION_S
                 for r in completed_rows]
    # a job still in flight at the cap: its overhead is at least the time so far past its end
    done_ids = {r.id for r in completed_rows}
    censored = [max(0.0, (end_wall - t0_wall).total_seconds() - offset_of[j] - GENERATION_S)
                for j in job_ids if j not in done_ids]
    over_all = summary(overheads + censored, 2)
    runtimes = task_runtimes(log_text)
    polls = [(sec, out) for name, sec, out in runtimes if name == "reconcile.poll"]
    ticks = [(sec, out) for name, sec, out in runtimes if name == "reconcile.poll_due"]
    busy = sum(sec for _, sec, _ in runtimes)
    over = over_all if censored else summary(overheads, 2)
    lower = {q: bool(censored) and len(censored) > (1.0 - {"p50": 0.5, "p90": 0.9, "p99": 0.99}[q])
             * n for q in ("p50", "p90", "p99")}
    timeline = reads.timeline()
    n_reads = sum(len(v) for v in timeline.values())
    # the overhead split at the read that saw the upstream finished: read lag (upstream done →
    # that read) + write (that read → completed_at stored)
    lag, write = [], []
    for r, total in zip(completed_rows, overheads, strict=True):
        done_at = t0_mono + offset_of[r.id] + GENERATION_S
        seen = next((t for t, state in timeline.get(task_of[r.id], ()) if state == "succeeded"),
                    None)
        if seen is not None:
            lag.append(seen - done_at)
            write.append(total - (seen - done_at))
    # per job: the spacing of its reads while in flight, the first read's lateness against its
    # first due time (start + one interval), the worst gap between two reads
    spacing, first_late, worst = [], [], []
    for job_id in job_ids:
        times = [t for t, state in timeline.get(task_of[job_id], ()) if state != "succeeded"]
        if times:
            first_late.append(times[0] - (t0_mono + offset_of[job_id] + INTERVAL_S))
        gaps_ = [b - a for a, b in zip(times, times[1:], strict=False)]
        spacing += gaps_
        if gaps_:
            worst.append(max(gaps_))
    out: dict[str, Any] = {
        "app": app, "mode": mode, "finished": finished, "completed": len(overheads),
        "cap_s_after_t0": timeout, "seeded_before_t0_s": round(slack, 1),
        "still_in_flight_at_cap": len(censored),
        # a percentile is a lower bound ("≥") when more jobs than its tail were still in flight
        "overhead_lower_bound": lower,
        "overhead_s": over,
        "overhead_in_poll_intervals": {"p50": round(over["p50"] / INTERVAL_S, 2),
                                       "p99": round(over["p99"] / INTERVAL_S, 2)}
        if overheads else None,
        "overhead_split_s": {
            "read_lag": summary(lag, 2), "write": summary(write, 2),
            "note": "read lag = the first read that saw the upstream succeeded − the upstream's "
                    "end; write = completed_at − that read (the finalize's own time and wait)"},
        "read_spacing_s": summary(spacing, 2),
        "first_read_late_s": summary(first_late, 2),
        "wall_s_from_t0": round(wall, 1),
        "in_flight_peak_sampled": inflight_peak,
        "worker_slots_held": 2,
        "seed_design_slots": n,
        # status reads = requests the simulator answered for these tasks (both modes)
        "status_reads": n_reads,
        "poll_tasks": len(polls), "polls_per_job": round(n_reads / n, 2),
        "poll_ms_in_flight": summary([sec * 1000 for sec, o in polls if o == "in_flight"], 1),
        "poll_ms_completing": summary([sec * 1000 for sec, o in polls if o == "completed"], 1),
        "polls_per_s_achieved": round(n_reads / wall, 1) if wall else None,
        "polls_per_s_demanded": round(n / INTERVAL_S, 1),
        "slot_busy_share": round(busy / (2 * wall), 2) if wall else None,
        "worker_rss_mb_peak": round(max(rss), 1) if rss else None,
        "pool_child_rss_mb": [round(x, 1) for x in child_rss],
        "fenced_polls": sum(1 for _, o in polls if o == "fenced"),
        "overhead_sorted_sample": [round(x, 2) for x in
                                   sorted(overheads)[::max(1, len(overheads) // 200)]],
    }
    if mode == "batch":
        claimed = [int(m.group(1)) for _, o in ticks
                   if (m := re.search(r"claimed=(\d+)", o)) is not None]
        out["poll_due_runs"] = {
            "runs": len(ticks), "ms": summary([sec * 1000 for sec, _ in ticks], 1),
            "claimed_per_run": summary(claimed, 1),
            "runs_with_more": sum(1 for _, o in ticks if o.endswith(" more")),
            "ticks_expired_or_revoked": len(re.findall(
                r"(?im)^.*(?:revoked|expired).*reconcile\.poll_due.*$", log_text))}
    out["cpu_ms_per_poll"] = _cpu_split(window)
    worst.sort()
    batch_mode = mode == "batch"
    out["lease_margin"] = {
        "poll_lease_s": lease,
        "jobs_sampled": len(worst),
        "worst_gap_between_turns_s": summary(worst, 2),
        # batch mode: the sweep never resumes a row with a due time (reconcile.sweep), so no gap makes a
        # false resume; the gap is still the figure that matters (how stale a row gets)
        "jobs_past_lease_false_resumes": None if batch_mode else sum(1 for g in worst if g > lease),
        "false_resumes_at_candidate_leases": {
            f"{c:g}": None if batch_mode else sum(1 for g in worst if g > c)
            for c in CANDIDATE_LEASES},
        "note": "per job, the worst time between two of its status reads while in flight (every "
                "read the simulator answered, exact); chain mode: a job past the lease would have "
                "been resumed by a sweep tick while its chain was alive; batch mode: n/a (a row "
                "with a due time is never resumed)"}
    if child_rss:
        per = sum(child_rss) / len(child_rss)
        out["seed_design_memory_gb_estimate"] = round(per * n / 1024.0, 1)
    keep = os.environ.get("RECONCILE_BENCH_KEEP_LOGS")
    if keep:  # the worker log and the read timeline, for a closer look (not in the report)
        Path(keep).mkdir(parents=True, exist_ok=True)
        (Path(keep) / f"fig3_{mode}_{n}_worker.log").write_text(log_text)
        import json

        (Path(keep) / f"fig3_{mode}_{n}_reads.json").write_text(json.dumps({
            "t0_mono": t0_mono, "offsets": {task_of[j]: offset_of[j] for j in job_ids},
            "reads": timeline}))
    log(f"fig3 [{app} {mode}]: overhead p50 {over.get('p50')} s p99 {over.get('p99')} s "
        f"(read lag p50 {out['overhead_split_s']['read_lag'].get('p50')} s, write p50 "
        f"{out['overhead_split_s']['write'].get('p50')} s), read spacing p50 "
        f"{out['read_spacing_s'].get('p50')} s, {out['polls_per_s_achieved']} reads/s, "
        f"busy {out['slot_busy_share']}")
    return out


class _Reads:
    """Every status read the in-process simulator answers: (time.monotonic(), state) per task
    id (from the server's threads)."""

    def __init__(self) -> None:
        self._by_task: dict[str, list[tuple[float, str]]] = {}
        self._n = 0
        self._lock = threading.Lock()

    def add(self, task_id: str, state: str) -> None:
        with self._lock:
            self._by_task.setdefault(task_id, []).append((time.monotonic(), state))
            self._n += 1

    def count(self) -> int:
        return self._n

    def timeline(self) -> dict[str, list[tuple[float, str]]]:
        return {k: list(v) for k, v in list(self._by_task.items())}


def _record_reads(sim: Any) -> _Reads:
    reads = _Reads()
    lookup = sim.lookup

    def recorded(task_id: str, *apis: str) -> Any:
        found = lookup(task_id, *apis)
        reads.add(task_id, found[1] if found is not None else "unknown")
        return found

    sim.lookup = recorded
    return reads
