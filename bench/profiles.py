"""cProfile summaries for the figures whose aim is missed (issue 16: explain each miss with a
profile, not a guess). Each summary is a short text file under ``bench/results/profiles/``:
the top functions by cumulative and by self time, per unit of work (poll, job, cycle).

The timer is the profiled thread's CPU time (``time.thread_time``): waiting on PostgreSQL, the
simulator or a core does not count, so the columns say where this process burns its CPU.
cProfile inflates calls: read the columns as shares of the profiled work, not as absolute time.
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

TOP = 25


def _short(path: str) -> str:
    for marker in ("site-packages/", "/reconcile/", "/bench/", "/lib/python3"):
        if marker in path:
            return marker.strip("/") + "/" + path.split(marker, 1)[1] if marker != "site-packages/" \
                else path.split(marker, 1)[1]
    return path


def _rows(stats: pstats.Stats, key: str, units: int) -> list[dict[str, Any]]:
    entries = stats.stats  # type: ignore[attr-defined]
    total = max(sum(v[2] for v in entries.values()), 1e-9)
    order = sorted(entries.items(), key=lambda kv: kv[1][3 if key == "cum" else 2], reverse=True)
    out = []
    for (file, line, name), (_cc, ncalls, tt, ct, _callers) in order[:TOP]:
        out.append({"function": f"{_short(file)}:{line}({name})", "calls": ncalls,
                    "calls_per_unit": round(ncalls / max(units, 1), 2),
                    "cum_ms_per_unit": round(1000 * ct / max(units, 1), 3),
                    "self_ms_per_unit": round(1000 * tt / max(units, 1), 3),
                    "self_share": round(tt / total, 3)})
    return out


def summarise(stats: pstats.Stats, units: int, title: str, unit: str,
              wall: float, cpu: float) -> tuple[str, dict[str, Any]]:
    cum, own = _rows(stats, "cum", units), _rows(stats, "self", units)
    lines = [f"# {title}", "",
             f"{units} {unit}s profiled in {wall:.2f} s wall, {cpu:.2f} s process CPU "
             f"(profiler on: {1000 * cpu / max(units, 1):.2f} ms process CPU per {unit}); timer: "
             f"this thread's CPU time; "
             f"load average {os.getloadavg()[0]:.2f} at the end.", "",
             f"## top {TOP} by cumulative time (ms per {unit})", "",
             f"{'cum':>9} {'self':>9} {'calls/' + unit:>11}  function"]
    lines += [f"{r['cum_ms_per_unit']:9.3f} {r['self_ms_per_unit']:9.3f} "
              f"{r['calls_per_unit']:11.2f}  {r['function']}" for r in cum]
    lines += ["", f"## top {TOP} by self time (ms per {unit}; share of all profiled self time)",
              "", f"{'self':>9} {'share':>6} {'calls/' + unit:>11}  function"]
    lines += [f"{r['self_ms_per_unit']:9.3f} {100 * r['self_share']:5.1f}% "
              f"{r['calls_per_unit']:11.2f}  {r['function']}" for r in own]
    return "\n".join(lines) + "\n", {"units": units, "unit": unit, "wall_s": round(wall, 2),
                                     "cpu_ms_per_unit": round(1000 * cpu / max(units, 1), 3),
                                     "top_cumulative": cum, "top_self": own[:12]}


# where the time goes, by layer: (label, file suffix, function); a layer's time is the largest
# cumulative time among its entries (an outer call includes its inner ones)
LAYERS: tuple[tuple[str, str, str], ...] = (
    ("every SQL statement, ORM or Core (engine Connection._execute_context: cache, driver, "
     "result)", "sqlalchemy/engine/base.py", "_execute_context"),
    ("  ORM statements, whole (Session.execute, includes their share of the line above)",
     "sqlalchemy/orm/session.py", "execute"),
    ("  statement compiles (Compiled.__init__: SQL cache misses)", "sqlalchemy/sql/compiler.py",
     "__init__"),
    ("  of which the driver (psycopg cursor.execute: send, wait, receive, adapt)",
     "psycopg/cursor.py", "execute"),
    ("  of which ORM rows → objects (loading.instances)", "sqlalchemy/orm/loading.py", "instances"),
    ("  of which ORM unit of work (Session.flush)", "sqlalchemy/orm/session.py", "_flush"),
    ("transaction begin/commit (Session.commit)", "sqlalchemy/orm/session.py", "commit"),
    ("all HTTP (requests Session.request)", "requests/sessions.py", "request"),
    ("  of which proxy settings from the environment (merge_environment_settings)",
     "requests/sessions.py", "merge_environment_settings"),
    ("Celery message send (apply_async)", "celery/app/task.py", "apply_async"),
    ("logging", "logging/__init__.py", "_log"),
    ("JSON (json.dumps + loads)", "json/__init__.py", "dumps"),
)


def layers(merged: pstats.Stats, units: int) -> list[dict[str, Any]]:
    stats = merged.stats  # type: ignore[attr-defined]
    total = max(sum(v[2] for v in stats.values()), 1e-9)
    out = []
    for label, suffix, func in LAYERS:
        cum = max((v[3] for (file, _, name), v in stats.items()
                   if file.endswith(suffix) and name == func), default=0.0)
        if cum:
            out.append({"layer": label, "ms_per_unit": round(1000 * cum / max(units, 1), 3),
                        "share": round(cum / total, 3)})
    return out


def profiled(fn: Callable[[], int], out: Path, title: str, *, unit: str,
             wall_timer: bool = False, threads: bool = False) -> dict[str, Any]:
    """Run ``fn`` (it returns the units of work it did) under cProfile; write the summary to
    ``out``; return the summary's head for latest.json. ``wall_timer``: profile wall time
    (waits included: round trips, locks) instead of this thread's CPU time."""
    # by default the calling thread's CPU time, not wall time: on a shared, loaded machine wall
    # time is mostly waiting for a core; the question is where this process spends its CPU
    timer = time.perf_counter if wall_timer else time.thread_time
    profile = cProfile.Profile(timer)
    others: list[cProfile.Profile] = []

    def in_new_thread(*_: Any) -> None:  # threading.setprofile: each thread started inside fn
        sys.setprofile(None)
        prof = cProfile.Profile(timer)
        others.append(prof)
        prof.enable()

    if threads:  # fn must start its threads itself, and let them end before it returns
        threading.setprofile(in_new_thread)
    wall0, cpu0 = time.monotonic(), time.process_time()
    profile.enable()
    try:
        units = fn()
    finally:
        profile.disable()
        if threads:
            threading.setprofile(None)  # type: ignore[arg-type]
    wall, cpu = time.monotonic() - wall0, time.process_time() - cpu0
    stats = pstats.Stats(profile, stream=io.StringIO())
    for prof in others:
        stats.add(prof)
    if others:
        title += f" (main thread + {len(others)} threads started inside, merged)"
    text, head = summarise(stats, units, title, unit, wall, cpu)
    if wall_timer:
        text = text.replace("timer: this thread's CPU time", "timer: WALL time (waits included)")
    by_layer = layers(stats, units)
    text += "\n## by layer (cumulative; ms per " + unit + ", share of the profiled time)\n\n"
    text += "\n".join(f"{row['ms_per_unit']:9.3f} {100 * row['share']:5.1f}%  {row['layer']}"
                      for row in by_layer) + "\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    head["layers"] = by_layer
    head["timer"] = "wall" if wall_timer else "thread CPU"
    head["title"] = title
    head["file"] = out.name
    return head
