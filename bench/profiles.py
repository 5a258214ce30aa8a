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


def summarise(profile: cProfile.Profile, units: int, title: str, unit: str,
              wall: float, cpu: float) -> tuple[str, dict[str, Any]]:
    stats = pstats.Stats(profile, stream=io.StringIO())
    cum, own = _rows(stats, "cum", units), _rows(stats, "self", units)
    lines = [f"# {title}", "",
             f"{units} {unit}s profiled in {wall:.2f} s wall, {cpu:.2f} s process CPU "
             f"(profiler on: {1000 * cpu / max(units, 1):.2f} ms CPU per {unit}); timer: "
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
                                     "top_cumulative": cum[:12], "top_self": own[:12]}


def profiled(fn: Callable[[], int], out: Path, title: str, *, unit: str) -> dict[str, Any]:
    """Run ``fn`` (it returns the units of work it did) under cProfile; write the summary to
    ``out``; return the summary's head for latest.json."""
    # the calling thread's CPU time, not wall time: on a shared, loaded machine wall time is
    # mostly waiting for a core; the question is where this process spends its CPU
    profile = cProfile.Profile(time.thread_time)
    wall0, cpu0 = time.monotonic(), time.process_time()
    profile.enable()
    try:
        units = fn()
    finally:
        profile.disable()
    wall, cpu = time.monotonic() - wall0, time.process_time() - cpu0
    text, head = summarise(profile, units, title, unit, wall, cpu)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    head["file"] = str(out)
    return head
