"""``make bench-peers-profile``: where each system's worker CPU goes on the peers workload.

    python -m bench.peers.profile [--jobs 2000] [--systems plain-celery,reconcile-batch]

For each system, one throughput run of :mod:`bench.peers.run` (quiet host, no recovery run, no
machine limits) with py-spy attached to the Celery worker (its pool processes included) from
start to stop, sampling only threads that hold the GIL: Python's CPU, C code called with the GIL
held (JSON, psycopg's parsing) included, waits on sockets and locks excluded. Every sample is
put in one **layer**, by the file of its innermost frame (the HTTP client, SQLAlchemy, psycopg,
Celery, the library, the peer's own code, …), and in one **phase**, by the first step of the
job's life its stack is inside (create, status reads, finalize, …). Writes
``bench/results/profiles/peers_workers.{json,md}``.

The sampler slows the workers, so the run's jobs/s is not a figure; the split is. A layer's
``ms/job`` is its samples ÷ the sampling rate ÷ the jobs. py-spy must be able to attach
(``ptrace``): it is in the ``bench`` extra; where attaching is refused the system is reported
as not profiled.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from ..common import ROOT, log

OUT = Path(__file__).resolve().parents[1] / "results" / "profiles"
RATE = 50  # samples per second per thread: low enough not to starve a 2-core host

# (layer, path fragments of the innermost frame's file); the first that matches wins
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("HTTP client (requests, urllib3, http.client)",
     ("/requests/", "/urllib3/", "/http/client.py", "/http/cookiejar.py", "/email/",
      "/idna/", "/charset_normalizer/", "/certifi/")),
    ("SQLAlchemy", ("/sqlalchemy/",)),
    ("psycopg", ("/psycopg/", "/psycopg_binary/")),
    ("Celery, kombu, billiard", ("/celery/", "/kombu/", "/billiard/", "/vine/", "/click/")),
    ("Redis client", ("/redis/",)),
    ("JSON, pydantic", ("/json/", "/pydantic/", "/pydantic_core/")),
    ("logging", ("/logging/",)),
    ("threads, queues", ("/threading.py", "/queue.py", "/concurrent/futures/")),
    ("the peer's own code", ("/bench/peers/",)),
    ("the library (reconcile)", ("/reconcile/",)),
)

# (phase, function names that mark it), in priority order: a stack is in the first phase one of
# whose names appears in it (finalize runs inside a poll_due tick, so it is named first)
PHASES: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    "reconcile": (
        ("finalize (download, store, complete)", ("finalize_job_with_media",)),
        ("create", ("create_step",)),
        ("status reads", ("read_status",)),
        ("status reads: the thread pool around them", ("_worker",)),
        ("poll_due (claim, write back)", ("poll_due", "stalled")),
        ("sweep, heartbeat", ("sweep", "reconcile_jobs", "beat", "reap")),
    ),
    "plain": (
        ("finalize (download, store, complete)", ("download", "complete", "_fail")),
        ("create", ("create_job",)),
        ("status reads", ("status",)),
        ("poll (retry, reschedule)", ("poll_job",)),
    ),
}
COMMON_PHASES = (
    ("start-up and imports", ("_find_and_load", "setup_instance", "find_app")),
    ("Celery: the task wrapper", ("trace_task",)),
    ("Celery: the consumer (main process)", ("asynloop", "Consumer.start")),
    ("Celery: the pool process loop", ("workloop",)),
)


def _frames(stack: str) -> list[str]:
    """The frames of one collapsed py-spy stack (``-f raw``), outermost first, without the
    ``process …`` and thread headers."""
    return [f for f in stack.split(";") if f and not f.startswith(("process ", "thread "))]


def _file(frame: str) -> str:
    """``func (path:line)`` → ``path``."""
    start, end = frame.rfind(" ("), frame.rfind(")")
    if start < 0 or end < start:
        return ""
    return frame[start + 2:end].rsplit(":", 1)[0]


def _function(frame: str) -> str:
    start = frame.rfind(" (")
    return (frame[:start] if start >= 0 else frame).rsplit(".", 1)[-1]


def layer_of(frames: list[str]) -> str:
    # py-spy names a file by its path under site-packages or the checkout (``requests/…``)
    # or by its full path: matched on whole components either way
    path = "/" + (_file(frames[-1]) if frames else "").lstrip("/")
    for name, fragments in LAYERS:
        if any(fragment in path for fragment in fragments):
            return name
    return "other (the interpreter, stdlib)"


def phase_of(frames: list[str], family: str) -> str:
    names = {_function(f) for f in frames}
    for phase, markers in (*PHASES[family], *COMMON_PHASES):
        if names.intersection(markers):
            return phase
    return "other"


def breakdown(raw: str, family: str, jobs: int, rate: float = RATE) -> dict[str, Any]:
    """A py-spy raw (collapsed) profile's samples by layer and by phase: each ``{name:
    {"samples", "share", "ms_per_job"}}``, largest first. ``jobs``: more than none."""
    layers: Counter[str] = Counter()
    phases: Counter[str] = Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = _frames(stack)
        if not frames:
            continue
        n = int(count)
        total += n
        layers[layer_of(frames)] += n
        phases[phase_of(frames, family)] += n

    def table(counter: Counter[str]) -> dict[str, dict[str, float]]:
        return {name: {"samples": n, "share": round(n / total, 3),
                       "ms_per_job": round(n / rate / jobs * 1000, 2)}
                for name, n in counter.most_common()}

    return {"samples": total, "rate_hz": rate, "jobs": jobs,
            "ms_per_job": round(total / rate / jobs * 1000, 2),
            "layers": table(layers), "phases": table(phases)}


def _worker_pid(parent: int, app: str, timeout: float = 120.0) -> int | None:
    """The main process of the Celery worker of ``app`` that ``parent`` started (a descendant)."""
    import psutil

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            for child in psutil.Process(parent).children(recursive=True):
                cmd = " ".join(child.cmdline())
                parent_of = child.parent()
                # the worker's main process: its pool processes have its command line and it
                # as their parent
                if (f"-A {app}" in cmd and " worker" in cmd and parent_of is not None
                        and f"-A {app}" not in " ".join(parent_of.cmdline())):
                    return int(child.pid)
        except psutil.Error:
            pass
        time.sleep(0.2)
    return None


def profiled_systems() -> list[str]:
    """The peers this profiler can sample: the Celery ones (their worker is found by its
    ``celery -A`` app; DBOS has none)."""
    from .run import ALL, systems

    known = []
    for name in ALL:
        try:
            (peer,) = systems([name])
        except ImportError:  # a peer whose package is not installed (the bench extra)
            continue
        if peer.celery_app is not None:
            known.append(name)
    return known


def profile(system: str, jobs: int, keep_raw: Path | None = None) -> dict[str, Any]:
    from .run import systems

    (peer,) = systems([system])
    app, family = peer.celery_app, peer.family
    assert app is not None, f"{system} is not a Celery system"
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if spy is None:
        return {"error": "py-spy is not installed (pip install -e '.[bench]')"}
    with tempfile.TemporaryDirectory(prefix="bench-peers-profile-") as tmp:
        run = subprocess.Popen(
            [sys.executable, "-m", "bench.peers.run", "--jobs", str(jobs), "--systems", system,
             "--no-recovery", "--no-limits", "--out", tmp], cwd=ROOT,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        pid = _worker_pid(run.pid, app)
        raw_path = Path(tmp) / f"peers_{system}.raw"
        sampler = None
        if pid is not None:  # its own output to a file: a pipe nobody reads could fill
            with open(Path(tmp) / "py-spy.log", "w") as spy_log:
                sampler = subprocess.Popen(
                    [spy, "record", "--pid", str(pid), "--subprocesses", "--gil",
                     "--nonblocking", "-r", str(RATE), "-d", "3600", "-f", "raw",
                     "-o", str(raw_path)], stdout=spy_log, stderr=subprocess.STDOUT)
        output, _ = run.communicate(timeout=1800)
        if sampler is not None:
            try:
                sampler.wait(timeout=60)  # py-spy stops when the worker does
            except subprocess.TimeoutExpired:
                sampler.send_signal(signal.SIGINT)
                sampler.wait(timeout=30)
        written = Path(tmp) / "peers.json"
        if not written.exists():
            return {"error": f"the run wrote no results (exit {run.returncode})",
                    "log_tail": output[-2000:]}
        measured = json.loads(written.read_text())
        raw = raw_path.read_text(errors="replace") if raw_path.exists() else None
    if keep_raw is not None and raw is not None:
        keep_raw.mkdir(parents=True, exist_ok=True)
        (keep_raw / f"peers_{system}.raw").write_text(raw)
    result = measured["passes"]["quiet"]["runs"][str(jobs)][system]
    if "error" in result or not result.get("completed"):
        return {"error": "the run failed: " + str(result.get("error", "no job completed"))[-500:]}
    summary = {k: result.get(k) for k in ("completed", "jobs_per_s", "cpu_ms_per_job")}
    if pid is None or raw is None:
        return {"error": "the worker was not found or py-spy could not attach (ptrace)",
                "run": summary, "log_tail": output[-2000:]}
    return {"run": summary, **breakdown(raw, family, int(result["completed"]))}


def report(res: dict[str, Any]) -> str:
    lines = ["# Where the workers' CPU goes, on the peers workload",
             "",
             f"`python -m bench.peers.profile --jobs {res['jobs']}` at `{res['git_head']}`, "
             f"{res['date_utc']} UTC; load average at the start {res['loadavg_start']}. "
             "py-spy, GIL-holding samples of the Celery worker and its pool processes, "
             f"{RATE} Hz, the whole run (see `bench/peers/profile.py`). `ms/job` = samples ÷ "
             "rate ÷ jobs; the sampler slows the run, so its jobs/s is not a figure.", ""]
    for system, r in res["systems"].items():
        lines.append(f"## {system}")
        lines.append("")
        if "error" in r:
            lines += [f"Not profiled: {r['error']}.", ""]
            continue
        run = r["run"]
        lines.append(f"{r['samples']} samples = **{r['ms_per_job']} ms/job** of Python CPU "
                     f"in the workers (the run's psutil figure, everything the worker processes "
                     f"used: {run['cpu_ms_per_job'].get('workers')} ms/job).")
        lines.append("")
        for title, key in (("layer (innermost frame)", "layers"), ("phase", "phases")):
            lines += [f"| {title} | share | ms/job |", "|---|---|---|"]
            lines += [f"| {name} | {v['share'] * 100:.1f} % | {v['ms_per_job']} |"
                      for name, v in r[key].items()]
            lines.append("")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from .run import environment

    ap = argparse.ArgumentParser(prog="python -m bench.peers.profile")
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--systems", default="plain-celery,reconcile-batch")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--keep-raw", type=Path, default=None,
                    help="a folder for py-spy's raw (collapsed) stacks, one file per system")
    args = ap.parse_args(argv)
    systems = args.systems.split(",")
    known = profiled_systems()
    unknown = [name for name in systems if name not in known]
    if unknown:  # before any run, not after the first ones
        raise SystemExit(f"unknown system(s) {unknown}: one of {', '.join(known)}")
    args.out.mkdir(parents=True, exist_ok=True)
    env = environment()
    res: dict[str, Any] = {"jobs": args.jobs, "git_head": env["git_head"],
                           "date_utc": env["date_utc"], "loadavg_start": env["loadavg_start"],
                           "systems": {}}
    for system in systems:
        log(f"peers profile: {system}, {args.jobs} jobs")
        res["systems"][system] = profile(system, args.jobs, args.keep_raw)
    (args.out / "peers_workers.json").write_text(json.dumps(res, indent=1) + "\n")
    (args.out / "peers_workers.md").write_text(report(res))
    log(f"wrote {args.out / 'peers_workers.md'}")
    return 0 if all("error" not in r for r in res["systems"].values()) else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
