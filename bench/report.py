"""The Markdown report of one ``make bench`` run (from the JSON results).

``bench/run.py`` writes it after a run; it can be rendered again from a run's JSON without
measuring anything (the pictures already beside the JSON are linked, not redrawn):

    python -m bench.report --from bench/results/latest.json            # → latest.md beside it
    python -m bench.report --from bench/results/latest.json --out -     # → stdout
    python -m bench.report --from bench/results/latest.json --peers bench/results/peers.json

``--peers`` adds a separate ``make bench-peers`` result to the aims table (the side by side
when the run has no figure 10, and the recovery runs figure 10 never has); its rows say so.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from . import aims, charts


def _get(d: Any, *path: Any, default: Any = None) -> Any:
    for key in path:
        if not isinstance(d, dict) or key not in d:
            return default
        d = d[key]
    return d


_verdict = aims.verdict


def _fence(text: str) -> str:
    return f"```text\n{text}\n```\n" if text else ""


def markdown(res: dict[str, Any], pictures: dict[str, str] | None = None, *,
             peers: dict[str, Any] | None = None, default_mode: str | None = None) -> str:
    """The report. ``peers``: a separate ``make bench-peers`` result for the aims figure 10
    lacks; ``default_mode``: the poll mode the verdicts are on (default: the one the run
    recorded, else ``reconcile.Settings().poll_mode``)."""
    pictures = pictures or {}
    env = res["environment"]
    figs = res["figures"]
    mode = default_mode or aims.default_mode(env)
    out: list[str] = []
    out.append("# `make bench` — speed and scale of `reconcile`\n")
    out.append(
        f"Run {env['date_utc']} UTC at `{env['git_head']}` ({env['git_dirty_files']} uncommitted "
        f"files), wall time **{res['wall_seconds']:.0f} s**. Machine: {env['cpus']} CPUs, "
        f"{env['platform']}; PostgreSQL {env['postgresql']}, Redis {env['redis']}, Python "
        f"{env['python']}, Celery {env['celery']}, SQLAlchemy {env['sqlalchemy']}, psycopg "
        f"{env['psycopg']}.\n")
    load0, load1 = env.get("load_at_start", {}), env.get("load_at_end", {})
    commit = env.get("commit_latency_ms", {})
    out.append(
        f"The machine is shared and was busy: load average {load0.get('loadavg_1m')} at the start "
        f"and {load1.get('loadavg_1m')} at the end on {env['cpus']} CPUs (CPU pressure "
        f"some-avg10 {load0.get('cpu_pressure_some_avg10')}% → "
        f"{load1.get('cpu_pressure_some_avg10')}%). One write transaction (BEGIN; UPDATE; COMMIT) "
        f"costs p50 {commit.get('p50')} ms here (a WAL flush). Figures are reported, never "
        f"asserted; where a comparison exists both sides ran in this same run.\n")
    out.append(_walls(res))
    if res["args"].get("quick"):
        out.append("> **--quick run**: sizes are reduced; this report is a smoke test, not the "
                   "figures.\n")

    out.append("## Summary\n")
    out.append("The performance aims, every row from this one run:\n")
    table = aims.table(figs, mode, peers)
    out.extend(table)
    out.append("")
    out.append(f"Verdicts are on the default poll mode (`{mode}`); the other mode is shown "
               "beside it where it was measured. \"not run\": the figure is not in this run; "
               "n/a: its numbers cannot decide (a lower bound under the limit, a partial run)."
               + (" Cells marked *from `make bench-peers`* come from that separate run."
                  if any("not this run" in line for line in table) else "") + "\n")
    out.append("Every figure:\n")
    out.append("| # | figure | measured | aim | verdict |\n|---|---|---|---|---|")
    out.extend(_summary_rows(figs, mode))
    out.append("")
    out.append(_peers(res))
    out.append(_profiles(res.get("profiles_dir")))
    for key, render in (("fig1", _fig1), ("fig2", _fig2), ("fig3", _fig3), ("fig4", _fig4),
                        ("fig5", _fig5), ("fig6", _fig6), ("fig7", _fig7), ("fig8", _fig8),
                        ("fig9", _fig9), ("fig10", _fig10)):
        entry = figs.get(key)
        if entry is None:
            continue
        out.append(f"## {key.removeprefix('fig')}. {entry['title']}\n")
        out.append(f"_{entry['seconds']} s; load {entry['load_before'].get('loadavg_1m')} → "
                   f"{entry['load_after'].get('loadavg_1m')}"
                   + (f"; {entry['overlap']}" if entry.get("overlap") else "") + "._\n")
        if "error" in entry:
            out.append("**This figure failed:**\n")
            out.append(_fence(entry["error"][-3000:]))
            continue
        out.append(render(entry["result"]))
        if key in pictures:
            out.append(f"![{entry['title']}]({pictures[key]})\n")
    if not pictures:
        out.append("_No pictures: matplotlib is not installed (`pip install -e '.[bench]'`)._\n")
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------------------- summary


def _walls(res: dict[str, Any]) -> str:
    """The run's wall time and each figure's, against its budget, with the load beside it."""
    args = res.get("args", {})
    kind = "`make bench-full` (unbounded)" if args.get("full") else (
        "`--quick`" if args.get("quick") else "`make bench` (bounded)")
    rows = [f"**Wall time: {res['wall_seconds']:.0f} s** ({res['wall_seconds'] / 60:.1f} min), "
            f"{kind}. Per figure:\n", "| figure | wall s | expected s (quiet host) | load 1-min before → after |",
            "|---|---|---|---|"]
    for key, e in res["figures"].items():
        rows.append(f"| {key}: {e['title']} | {e['seconds']} | {e.get('budget_s') or '—'} | "
                    f"{e['load_before'].get('loadavg_1m')} → {e['load_after'].get('loadavg_1m')} |")
    rest = res["wall_seconds"] - sum(e["seconds"] for e in res["figures"].values())
    drops = res.get("drop_databases_seconds")
    rows.append("| setup (databases, commit latency, template)"
                + (f", the throwaway databases dropped at the end ({drops} s)" if drops is not None
                   else "") + f" | {rest:.1f} | — | |")
    return "\n".join(rows) + "\n"


def _summary_rows(figs: dict[str, Any], mode: str) -> list[str]:
    """One row per figure of the run; the figures with a performance aim take its target and
    verdict from :mod:`bench.aims` (the aims table), the others keep their own."""
    rows: list[str] = []

    def res(key: str) -> dict[str, Any] | None:
        return aims.result(figs, key)

    r = res("fig1")
    if r:
        h = r["headline"]
        sizes = [k for k in h if k.isdigit()]
        big, small = sizes[-1], sizes[0]
        ok = (h[big]["shipped_p50_ms"] <= 5 and h[big]["speedup_vs_no_inflight_idx"] >= 50
              and h["growth_shipped_small_to_big"] <= 1.5)
        rows.append(
            f"| 1 | sweep candidate query, {int(big):,} rows / 10k in flight | p50 "
            f"{h[big]['shipped_p50_ms']} ms client ({h[big]['server_ms_shipped']} ms server); "
            f"**{h[big]['speedup_vs_no_inflight_idx']}×** faster than without an in-flight index "
            f"({h[big]['no_inflight_idx_p50_ms']} ms); {int(small):,}→{int(big):,} rows: "
            f"×{h['growth_shipped_small_to_big']} (without one ×"
            f"{h['growth_no_inflight_idx_small_to_big']}); whole tick walk "
            f"{h['tick_walk_ms'][small]:.0f} → {h['tick_walk_ms'][big]:.0f} ms "
            f"(×{h['growth_tick_walk_small_to_big']}) | ≤ 5 ms, ≥ 50×, flat | {_verdict(ok)} for "
            f"the first page"
            + ("; the walk is **not** flat, see figure 1 below" if h["growth_tick_walk_small_to_big"] > 1.2
               else "; the walk is flat too") + " |")
    r = res("fig2")
    if r:
        aim = aims.drain(r)
        extra = (f"; 10,000 extrapolated: {r['extrapolated_10000_seconds']} s"
                 if "extrapolated_10000_seconds" in r else "")
        rows.append(
            f"| 2 | backlog drain, {r['jobs']:,} stale jobs, 1 worker -c 2, "
            f"{r.get('mode', 'chain')} mode | **{r['jobs_per_s']} "
            f"jobs/s** ({r['seconds']} s){extra}; seed cron 0.167 jobs/s → "
            f"**×{r['ratio_to_seed_cron']:.0f}**; machine limit (no-op tasks, same worker) "
            f"{_get(r, 'machine_limit_noop', 'tasks_per_s')} tasks/s | {aim.target} | "
            f"{_verdict(aim.ok)} |")
    r = res("fig3")
    if r:
        h = r["headline"]
        iv = h["overhead_in_poll_intervals"] or {}
        aim = aims.in_flight(r, mode)
        rows.append(
            f"| 3 | {r['jobs']:,} concurrent 30-s generations, 1 worker -c 2 | overhead p50 "
            f"{h['overhead_s'].get('p50')} s / p99 {h['overhead_s'].get('p99')} s (= {iv.get('p50')}"
            f" / {iv.get('p99')} poll intervals); **2 slots vs the seed's {h['seed_design_slots']:,}**;"
            f" {h['polls_per_s_achieved']} polls/s achieved vs {h['polls_per_s_demanded']} due"
            + "".join(f"; at {int(k):,} generations p99 {v['overhead_s'].get('p99')} s "
                      f"({(v['overhead_in_poll_intervals'] or {}).get('p99')} intervals)"
                      for k, v in r["runs"].items() if k != str(r["jobs"]))
            + f" | {aim.target} | {_verdict(aim.ok)} (the aims table: both modes) |")
    r = res("fig4")
    if r:
        runs = r["runs"]
        aim = aims.ledger(r)
        rows.append(
            f"| 4 | ledger cycles/s, {r['clients']} clients | " + "; ".join(
                f"{k}: {v['cycles_per_s']}" for k, v in runs.items())
            + f" — transactions/s ÷ pgbench simple-update tps (a cycle is 2 transactions): "
              f"{aim.measured} | {aim.target} | "
              f"{_verdict(aim.ok)} |")
    r = res("fig5")
    if r:
        aim = aims.statements(r, mode)
        rows.append(
            f"| 5 | statements per job (kie-standard happy path) | {aim.measured}; idle sweep "
            f"tick {r['headline']['idle_sweep_tick']} | {aim.target} outside the polls | "
            f"{_verdict(aim.ok)} |")
    r = res("fig6")
    if r:
        c30 = r["configs"].get("30s", {})
        cdef = r["configs"].get("default_300s", {})
        p99m = _get(c30, "measured_scaled_s", "p99")
        p99p = _get(c30, "model_production_s", "p99")
        p99mp = _get(c30, "measured_production_s", "p99")
        ok = aims.all_of([aims.at_most(p99p, 60), aims.at_most(p99mp, 60)])
        rows.append(
            f"| 6 | recovery after SIGKILL of a whole worker mid-poll (time ×{r['time_scale']}) | "
            f"30 s sweeps: measured p50 {_get(c30, 'measured_scaled_s', 'p50')} / p99 {p99m} s "
            f"scaled, production-equivalent p99 modelled **{p99p} s**, measured **{p99mp} s** "
            f"({c30.get('samples')} dead chains; poll lease {c30.get('poll_lease_s')} s); "
            f"default 300 s sweeps: model p50 {_get(cdef, 'model_production_s', 'p50')} / p99 "
            f"{_get(cdef, 'model_production_s', 'p99')} s | p99 ≤ 60 s at 30 s, modelled and "
            f"measured | {_verdict(ok)} |")
    r = res("fig7")
    if r:
        rows.append(
            f"| 7 | ledger audit, {r['transactions']:,} transactions | full **{r['full']['seconds']} s** "
            f"({r['full']['rows_per_s']:,} rows/s); `--since 1h` p50 {r['since_1h']['seconds'].get('p50')} s "
            f"({r['since_1h']['users_touched']} users touched, ×{r['speedup_since_vs_full']}) | clean, and "
            f"a planted corruption found by both | "
            f"{_verdict(r['full']['clean'] and r['since_1h']['clean'] and bool(r['corruption_found']['since_1h']))} |")
    r = res("fig8")
    if r:
        rows.append(
            f"| 8 | operator console, {r['jobs']:,} jobs | needs attention p50 "
            f"**{r['needs_attention']['ms']['p50']} ms**, a job's story p50 "
            f"**{r['job_story']['ms']['p50']} ms** (rendered by the app); {r['list_queries']} "
            f"list queries EXPLAINed, {len(r['seq_scans'])} with a sequential scan | every list "
            f"query on an index | {_verdict(r['all_use_an_index'])} |")
    r = res("fig9")
    if r:
        aim = aims.recovery(r, None, mode)
        runs = aims.fig9_modes(r)
        cells = [f"{m}{' (default)' if m == mode else ''} p50 {run.get('recovery_s', {}).get('p50')}"
                 f" / p99 **{run.get('recovery_s', {}).get('p99')} s** "
                 f"({run.get('recovery_s', {}).get('n')} of {run.get('affected')}, "
                 f"{run.get('unresolved')} unresolved; restarted worker ready after "
                 f"{run.get('restarted_ready_after_kill_s')} s)" for m, run in runs.items()]
        rows.append(
            f"| 9 | recovery after SIGKILL of every worker mid-poll, default settings "
            f"(heartbeats) | kill → each affected job polled again: {'; '.join(cells)} | "
            f"≤ 10 s in both modes | {_verdict(aim.ok)} |")
    r = res("fig10")
    if r:
        p = aims.quiet_pass(r) or {}
        # side_by_side gives one aim per job count, in the same order
        for (n, runs), aim in zip((p.get("runs") or {}).items(), aims.side_by_side(p, mode),
                                  strict=False):
            rows.append(
                f"| 10 | peers, {int(n):,} jobs of 30-s generations, same workload | " + "; ".join(
                    f"{name}: {_get(v, 'jobs_per_s')} jobs/s, "
                    f"{_get(v, 'cpu_ms_per_job', 'total')} ms CPU/job, p99 delay "
                    f"{_get(v, 'delay_intervals', 'p99')} intervals, {_get(v, 'xacts_per_job')} "
                    f"xacts/job" for name, v in runs.items() if "error" not in v)
                + f" | {aim.target} | {_verdict(aim.ok)} ({mode}) |")
    return rows


def _fig8(r: dict[str, Any]) -> str:
    rows = [f"{r['jobs']:,} jobs ({r['in_flight']:,} in flight, {r['uncertain']} uncertain, "
            f"{r['unsettled']} unsettled), {r['anomalies']:,} anomalies, loaded with "
            f"`generate_series` in {r['load_seconds']} s. Each page rendered by the console app "
            "(Starlette test client in-process: the hook, every query, Jinja2), after warm-ups:\n",
            "| page | p50 ms | p90 ms | max ms | bytes |", "|---|---|---|---|---|"]
    for key, label in (("needs_attention", "needs attention (5 lists, 20 rows each)"),
                       ("job_story", "a job's story"),
                       ("uncertain_page_2", "uncertain, page 2 (keyset)")):
        m = r[key]["ms"]
        rows.append(f"| {label} | {m['p50']} | {m['p90']} | {m['max']} | {r[key]['bytes']:,} |")
    rows.append("\nEvery SELECT the two pages ran, EXPLAINed (ANALYZE) with its own parameters "
                "(a sequential scan of `jobs` or the anomalies would be flagged):\n")
    rows.append("| query | indexes | seq scan | ms |\n|---|---|---|---|")
    for p in r["explain"]:
        rows.append(f"| `{p['sql'][:110]}…` | {', '.join(p['indexes']) or '—'} | "
                    f"{', '.join(p['seq_scans']) or 'none'} | {p['execution_ms']} |")
    return "\n".join(rows) + "\n"


def _fig7(r: dict[str, Any]) -> str:
    return (f"A ledger of {r['transactions']:,} transactions ({r['jobs']:,} jobs, {r['users']:,} users; "
            f"built with `generate_series` in {r['build_seconds']} s"
            + (", in a thread while figure 6 ran: setup overlapped with a figure whose latency is "
               "mostly leases and ticks on timers" if r.get("built_ahead") else "")
            + "). The full audit (every check, "
            f"every row: the proof) took {r['full']['seconds']} s = {r['full']['rows_per_s']:,} "
            f"transactions/s; the incremental `--since 1h` "
            f"p50 {r['since_1h']['seconds'].get('p50')} s over {r['since_1h']['users_touched']} touched "
            f"users. Both "
            f"were clean; one usage log corrupted afterwards was found by the full audit "
            f"({r['corruption_found']['full']}) and by `--since` ({r['corruption_found']['since_1h']}). "
            f"`--since` cannot replace the full audit: lots change in place.\n")


# ----------------------------------------------------------------------------- sections


def _fig1(r: dict[str, Any]) -> str:
    s = [f"Query: {r['query_source']}. Table: 10,000 rows in flight (95% accepted/processing, "
         f"2.5% submitting, 2.5% not started), {r['unsettled_rows']} unsettled failures, the rest "
         "settled history. Latency is client-side (BEGIN, the locked first page, ROLLBACK on the "
         "library's engine), median of many runs; the server time is EXPLAIN ANALYZE's. Index "
         "variants: `shipped` (every migration: 0019's `jobs_inflight_keyset_idx "
         "(provider_call_started_at, id)`; 0022 dropped the one-column `jobs_inflight_idx`), "
         "`with_single_col_idx` (the layout before 0022: `jobs_inflight_idx` built back beside "
         "the keyset index), `no_inflight_idx` (no in-flight index).\n"]
    s.append("| rows | table | index | phase | client p50 ms | p99 ms | server ms | plan |")
    s.append("|---|---|---|---|---|---|---|---|")
    bars = []
    for size, d in r["sizes"].items():
        for variant, e in d["variants"].items():
            for phase, p in e["phases"].items():
                plan = " → ".join(x.strip() for x in p["explain"]["plan"])
                s.append(f"| {int(size):,} | {d['table_mb']} MB | {variant} | {phase} | "
                         f"{p['client_ms']['p50']} | {p['client_ms']['p99']} | "
                         f"{p['explain']['execution_ms']} | {plan} |")
                if phase == "started":
                    bars.append((f"{int(size):>9,} rows {variant:<17}", p["client_ms"]["p50"]))
    s.append("")
    s.append("Started-phase first page, client p50:\n")
    s.append(_fence(charts.bars(bars, unit=" ms", log=True)))
    s.append("**The whole tick** (every candidate page, keyset-paged 25 at a time as "
             "`sweep.sweep` does, fetch only):\n")
    s.append("| rows | index | phase | pages | ms | page-2 plan | page-2 index condition | "
             "page-2 server ms |\n|---|---|---|---|---|---|---|---|")
    for size, d in r["sizes"].items():
        for variant in ("shipped", "with_single_col_idx"):
            walk = d["variants"].get(variant, {}).get("tick_walk", {})
            for phase in ("unstarted", "started", "unsettled"):
                w = walk.get(phase)
                if not w:
                    continue
                ex = w["page2_explain"] or {}
                plan = " → ".join(x.strip() for x in ex.get("plan", []))
                cond = "; ".join(f"`{c}`" for c in ex.get("index_cond", [])) or "—"
                s.append(f"| {int(size):,} | {variant} | {phase} | {w['pages']} | {w['ms']} | "
                         f"{plan} | {cond} | {ex.get('execution_ms')} |")
            if walk:
                s.append(f"| {int(size):,} | {variant} | **whole tick** | "
                         f"{sum(walk[p]['pages'] for p in ('unstarted', 'started', 'unsettled'))}"
                         f" | **{walk['total_ms']}** | | | |")
        est = d["variants"].get("no_inflight_idx", {}).get("tick_walk_estimate")
        if est:
            s.append(f"| {int(size):,} | no_inflight_idx | whole tick (estimate) | {est['pages']} | "
                     f"{est['ms']} | pages × first-page p50 | — | — |")
    s.append("")
    s.append("**Is the mid-walk plan stable?** The same mid-walk page of the `started` phase, "
             "EXPLAIN ANALYZEd after each of several fresh `ANALYZE` samples:\n")
    s.append("| rows | full-Sort plans | per sample: plan via index, estimated → actual rows, "
             "server ms |")
    s.append("|---|---|---|")
    for size, d in r["sizes"].items():
        st = d["variants"]["shipped"].get("mid_walk_plan_stability")
        if st:
            cells = "; ".join(f"{x['top']} via {x['scan_index']} {x['estimated_rows']}→"
                              f"{x['actual_rows']} {x['execution_ms']} ms" for x in st["samples"])
            s.append(f"| {int(size):,} | {st['full_sort_plans']}/{st['tries']} | {cells} |")
    s.append("")
    h = r.get("headline", {})
    sizes = [k for k in h if k.isdigit()]
    if sizes and "with_single_col_idx" in h:
        small, big = sizes[0], sizes[-1]
        w = h["with_single_col_idx"][big]
        g = h["growth_tick_walk_small_to_big"]
        g_with = h.get("growth_tick_walk_with_single_col_idx")
        walk_big = r["sizes"][big]["variants"]["shipped"]["tick_walk"]
        pages = sum(walk_big[p]["pages"] for p in ("unstarted", "started", "unsettled"))
        mb = h.get("index_sizes_mb") or {}
        chosen = {size: ((r["sizes"][size]["variants"]["with_single_col_idx"]["tick_walk"]
                          ["started"].get("page2_explain") or {}).get("plan") or ["?"])[-1].strip()
                  for size in sizes}
        s.append(
            f"Reading: with the shipped indexes the whole tick walk goes "
            f"{h['tick_walk_ms'][small]:.0f} → {h['tick_walk_ms'][big]:.0f} ms from "
            f"{int(small):,} to {int(big):,} rows (**×{g}**; before 0019, ×3.2); {pages} pages, ≈ "
            f"{walk_big['total_ms'] / max(pages, 1):.2f} ms a page here (BEGIN + locked page + "
            "ROLLBACK: round trips, not rows read). The `started` cursor is a row comparison "
            "(`tuple_(provider_call_started_at, id) > tuple_(…)`, `sweep/tick.py` `_phases`), "
            "which `jobs_inflight_keyset_idx` serves as an index condition (`ROW(…) > ROW(…)` in "
            "the page-2 column: the page reads its 25 rows). With the one-column "
            "`jobs_inflight_idx` beside it (the layout before 0022) the planner chooses between "
            "them per ANALYZE sample — page 2 of the started phase went "
            + ", ".join(f"at {int(k):,} rows: {v}" for k, v in chosen.items())
            + f"; via `jobs_inflight_idx` the cursor is only a range on its one column "
              f"(`provider_call_started_at >= …`) plus an Incremental Sort. That layout, in "
              f"this run: whole tick {w['tick_walk_ms_with']} ms at {int(big):,} rows vs "
              f"{w['tick_walk_ms_shipped']} ms shipped (×{g_with} from {int(small):,} rows); "
              f"first pages p50 " + ", ".join(
                f"{p} {w['first_page_p50_ms_with'][p]} vs {w['first_page_p50_ms_shipped'][p]} ms"
                for p in w["first_page_p50_ms_shipped"])
            + f" (index sizes: {mb}).\n")
    return "\n".join(s)


def _fig2(r: dict[str, Any]) -> str:
    s = [f"{r['jobs']:,} stale `kie-standard` jobs (dead chains, past the threshold, the upstream "
         f"already succeeded) reconciled by {r['worker']} in {r.get('mode', 'chain')} mode"
         + (" (with `celery beat` for the `poll_due` tick)" if r.get("mode") == "batch" else "")
         + " from one `reconcile.sweep` task: "
         f"{r['completed']:,} of {r['jobs']:,} completed in {r['seconds']} s"
         + ("" if r.get("finished") else f" (the figure's budget: {r.get('budget_s')} s; "
            "`make bench-full` waits for all of them)")
         + f" = **{r['jobs_per_s']} jobs/s** "
         f"(steady part {r.get('steady_jobs_per_s')} jobs/s). The seed's cron (50 rows per "
         f"5-minute tick, 0.167 jobs/s) needs {r['seed_cron_seconds_for_n']:,} s for the same "
         f"backlog: **×{r['ratio_to_seed_cron']:.0f}**.\n"]
    if "extrapolated_10000_seconds" in r:
        s.append(f"**Extrapolated** (not measured) to 10,000 jobs at the measured rate: "
                 f"≈ {r['extrapolated_10000_seconds']} s; the seed's cron: 60,000 s (16.7 h). "
                 "The extrapolation assumes a constant rate; it is optimistic: the tick fans the "
                 "rows beyond its inline budget (`SWEEP_TIME_BUDGET`) out in chunks while holding "
                 "one of the two slots, and that part grows with N (`python -m bench.run --only fig2` "
                 "measures the full 10,000, the default).\n")
    tick = (r.get("sweep_lines") or [""])[0]
    if r.get("made_due_by_sweep"):
        s.append(f"Tick log: `{tick}` — past the inline budget the tick made "
                 f"{r['made_due_by_sweep']:,} rows due for the batch poller (a page per "
                 f"statement), which both worker processes drained; "
                 f"{r.get('fanned_out_messages')} `reconcile.reconcile_jobs` messages.\n")
    else:
        s.append(f"Tick log: `{tick}` — the rows past the inline budget went out in "
                 f"{r.get('fanned_out_messages')} `reconcile.reconcile_jobs` messages (chunks of "
                 "`4 × SWEEP_THREADS` rows), which both worker processes carried out.\n")
    noop = r.get("machine_limit_noop")
    if noop:
        s.append(f"Machine limit for this worker shape: {noop['tasks']} no-op tasks (same "
                 f"`celeryconfig`, same broker, 1 worker -c 2) ran at **{noop['tasks_per_s']} "
                 f"tasks/s**: the reconciliation itself, not Celery, sets the drain rate "
                 f"({r['jobs_per_s']} jobs/s = {r['jobs_per_s'] / noop['tasks_per_s']:.0%} of "
                 "the no-op rate).\n")
    floor = r.get("lean_floor")
    if floor and noop:
        s.append(f"The floor under it (`bench/drain_floor.py`): {floor['jobs']:,} stale jobs seeded "
                 f"the same way, drained by {floor['processes']} processes × {floor['threads']} "
                 "threads of psycopg and requests alone — the claim, the status read, the media "
                 "read, the file written with fsync, and the completion as one statement (the "
                 "ledger's commit function, the job's CAS, the asset, the event) —, no library "
                 f"and no Celery: **{floor['jobs_per_s']} jobs/s** ({floor['seconds']} s; "
                 f"{floor['client_cpu_ms_per_job']} ms of client CPU per job) = "
                 f"**{floor['jobs_per_s'] / noop['tasks_per_s']:.0%}** of the no-op rate. The "
                 f"library's drain reaches {r['jobs_per_s'] / floor['jobs_per_s']:.0%} of it; "
                 "the rest is its decision table, guards and SQLAlchemy (the drain profile "
                 "below and `profiles/drain.txt`).\n")
    s.append(_fence(charts.xy(r["curve"], x_label="seconds since the sweep was sent",
                              y_label="jobs completed")))
    p = r.get("profile")
    if p:
        s.append(f"Where one reconciliation spends its time ({p['jobs']} jobs in-process through "
                 f"`sweep.reconcile_job`, no Celery): wall {p['wall_ms_per_job']} ms, CPU "
                 f"{p['cpu_ms_per_job_incl_simulator_thread']} ms (simulator thread included), "
                 f"{p['statements_per_job']} SQL statements per job. Profiled cumulative ms per "
                 f"job (the profiler inflates; read as shares):\n")
        s.append("| function | ms/job | share of reconcile_job |\n|---|---|---|")
        prof = p["profiled_cumulative_ms_per_job"]
        whole = prof.get("sweep.reconcile_job (all)") or 0.0
        for k, v in prof.items():
            share = f"{v / whole:.0%}" if whole else "—"
            s.append(f"| {k} | {v} | {share} |")
        s.append("")
    return "\n".join(s)


def _na(value: Any) -> str:
    return "n/a" if value is None else str(value)


def _ge(run: dict[str, Any], q: str, value: Any) -> str:
    """``value`` with "≥ " when the run's cap left more jobs in flight than that percentile's
    tail (figure 3's bounded runs: the percentile is a lower bound)."""
    return f"≥ {value}" if (run.get("overhead_lower_bound") or {}).get(q) else str(value)


def _done(run: dict[str, Any], n: Any) -> str:
    """"k of n completed by t0 + cap" when the cap ended the run, else ""."""
    left = run.get("still_in_flight_at_cap")
    if not left:
        return ""
    return (f"{run['completed']:,} of {int(n):,} completed by t0 + {run.get('cap_s_after_t0'):.0f} s, "
            f"the other {left:,} counted at their overhead so far")


def _fig3(r: dict[str, Any]) -> str:
    s = [f"{r['kind']} (poll every {r['poll_interval_s']} s), generations of "
         f"{r['generation_s']} s, real time (no scaling), {r['worker']}; generation starts spread "
         "over one poll interval. Overhead = completed_at − (start + 30 s).\n"]
    s.append("| generations | overhead p50 s | p90 | p99 | in poll intervals p50 / p99 | reads/job | "
             "polls/s achieved / due | in-flight poll ms p50 | completing poll ms p50 | slots busy |"
             " worker RSS MB |")
    s.append("|---|---|---|---|---|---|---|---|---|---|---|")
    runs = [(f"{int(n):,}", v) for n, v in r["runs"].items()]
    runs += [(f"{int(n):,} batch", v) for n, v in (r.get("batch") or {}).get("runs", {}).items()
             if "error" not in v]
    for n, run in runs:
        o, iv = run["overhead_s"], run["overhead_in_poll_intervals"] or {}
        s.append(f"| {n} | {_ge(run, 'p50', o.get('p50'))} | {_ge(run, 'p90', o.get('p90'))} | "
                 f"{_ge(run, 'p99', o.get('p99'))} | "
                 f"{_ge(run, 'p50', iv.get('p50'))} / {_ge(run, 'p99', iv.get('p99'))} | "
                 f"{run['polls_per_job']} | "
                 f"{run['polls_per_s_achieved']} / {run['polls_per_s_demanded']} | "
                 f"{run['poll_ms_in_flight'].get('p50', 'n/a')} | "
                 f"{run['poll_ms_completing'].get('p50', 'n/a')} |"
                 f" {run['slot_busy_share']} | {run['worker_rss_mb_peak']} |")
    s.append("")
    capped = [f"{n}: {_done(run, n.split()[0].replace(',', ''))}" for n, run in runs
              if _done(run, n.split()[0].replace(',', ''))]
    cap = runs[0][1].get("cap_s_after_t0") or 0.0
    s.append(f"Each run waits for completions until t0 + {cap:.0f} s (the generations end by "
             f"t0 + 35 s): an overhead up to {cap - 35:.0f} s (≈ {(cap - 35) / 5:.0f} intervals) is "
             "measured exactly; a job still in flight then counts at its overhead so far, and a "
             "percentile shown \"≥\" is a lower bound (`make bench-full` waits up to 400 s). "
             + ("Bounded: " + "; ".join(capped) + "." if capped else "Every job completed inside "
                "the cap.") + "\n")
    s.append("Reads = the status reads the simulator answered (both modes; polls/s achieved is "
             "reads/s). Poll ms columns are `reconcile.poll` task runtimes: n/a in batch mode, "
             "whose `reconcile.poll_due` runs are below.\n")
    split_rows = [(n, v) for n, v in runs if v.get("overhead_split_s")]
    if split_rows:
        s.append("**Where the overhead goes** (from the simulator's read log): read spacing = "
                 "time between two reads of a job in flight (the interval is "
                 f"{r['poll_interval_s']} s); first read late = the first read − (start + one "
                 "interval); read lag = the first read that saw the upstream finished − its end; "
                 "write = completed_at − that read:\n")
        s.append("| generations | read spacing p50 / p99 s | first read late p50 / p99 | "
                 "read lag p50 / p99 | write p50 / p99 |\n|---|---|---|---|---|")
        for n, v in split_rows:
            sp, fl = v.get("read_spacing_s") or {}, v.get("first_read_late_s") or {}
            lag, wr = v["overhead_split_s"]["read_lag"], v["overhead_split_s"]["write"]
            s.append(f"| {n} | {sp.get('p50')} / {sp.get('p99')} | {fl.get('p50')} / "
                     f"{fl.get('p99')} | {lag.get('p50')} / {lag.get('p99')} | "
                     f"{wr.get('p50')} / {wr.get('p99')} |")
        s.append("")
    due_rows = [(n, v["poll_due_runs"]) for n, v in runs if v.get("poll_due_runs")]
    if due_rows:
        s.append("Batch mode's `reconcile.poll_due` runs (beat every "
                 "`POLL_BATCH_INTERVAL` = 1 s; a tick not started within 1 s expires):\n")
        s.append("| generations | runs | run ms p50 / p99 / max | rows claimed per run p50 / max "
                 "| runs out of budget | ticks expired |\n|---|---|---|---|---|---|")
        for n, d in due_rows:
            ms, cl = d["ms"], d["claimed_per_run"]
            s.append(f"| {n} | {d['runs']} | {ms.get('p50')} / {ms.get('p99')} / {ms.get('max')} "
                     f"| {cl.get('p50')} / {cl.get('max')} | {d['runs_with_more']} | "
                     f"{d['ticks_expired_or_revoked']} |")
        s.append("")
    batch = r.get("batch") or {}
    if not batch.get("available", False):
        s.append(f"Batch poll mode (`RECONCILE_POLL_MODE=batch`, beat sending "
                 f"`reconcile.poll_due`) at 2,000 and 10,000: **not available** — "
                 f"{batch.get('note', 'not run')}. `python -m bench.run --only fig3` measures it "
                 "once the task exists (`--batch on|off|auto`).\n")
    for n, v in batch.get("runs", {}).items():
        if "error" in v:
            s.append(f"Batch mode at {int(n):,}: **failed**: `{v['error']}`.\n")
    cpu_rows = [(n, v["cpu_ms_per_poll"]) for n, v in runs if v.get("cpu_ms_per_poll")]
    if cpu_rows:
        s.append("**CPU per in-flight poll** (psutil user + system CPU of each process over the "
                 "steady window, from one interval after t0 to the first completion, ÷ the "
                 "status reads the simulator answered in it):\n")
        s.append("| generations | reads in window | window s | worker ms | PostgreSQL ms | "
                 "simulator + bench ms | total ms |\n|---|---|---|---|---|---|---|")
        for n, c in cpu_rows:
            s.append(f"| {n} | {c['turns_in_window']:,} | {c['window_s']} | {c['worker']} | "
                     f"{c['postgres']} | {c['bench']} | **{c['total']}** |")
        s.append("")
    margin_rows = [(n, v["lease_margin"]) for n, v in runs if v.get("lease_margin")]
    if margin_rows:
        cands = list(margin_rows[0][1]["false_resumes_at_candidate_leases"])
        s.append(f"**Lease margin of healthy chains** (the other side of figure 6's trade): per "
                 f"job, the worst time between two of its status reads (the simulator's read "
                 f"log), against the poll lease ({r.get('poll_lease_s')} s here); a job past the "
                 "lease would have been resumed by a sweep tick although its chain was alive (a "
                 "*false resume*: safe — the old chain is fenced at its next turn — but a wasted "
                 "read and message). Jobs that a lease of L s would have resumed (batch: n/a, "
                 "the sweep never resumes a row with a due time; the gap is still shown):\n")
        s.append("| generations | jobs | worst gap p50 / p99 / max s | past the shipped lease | "
                 + " | ".join(f"L = {c} s" for c in cands) + " |")
        s.append("|---|---|---|---|" + "---|" * len(cands))
        for n, m in margin_rows:
            g = m["worst_gap_between_turns_s"]
            s.append(f"| {n} | {m['jobs_sampled']:,} | {g.get('p50')} / {g.get('p99')} / "
                     f"{g.get('max')} | **{_na(m['jobs_past_lease_false_resumes'])}** | "
                     + " | ".join(_na(m["false_resumes_at_candidate_leases"][c]) for c in cands)
                     + " |")
        s.append("")
    head = r["runs"][str(r["jobs"])]
    s.append(f"Worker slots held: **2** (the prefork pool) for {r['jobs']:,} generations in flight; "
             f"the seed's design holds one slot per in-flight generation: {r['jobs']:,} slots — at "
             f"the {head['pool_child_rss_mb'][0] if head['pool_child_rss_mb'] else '?'} MB measured "
             f"per pool process, ≈ {head.get('seed_design_memory_gb_estimate')} GB of workers.\n")
    knee = [v for k, v in r["runs"].items() if k != str(r["jobs"])]
    if knee:
        k = knee[0]
        k_iv = (k["overhead_in_poll_intervals"] or {}).get("p99")
        on_time = k_iv is not None and k_iv <= 2
        s.append(
            f"Reading: {k['seed_design_slots']:,} generations ({k['polls_per_s_demanded']} polls/s "
            f"due) were polled {'on time' if on_time else 'mostly on time but not at the tail'}"
            f" in this run — overhead p50 {k['overhead_s'].get('p50')} s, p99 "
            f"{k['overhead_s'].get('p99')} s ({k_iv} intervals; load "
            "is in the heading: a busy neighbour shows up in the tail). At "
            f"{r['jobs']:,} the polls due ({head['polls_per_s_demanded']}/s) far exceed what two "
            f"slots run ({head['polls_per_s_achieved']}/s at "
            f"{head['poll_ms_in_flight'].get('mean')} ms mean per in-flight poll, "
            f"{head['poll_ms_completing'].get('mean')} ms per completing poll), so each chain is "
            f"polled {head['polls_per_job']} times and the completion is seen late. The slots "
            f"were busy {head['slot_busy_share']:.0%} of the time; the rest was not isolated "
            "(candidates: the consumer process's own work on 2,000 ETA messages, and "
            "`worker_eta_task_limit = 1000` in `celeryconfig.py`, below the number of chains, "
            "which leaves the other messages waiting in Redis).\n")
    sample = head.get("overhead_sorted_sample") or []
    if sample:
        s.append(f"Overhead distribution, {r['jobs']:,} generations (s, a sorted sample):\n")
        s.append(_fence(charts.histogram(sample, bins=10, unit="s")))
    return "\n".join(s)


def _fig4(r: dict[str, Any]) -> str:
    s = [f"{r['clients']} client processes, {r['seconds_per_run']} s per run, one cycle = "
         f"`reserve` transaction + `commit` or `refund` transaction through `reconcile.credits` "
         f"on the library's engine. pgbench `simple-update` with the same client count, before "
         f"and after: " + ", ".join(f"{p['tps']} tps" for p in r["pgbench"])
         + f" (mean {r['pgbench_tps_mean']}).\n"]
    s.append("| run | cycles/s | ÷ pgbench tps | transactions ÷ pgbench | client CPU ms/cycle | "
             "errors | open lots (max per user) at the end | cycles per second, second by second |")
    s.append("|---|---|---|---|---|---|---|---|")
    for k, v in r["runs"].items():
        s.append(f"| {k} | {v['cycles_per_s']} | {v['ratio_to_pgbench']:.1%} | "
                 f"{v['txn_ratio_to_pgbench']:.1%} | {v.get('client_cpu_ms_per_cycle')} | "
                 f"{v['errors']} | {v.get('max_open_lots_per_user', '1')} | "
                 f"{' '.join(str(x) for x in v['per_second'])} |")
    s.append("")
    s += _fig4_ceiling(r)
    lots = r.get("reserve_vs_open_lots")
    if lots:
        s.append("`reserve` latency against the open lots one user holds (every refund adds a "
                 "REFUND lot; FIFO consumes the oldest — a user with a big grant and many failed "
                 "jobs accumulates them):\n")
        s.append("| open lots | reserve p50 ms | p99 ms |\n|---|---|---|")
        for x in lots:
            s.append(f"| {x['open_lots']:,} | {x['reserve_ms']['p50']} | {x['reserve_ms']['p99']} |")
        s.append("")
        s.append(_fence(charts.xy([(x["open_lots"], x["reserve_ms"]["p50"]) for x in lots],
                                  log_x=True, height=10, x_label="open lots of the user",
                                  y_label="reserve p50 ms")))
    return "\n".join(s)


def _fig4_ceiling(r: dict[str, Any]) -> list[str]:
    """The ledger functions under pgbench (no Python client): the server side's ceiling, and
    what the Python runs reach of it."""
    fn = r.get("functions_under_pgbench") or {}
    if not fn:
        return []
    lean = r.get("functions_lean_python") or {}
    s = ["The same two functions (`reconcile_ledger_reserve`, then `reconcile_ledger_commit`, "
         "each in its own transaction, with the library's arguments) driven by pgbench's C "
         "client instead of Python (`" + next(iter(fn.values()))["command"] + "`), and by the "
         "same number of lean Python clients (psycopg alone, `conn.transaction()` around each "
         "call, no SQLAlchemy):\n",
         "| run | cycles/s, no Python | transactions ÷ pgbench | psycopg alone: cycles/s, ÷ "
         "pgbench, client CPU ms/cycle | the library's run reaches |",
         "|---|---|---|---|---|"]
    for name, v in fn.items():
        python = r["runs"].get(name, {})
        share = python.get("share_of_functions_ceiling")
        alone = lean.get(name)
        s.append(f"| {name} | {v['cycles_per_s']} | {v['txn_ratio_to_pgbench']:.1%} | "
                 + (f"{alone['cycles_per_s']}, {alone['txn_ratio_to_pgbench']:.1%}, "
                    f"{alone['client_cpu_ms_per_cycle']}" if alone else "—") + " | "
                 + (f"{share:.0%} ({python['cycles_per_s']} cycles/s)" if share else "—") + " |")
    cpu = [v["client_cpu_ms_per_cycle"] for v in r["runs"].values()
           if v.get("client_cpu_ms_per_cycle")]
    hot, many = fn.get("reserve+commit/hot_user"), fn.get("reserve+commit/1000_users")
    s.append("")
    reading = ("Reading: with no Python at all, the functions reach the ratios in the third "
               "column: that is the ceiling of this figure on this server, and what is left "
               "between it and the Python runs is the client's share; the fourth column is a "
               "lean Python client's share, and what is left between it and the library's run "
               "is SQLAlchemy's Session and execution machinery around each call")
    if cpu:
        reading += (f" (the library's runs: {min(cpu)}–{max(cpu)} ms of client CPU per cycle: "
                    f"SQLAlchemy's session "
                    f"and result handling and psycopg, 3 round trips per transaction — BEGIN, "
                    f"the function, COMMIT —, on the {r['clients']} cores the backends use too)")
    reading += (". A cycle does more than pgbench's transaction: the reserve writes the USAGE "
                "row, the lot, the balance and the usage log; the commit the log, the COMMIT "
                "row (and a release's rows)")
    if hot and many:
        reading += (f". The hot user's cycles queue on one balance row, whose lock is held "
                    f"until the commit is flushed, so they run one at a time "
                    f"({hot['cycles_per_s']} cycles/s against {many['cycles_per_s']} for 1,000 "
                    f"users, both without Python)")
    s.append(reading + ".\n")
    return s


def _fig5(r: dict[str, Any]) -> str:
    s = [r["method"] + "\n"]
    s.append("| kind | submit | create | per running poll | final poll (incl. finalize) | "
             "outside the polls | total | transactions (outside the polls) | "
             "pool checkouts |")
    s.append("|---|---|---|---|---|---|---|---|---|")
    for kind, k in r["kinds"].items():
        s.append(f"| {kind} | {k['submit']['statements']} | {k['create']['statements']} | "
                 f"{k['statements_per_running_poll']} | {k['statements_final_poll']} | "
                 f"**{k['statements_outside_polls']}** | {k['statements_total']} | "
                 f"{k['transactions_total']} ({k.get('transactions_outside_polls', '?')}) | "
                 f"{k['checkouts_total']} |")
    t = r["idle_sweep_tick"]
    s.append(f"\nIdle sweep tick: **{t['statements']} statements** in {t['transactions']} "
             f"transactions (one candidate query per phase, the idempotency-key purge; the "
             f"outbox republish query only when a publisher is configured).\n")
    k = r["kinds"]["kie-standard"]
    s.append("Statements of the kie-standard job, step by step:\n")
    lines = []
    for step, texts in k["statement_texts"].items():
        lines.append(f"[{step}]")
        lines.extend(f"  {t_}" for t_ in texts)
    s.append(_fence("\n".join(lines)))
    b = k["outside_breakdown"]
    s.append(
        f"Where the {k['statements_outside_polls']} outside the polls come from: submit "
        f"{b['submit']}, create {b['create']}, finalize {b['finalize (final poll minus one poll)']}. "
        "Each step loads the job once: the create claim, the id save and the poll turn are each "
        "one `UPDATE … RETURNING` (the lease picked per kind in SQL), and finalize reuses the "
        "poll turn's row. With no publisher configured the outbox rows are written already "
        "published (no query after commit); with one, each step marks its events in one UPDATE. "
        "The rest is the ledger: `reserve`, `commit` and the `settled_amount` read-back of what "
        "the commit wrote, plus the `credits_actual` UPDATE when the pricing hook gave no amount. "
        "Every transaction also costs BEGIN/COMMIT round trips, and a pool checkout more "
        "than `PING_AFTER_IDLE` after the connection's previous one a ping.\n")
    if "batch" in r:
        s.append(_fig5_batch(r["batch"]))
    return "\n".join(s)


def _fig5_batch(b: dict[str, Any]) -> str:
    rounds = " | ".join(f"{x['statements']} ({x['transactions']})" for x in b["rounds"])
    lines = [f"**Batch mode** (the default): {b['jobs']} kie-standard jobs polled together, "
             f"statements (transactions) per `poll_due` round: {rounds} (the last round completes "
             f"them all). Per job: **{b['statements_per_job_outside_polls']} statements outside "
             f"the polls** in {b['transactions_per_job_outside_polls']} transactions, "
             f"{b['statements_per_job_per_poll']} per poll in "
             f"{b['transactions_per_job_per_poll']}. A running round is the claim (one `UPDATE` whose "
             f"locking read, `SELECT … FOR UPDATE SKIP LOCKED`, is its CTE) and one set-based "
             f"reschedule for the whole batch; the "
             f"round that completes them holds all their claims in one `UPDATE … FROM "
             f"unnest(…)`, then each completion is one statement.\n"]
    texts = "\n".join(f"[{k}]\n" + "\n".join(f"  {t}" for t in v)
                      for k, v in b.get("statement_texts", {}).items())
    return "\n".join(lines) + ("\n" + _fence(texts) if texts else "")


def _fig6(r: dict[str, Any]) -> str:
    s = [f"Time scale ×{r['time_scale']} (`RECONCILE_TIME_SCALE`; every interval, lease and the "
         f"beat schedule shrink by it). {r['jobs_per_round']} fresh `{r['kind']}` jobs per round, "
         "a survivor worker and one beat throughout, a victim worker SIGKILLed (whole process "
         "group) at a random phase; the broker's visibility timeout is 3600 s, so only the sweep "
         "recovers. *Measured* = kill → first poll of the resumed chain; *scaled* = real ÷ scale. "
         "*Model* resamples the measured parts with a uniform tick phase (a round gives one "
         "phase); *production* keeps the dispatch in real seconds (it does not scale).\n"]
    s.append("*Measured production* = each measured latency with its lease and tick-wait parts "
             "scaled back and its dispatch kept in real seconds.\n")
    s.append("| sweep interval | rounds | samples | measured real p50 / p99 s | measured scaled "
             "p50 / p99 s | **measured production p50 / p99 s** | model scaled p50 / p99 s | **model production p50 / p99 s** | parts "
             "p50 scaled: lease left / tick wait / dispatch | dispatch real p50 s | expected "
             "range s |")
    s.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, c in r["configs"].items():
        parts = c.get("parts_scaled_s_p50", {})
        s.append(
            f"| {c['sweep_interval_s']:.0f} s ({name}) | {len(c['rounds'])} | {c['samples']} "
            f"(+{c['unresolved']} unresolved) | {_get(c, 'measured_real_s', 'p50')} / "
            f"{_get(c, 'measured_real_s', 'p99')} | {_get(c, 'measured_scaled_s', 'p50')} / "
            f"{_get(c, 'measured_scaled_s', 'p99')} | **{_get(c, 'measured_production_s', 'p50')}"
            f" / {_get(c, 'measured_production_s', 'p99')}** | {_get(c, 'model_scaled_s', 'p50')} / "
            f"{_get(c, 'model_scaled_s', 'p99')} | **{_get(c, 'model_production_s', 'p50')} / "
            f"{_get(c, 'model_production_s', 'p99')}** | {parts.get('lease_left')} / "
            f"{parts.get('tick_wait')} / {parts.get('dispatch')} | "
            f"{c.get('dispatch_real_s_p50')} | {c['expected_scaled_s']['min']}–"
            f"{c['expected_scaled_s']['max']} |")
    s.append("")
    for name, c in r["configs"].items():
        if c.get("modelled_only"):
            s.append(f"The {c['sweep_interval_s']:.0f} s row ({name}) is {c['model_note']}.\n")
    for name, c in r["configs"].items():
        vals = [x / r["time_scale"] for rd in c["rounds"] for x in rd["latencies_real_s"]]
        if vals:
            s.append(f"Measured recovery, {name} (scaled s):\n")
            s.append(_fence(charts.histogram(vals, bins=8, unit="s")))
    c30 = r["configs"].get("30s", {})
    lease = c30.get("poll_lease_s") or _get(r, "configs", "default_300s", "poll_lease_s")
    s.append(
        f"Reading: recovery is the poll lease still running at the kill — `lifecycle.poll_lease`, "
        f"{lease} s for this 5-s kind, renewed at every turn, so ≈ {lease - 5:.0f}–{lease:.0f} s "
        "left — plus the wait for the next tick after it expires (uniform over one sweep "
        "interval), plus dispatch. At a 30 s interval the model's p99 is ≈ lease + 30 s: "
        f"{_get(c30, 'model_production_s', 'p99')} s in this run. The lease cannot shrink "
        "freely: a healthy chain must beat it between two turns, and figure 3's lease-margin "
        "table shows how many live chains a shorter lease would have resumed under load.\n")
    return "\n".join(s)


# ----------------------------------------------------------------------------- peers


def _fig9(r: dict[str, Any]) -> str:
    head = (f"{r['jobs']} `kie-standard` jobs polled by the only worker (prefork -c 2), whose "
            f"whole process group is SIGKILLed mid-poll; a new worker is started at once. "
            f"Heartbeat every {r['heartbeat_interval_s']} s, lapse after "
            f"{r['heartbeat_timeout_s']} s.\n")
    lines = [head]
    for mode, run in aims.fig9_modes(r).items():
        rec = run.get("recovery_s", {})
        if mode == "chain":
            what = (f"chain (crash at `{run.get('crash_at', 'mid_poll')}`, poll lease "
                    f"{r['poll_lease_s']} s, no beat so no sweep tick): kill → first poll of "
                    f"the resumed generation")
        else:
            what = (f"batch (crash at `{run.get('crash_at')}`, right after a claim; claim lease "
                    f"{r.get('claim_lease_s')} s; `celery beat` runs, {run.get('sweeps_sent')} "
                    f"sweep tick(s) sent in the run): kill → each claimed row claimed again")
        lines.append(
            f"- **{mode}**{' (the default)' if mode == r.get('default_mode') else ''}: {what}: "
            f"p50 **{rec.get('p50')} s**, p90 {rec.get('p90')} s, p99 **{rec.get('p99')} s**, "
            f"max {rec.get('max')} s over {rec.get('n')} of {run.get('affected')} "
            f"({run.get('unresolved')} unresolved in {r.get('horizon_s', 60)} s); the restarted "
            f"worker was ready {run.get('restarted_ready_after_kill_s')} s after the kill and "
            f"logged {run.get('reaps_logged')} reap(s).\n")
    return "\n".join(lines)


def _fig10(r: dict[str, Any]) -> str:
    from .peers.report import NOTES, WORKLOAD, tables

    return (WORKLOAD + "\n\n" + tables(r.get("passes", {})) + "\n" + NOTES + "\n\n"
            "The no-op Celery rate is figure 2's and pgbench figure 4's (same run). The full run "
            "(500 and 2,000 jobs, quiet and saturated host, the recovery runs, every machine "
            "limit) is `make bench-peers` (`bench/results/peers.md`).\n")


def _peers(res: dict[str, Any]) -> str:
    """Where it stands against peers: measured here where we can, labelled where we cannot."""
    figs = res["figures"]
    r2 = _get(figs, "fig2", "result") or {}
    r3 = _get(figs, "fig3", "result") or {}
    noop = r2.get("machine_limit_noop") or {}
    commit = _get(res, "environment", "commit_latency_ms", "p50")
    head = (r3.get("runs") or {}).get(str(r3.get("jobs")), {})
    poll_ms = _get(head, "poll_ms_in_flight", "p50")
    cpu = head.get("cpu_ms_per_poll") or {}
    s = ["## Where it stands against peers\n",
         "| system | what | figure | source |", "|---|---|---|---|",
         "| the seed design's cron | stale rows reconciled | 50 rows / 5 min = 0.167 jobs/s "
         "(10,000 rows: 16.7 h) | its schedule (arithmetic) |",
         f"| `reconcile`, this run | stale rows reconciled, 1 worker -c 2 | "
         f"{r2.get('jobs_per_s', 'not run')} jobs/s ({r2.get('completed', 0):,} of "
         f"{r2.get('jobs', 0):,} rows in {r2.get('seconds', '?')} s) | measured here (figure 2) |",
         f"| plain Celery, same worker, same broker | no-op tasks/s (a Redis INCR) | "
         f"{noop.get('tasks_per_s', 'not run')} tasks/s | measured here (figure 2) |",
         "| DBOS (Postgres-backed durable workflows) | overhead per durable step | 1–2 ms "
         "| **published**; the same workload on DBOS, plain Celery and `reconcile`: figure 10 |",
         f"| `reconcile`, this run | one durable poll turn (fenced CAS + status read, one "
         f"transaction) | {poll_ms if poll_ms is not None else 'not run'} ms wall per in-flight "
         f"poll task (p50); {cpu.get('total', '—')} ms CPU (worker + PostgreSQL + simulator) | "
         "measured here (figure 3) |",
         f"| PostgreSQL on this machine | one write transaction (BEGIN; UPDATE; COMMIT) | "
         f"{commit} ms p50 | measured here (the floor under any durable step) |", ""]
    if noop.get("tasks_per_s") and r2.get("jobs_per_s"):
        s.append(f"A reconciliation (status read, media fetch, storage write, completion "
                 f"transaction, ledger commit) runs at {r2['jobs_per_s'] / noop['tasks_per_s']:.0%}"
                 " of the rate of a task that does nothing on the same worker. DBOS's figure is "
                 "its own, on its own hardware; it is listed for order of magnitude only.\n")
    return "\n".join(s)


# ----------------------------------------------------------------------------- profiles

# which aim each profile explains
_PROFILE_AIMS = {
    "poll_chain": "CPU per in-flight poll; in flight p99 (chain mode)",
    "poll_batch": "in flight p99 at 2,000 and 10,000 (batch mode: the reads)",
    "drain": "backlog drain (and each batch completion's finalize inside `poll_due`)",
    "ledger_hot_user_cpu": "ledger ÷ pgbench, hot user (client CPU)",
    "ledger_hot_user_wall": "ledger ÷ pgbench, hot user (wall: round trips and waits)",
    "ledger_1000_users_cpu": "ledger ÷ pgbench, 1,000 users (client CPU)",
    "ledger_1000_users_wall": "ledger ÷ pgbench, 1,000 users (wall: round trips and waits)",
}


# what each profile said when it was written (make bench-profile after ProviderSession and 0022,
# quiet host); the numbers in the line above each reading are this profile's own
_READINGS = {
    "poll_chain": "A chain poll is two halves: the turn's one `UPDATE … RETURNING` (built once "
                  "and cached; SQLAlchemy's per-execution work, ORM result mapping included, "
                  "still several times the driver's) and the status read through `requests` "
                  "(its `prepare_request`, connection pool and response parsing; re-reading the "
                  "proxy environment on every request, a third of the read before "
                  "`providers.http.ProviderSession`, is gone). The real worker adds Celery's "
                  "cost per message on top (figure 2's no-op rate), which is why batch mode "
                  "reads several times more per second on the same cores.",
    "poll_batch": "The claim and the set-based write are a few percent; the reads' HTTP client in "
                  "the thread pool is the rest (`requests` per request: prepare, pool, parse). "
                  "Completions are not in this profile (its tasks stay running): each one "
                  "runs the drain profile's finalize path, one at a time inside the `poll_due` run, "
                  "which is why figure 3's batch runs fall behind once generations end.",
    "drain": "`finalize_job_with_media` is about half of a reconciliation, the sweep's `_plan` "
             "(lock, decide, claim) about a fifth, the status read about a sixth; the four "
             "`jobstore._cas` UPDATEs (ORM-enabled `update(Job).returning(Job)`) are a third of "
             "it. The real drain also loses one of its two slots to the tick's fan-out (figure "
             "2's tick log).",
    "ledger_hot_user_wall": "One client's cycle is mostly waiting: the driver's `wait` (round "
                            "trips) and the two COMMITs (WAL flushes); the hot user's two "
                            "clients also queue on one balance row, which one client cannot show.",
    "ledger_1000_users_wall": "The same as the hot user for one client: round trips and COMMITs; "
                              "pgbench's C client does one round trip per statement with no "
                              "SQLAlchemy above it.",
}


def _own(rows: list[dict[str, Any]], n: int) -> str:
    """The top ``n`` functions of the library (reconcile/…) among ``rows``."""
    mine = [r for r in rows if r["function"].startswith("reconcile/")][:n]
    return ", ".join(f"`{r['function'].split(':')[0].removeprefix('reconcile/')}:"
                     f"{r['function'].split('(')[-1].rstrip(')')}` {r['cum_ms_per_unit']} ms"
                     for r in mine) or "none"


def _profiles(folder: str | None) -> str:
    import json
    from pathlib import Path

    path = Path(folder or Path(__file__).resolve().parent / "results" / "profiles") / "profiles.json"
    if not path.exists():
        return ("## Profiles of the missed aims\n\nNot run: `make bench-profile` writes "
                "`profiles/*.txt` and this section.\n")
    data = json.loads(path.read_text())
    s = ["## Profiles of the missed aims\n",
         f"From `make bench-profile` ({data.get('date_utc')} UTC, {data.get('wall_seconds')} s, "
         f"load average {data.get('loadavg_1m_start')} → {data.get('loadavg_1m_end')}; a separate "
         "run from the figures above, so its load differs). cProfile of the figure's hot process "
         "running the library's code in-process (no Celery between); CPU timer unless said "
         "(this thread's CPU: waiting for a core, PostgreSQL or the simulator does not count). "
         "The profiler inflates absolute times about 2–3×: read them as shares. Each file has "
         "the top 25 functions by cumulative and by self time.\n"]
    for name, p in data.get("profiles", {}).items():
        layers = p.get("layers") or []
        by = {row["layer"].strip(): row for row in layers}
        parts = "; ".join(f"{row['layer'].strip()} {row['share']:.0%} ({row['ms_per_unit']} ms)"
                          for row in layers)
        self_top = ", ".join(f"`{r['function'].rsplit('/', 1)[-1]}` {r['self_share']:.0%}"
                             for r in (p.get("top_self") or [])[:4])
        unprof = p.get("unprofiled") or {}
        extra = (f" Without the profiler: {unprof.get('cpu_ms_per_poll')} ms CPU per poll, "
                 f"{unprof.get('polls_per_s')} polls/s in one process."
                 if unprof.get("cpu_ms_per_poll") is not None else "")
        s.append(f"**[{name}](profiles/{p.get('file', name + '.txt')})** — {_PROFILE_AIMS.get(name, '')}. "
                 f"{p.get('units')} {p.get('unit')}s, {p.get('cpu_ms_per_unit')} ms CPU per "
                 f"{p.get('unit')} under the profiler ({p.get('timer')} timer).{extra} "
                 f"Where the time goes, by layer (cumulative share of the profiled time): {parts}. "
                 f"The library's heaviest calls (cumulative per {p.get('unit')}): "
                 f"{_own(p.get('top_cumulative') or [], 7)}. Most self time: {self_top}."
                 + (" The SQL layer is the larger part: the time is the library's statements "
                    "through SQLAlchemy and psycopg, not its own Python."
                    if by and max(by, key=lambda k: by[k]["share"]).startswith("every SQL") else "")
                 + (f" *Reading:* {_READINGS[name]}" if name in _READINGS else "")
                 + "\n")
    return "\n".join(s)


# ----------------------------------------------------------------------------- render again


def _pictures_beside(folder: Path, res: dict[str, Any]) -> dict[str, str]:
    """The PNGs a run left beside its JSON (``bench/run.py`` deletes the older ones first)."""
    return {key: f"{key}.png" for key in res.get("figures", {})
            if (folder / f"{key}.png").exists()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.report",
        description="Render latest.md again from a run's JSON (nothing is measured).")
    parser.add_argument("--from", dest="source", default=str(
        Path(__file__).resolve().parent / "results" / "latest.json"),
        help="the run's JSON (default: bench/results/latest.json)")
    parser.add_argument("--peers", default=None,
                        help="a make bench-peers JSON (bench/results/peers.json) for the aims "
                             "figure 10 lacks; its cells say they come from that run")
    parser.add_argument("--out", default=None,
                        help="where to write (default: latest.md beside the JSON; - for stdout)")
    args = parser.parse_args(argv)
    source = Path(args.source)
    res = json.loads(source.read_text())
    peers = json.loads(Path(args.peers).read_text()) if args.peers else None
    text = markdown(res, _pictures_beside(source.parent, res), peers=peers)
    if args.out == "-":
        sys.stdout.write(text)
    else:
        out = Path(args.out) if args.out else source.parent / "latest.md"
        out.write_text(text)
        print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
