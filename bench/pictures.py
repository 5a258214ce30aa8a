"""PNG pictures beside ``latest.md`` (matplotlib, the ``bench`` extra), drawn from the JSON
results of the same run. The text charts in the report stay: the pictures are for reading on a
screen, the text for a diff.

Each picture is drawn only when its figure ran and succeeded; :func:`draw` returns the file
names it wrote, keyed by figure, and the report embeds those.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _result(res: dict[str, Any], key: str) -> dict[str, Any] | None:
    entry = res.get("figures", {}).get(key) or {}
    return entry.get("result")


def draw(res: dict[str, Any], out: Path) -> dict[str, str]:
    """Write the PNGs into ``out``; returns {figure key: file name}. Without matplotlib,
    nothing (the report says so)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return {}
    written: dict[str, str] = {}
    for key, fn in (("fig1", _sweep_walk), ("fig2", _drain), ("fig3", _overhead),
                    ("fig4", _ledger), ("fig6", _recovery)):
        r = _result(res, key)
        if not r:
            continue
        try:
            fig = fn(plt, r)
        except (KeyError, TypeError, ValueError, IndexError):
            continue  # a picture never fails the run; the text chart is still there
        if fig is None:
            continue
        name = f"{key}.png"
        fig.savefig(out / name, dpi=110, bbox_inches="tight")
        plt.close(fig)
        written[key] = name
    return written


def _sweep_walk(plt: Any, r: dict[str, Any]) -> Any:
    sizes = list(r["sizes"])
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    variants = [v for v in ("shipped", "with_single_col_idx")
                if all("tick_walk" in r["sizes"][s]["variants"].get(v, {}) for s in sizes)]
    labels = {"shipped": "shipped (keyset index only, since 0022)",
              "with_single_col_idx": "with jobs_inflight_idx too (before 0022)"}
    xs = [int(s) for s in sizes]
    for v in variants:
        ax.plot(xs, [r["sizes"][s]["variants"][v]["tick_walk"]["total_ms"] for s in sizes],
                marker="o", label=labels[v])
    est = [r["sizes"][s]["variants"].get("no_inflight_idx", {}).get("tick_walk_estimate")
           for s in sizes]
    if all(est):
        ax.plot(xs, [e["ms"] for e in est], marker="x", linestyle="--",
                label="no in-flight index (estimate)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("rows in jobs (10,000 in flight)")
    ax.set_ylabel("whole tick walk, ms (fetch only)")
    ax.set_title("Figure 1 — sweep walk vs history size")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def _drain(plt: Any, r: dict[str, Any]) -> Any:
    curve = r["curve"]
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    ax.plot([p[0] for p in curve], [p[1] for p in curve], marker=".", label="reconcile")
    seed = r.get("seed_cron_jobs_per_s", 50 / 300.0)
    end = curve[-1][0] if curve else 1.0
    ax.plot([0, end], [0, seed * end], linestyle="--", label="seed cron (50 rows / 5 min)")
    ax.set_xlabel("seconds since the sweep was sent")
    ax.set_ylabel("jobs completed")
    ax.set_title(f"Figure 2 — drain of {r['jobs']:,} stale jobs: {r['jobs_per_s']} jobs/s")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def _overhead(plt: Any, r: dict[str, Any]) -> Any:
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    runs = [(f"chain, {int(n):,}", v) for n, v in r["runs"].items()]
    runs += [(f"batch, {int(n):,}", v) for n, v in (r.get("batch") or {}).get("runs", {}).items()
             if "overhead_sorted_sample" in v]
    for label, v in runs:
        sample = v.get("overhead_sorted_sample") or []
        if not sample:
            continue
        ys = [i / max(1, len(sample) - 1) for i in range(len(sample))]
        ax.plot(sample, ys, label=label)
    ax.axvline(2 * r["poll_interval_s"], color="grey", linestyle=":", label="aim: p99 ≤ 2 intervals")
    ax.set_xlabel("completion overhead, s (completed_at − upstream end)")
    ax.set_ylabel("share of jobs (CDF)")
    ax.set_title("Figure 3 — overhead distribution, 1 worker -c 2")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def _ledger(plt: Any, r: dict[str, Any]) -> Any:
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for k, v in r["runs"].items():
        ax.plot(range(1, len(v["per_second"]) + 1), v["per_second"], marker=".", label=k)
    ax.set_xlabel("second of the run")
    ax.set_ylabel("cycles/s (reserve + commit|refund)")
    ax.set_title(f"Figure 4 — ledger cycles/s, {r['clients']} clients "
                 f"(pgbench {r['pgbench_tps_mean']} tps)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def _recovery(plt: Any, r: dict[str, Any]) -> Any:
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    scale = r["time_scale"]
    for name, c in r["configs"].items():
        vals = sorted(x / scale for rd in c["rounds"] for x in rd["latencies_real_s"])
        if vals:
            ax.plot(vals, [i / max(1, len(vals) - 1) for i in range(len(vals))], marker=".",
                    label=f"measured, {name}")
    ax.axvline(60, color="grey", linestyle=":", label="aim at 30 s sweeps: p99 ≤ 60 s")
    ax.set_xlabel("kill → resumed chain's first poll, production-equivalent s")
    ax.set_ylabel("share of dead chains (CDF)")
    ax.set_title("Figure 6 — recovery after SIGKILL of a whole worker")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return fig
