"""The performance aims of ``make bench``: each one rendered from the figures of one run.

:func:`aims` reads a run's ``figures`` (``bench/results/latest.json``) and returns one
:class:`Aim` per row of the aims table, in a fixed order: what was measured, the target and a
verdict (``True`` met, ``False`` missed, ``None`` not decidable: the figure was not run, failed,
or its numbers cannot decide, e.g. a lower bound below the limit). Nothing here measures and
nothing is asserted: a missed aim is a row, not a failure.

Where both poll modes were measured (figure 3, the peers side by side of figure 10) both are
shown, the library's default mode first; the verdict is on the default mode
(``reconcile.Settings().poll_mode`` unless the run recorded its own).

The peers rows come from figure 10 (the bounded peers run of ``make bench``). A separate
``make bench-peers`` result (``bench/results/peers.json``) can be passed as ``peers``: it
fills the side-by-side rows when figure 10 is absent and adds its recovery runs (figure 10
has none); every row that uses it says so.
"""

from __future__ import annotations

from collections.abc import Iterable
from statistics import median
from typing import Any, NamedTuple

MODES = ("chain", "batch")


class Aim(NamedTuple):
    figure: str  # what is measured, and where (the first column)
    measured: str  # Markdown
    target: str
    ok: bool | None  # met / missed / not decidable


def _get(d: Any, *path: Any, default: Any = None) -> Any:
    for key in path:
        if not isinstance(d, dict) or key not in d:
            return default
        d = d[key]
    return d


def result(figs: dict[str, Any], key: str) -> dict[str, Any] | None:
    """A figure's result, or None when it did not run or failed."""
    r = _get(figs, key, "result")
    return r if isinstance(r, dict) else None


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("**met**" if ok else "**missed**")


def default_mode(env: dict[str, Any] | None = None) -> str:
    """The default poll mode: the one the run recorded, else the library's default now."""
    recorded = (env or {}).get("default_poll_mode")
    if isinstance(recorded, str):
        return recorded
    from reconcile import Settings

    return str(Settings().poll_mode)


def _modes(default: str) -> list[str]:
    return [default, *(m for m in MODES if m != default)]


# ----------------------------------------------------------------------------- verdict algebra


def all_of(oks: Iterable[bool | None]) -> bool | None:
    """Missed when one part missed; undecided when one part is; met when every part met."""
    seen = list(oks)
    if any(ok is False for ok in seen):
        return False
    if any(ok is None for ok in seen):
        return None
    return True


def at_most(value: float | None, limit: float, lower_bound: bool = False) -> bool | None:
    """``value ≤ limit``; a lower bound (the true value is at least ``value``) decides only a
    miss."""
    if value is None:
        return None
    if value > limit:
        return False
    return None if lower_bound else True


def at_least(value: float | None, limit: float) -> bool | None:
    return None if value is None else value >= limit


def _ge(lower_bound: bool) -> str:
    return "≥ " if lower_bound else ""


# ----------------------------------------------------------------------------- the peers


def quiet_pass(res: dict[str, Any] | None) -> dict[str, Any] | None:
    """The quiet pass of a peers result (else its first pass)."""
    passes = _get(res, "passes") or {}
    if not isinstance(passes, dict) or not passes:
        return None
    chosen = passes.get("quiet") or next(iter(passes.values()))
    return chosen if isinstance(chosen, dict) else None


def _from_elsewhere(peers: dict[str, Any]) -> str:
    env = peers.get("environment") or {}
    return (f" *(from `make bench-peers`, {env.get('date_utc', '?')} UTC at "
            f"`{env.get('git_head', '?')}`: not this run)*")


def _peer(runs: dict[str, Any], name: str) -> dict[str, Any] | None:
    v = runs.get(name)
    return v if isinstance(v, dict) and "error" not in v else None


def _absent(runs: dict[str, Any], name: str) -> str:
    return "failed" if name in runs else "not run"


def _delay(v: dict[str, Any]) -> tuple[float | None, bool]:
    d = v.get("delay_intervals") or {}
    return d.get("p99"), bool(d.get("lower_bound"))


def _ahead(mine: float | None, mine_lb: bool, theirs: float | None, theirs_lb: bool
           ) -> bool | None:
    """``mine < theirs`` for a delay where either may be a lower bound."""
    if mine is None or theirs is None:
        return None
    if mine < theirs and not mine_lb:
        return True
    if mine >= theirs and not theirs_lb:
        return False
    return None


def _side_by_side(runs: dict[str, Any], mode: str) -> tuple[str, bool | None]:
    """One mode of ``reconcile`` against plain Celery and DBOS (the same pass, the same N)."""
    name = f"reconcile-{mode}"
    me = _peer(runs, name)
    if me is None:
        return f"{mode}: {_absent(runs, name)}", None
    rate, cpu = me.get("jobs_per_s"), _get(me, "cpu_ms_per_job", "total")
    p99, lb = _delay(me)
    parts = [f"{rate} jobs/s, {cpu} ms CPU/job, p99 delay {_ge(lb)}{p99} intervals"]
    oks: list[bool | None] = [at_most(p99, 1.5, lb)]
    celery = _peer(runs, "plain-celery")
    if celery is not None:
        c_rate, c_cpu = celery.get("jobs_per_s"), _get(celery, "cpu_ms_per_job", "total")
        r_rate = rate / c_rate if rate is not None and c_rate else None
        r_cpu = cpu / c_cpu if cpu is not None and c_cpu else None
        parts.append(
            (f"**{r_rate:.2f}×** plain Celery's jobs/s ({c_rate})" if r_rate is not None
             else "plain Celery's jobs/s not measured")
            + (f", **{r_cpu:.2f}×** its CPU/job ({c_cpu} ms)" if r_cpu is not None
               else ", its CPU/job not measured"))
        oks += [at_least(r_rate, 1.0), at_most(r_cpu, 0.7)]
    else:
        parts.append(f"plain Celery {_absent(runs, 'plain-celery')}")
        oks.append(None)
    dbos = _peer(runs, "dbos")
    if dbos is not None:
        d_rate, d_cpu = dbos.get("jobs_per_s"), _get(dbos, "cpu_ms_per_job", "total")
        d_p99, d_lb = _delay(dbos)
        ahead = [None if rate is None or d_rate is None else rate > d_rate,
                 None if cpu is None or d_cpu is None else cpu < d_cpu,
                 _ahead(p99, lb, d_p99, d_lb)]
        parts.append(f"ahead of DBOS ({d_rate} jobs/s, {d_cpu} ms, p99 {_ge(d_lb)}{d_p99}) on "
                     f"{sum(a is True for a in ahead)} of 3")
        oks += ahead
    else:
        parts.append(f"DBOS {_absent(runs, 'dbos')}")
        oks.append(None)
    return f"{mode}: " + "; ".join(parts), all_of(oks)


def side_by_side(p: dict[str, Any] | None, default: str, note: str = "") -> list[Aim]:
    """One row per job count of the pass; the verdict on the default mode."""
    target = ("≥ 1.0× plain Celery jobs/s, ≤ 0.7× its CPU/job, p99 ≤ 1.5 intervals; ahead of "
              "DBOS on all three")
    runs_by_n = (p or {}).get("runs") or {}
    if not runs_by_n:
        return [Aim("side by side, the default mode against plain Celery and DBOS (figure 10)",
                    "not run", target, None)]
    out = []
    for n, runs in runs_by_n.items():
        cells, ok = [], None
        for mode in _modes(default):
            cell, mode_ok = _side_by_side(runs, mode)
            if mode == default:
                ok, cell = mode_ok, f"**{mode} (default)**:{cell.split(':', 1)[1]}"
            elif f"reconcile-{mode}" not in runs:
                continue
            cells.append(cell)
        out.append(Aim(f"side by side, {int(n):,} jobs, the default mode ({default}) against "
                       "plain Celery and DBOS (figure 10)", "; ".join(cells) + note, target, ok))
    return out


def web_tier(p: dict[str, Any] | None, default: str, note: str = "") -> Aim:
    figure, target = "web tier CPU per submit (figure 10)", "≤ 3 ms"
    runs_by_n = (p or {}).get("runs") or {}
    if not runs_by_n:
        return Aim(figure, "not run", target, None)
    runs = next(iter(runs_by_n.values()))

    def web(name: str) -> Any:
        v = _peer(runs, name)
        return None if v is None else _get(v, "submit", "web_cpu_ms_per_submit")

    cells, ok = [], None
    for mode in _modes(default):
        name = f"reconcile-{mode}"
        if mode != default and name not in runs:
            continue
        value = web(name)
        if mode == default:
            ok = at_most(value, 3.0)
            cells.append(f"**{mode} (default)**: **{value} ms**" if value is not None
                         else f"**{mode} (default)**: {_absent(runs, name)}")
        else:
            cells.append(f"{mode}: {value} ms" if value is not None
                         else f"{mode}: {_absent(runs, name)}")
    peers = [f"{label} {web(name)} ms" for label, name in (("plain Celery", "plain-celery"),
                                                          ("DBOS", "dbos"))
             if web(name) is not None]
    return Aim(figure, "; ".join(cells) + (f" (the same submit elsewhere: {', '.join(peers)})"
                                           if peers else "") + note, target, ok)


# ----------------------------------------------------------------------------- the figures


def drain(r2: dict[str, Any] | None) -> Aim:
    figure, target = "backlog drain, 10,000 stale jobs, one worker host (figure 2)", \
        "≥ 150 jobs/s (≥ 50% of no-op)"
    if r2 is None:
        return Aim(figure, "not run", target, None)
    rate, jobs = r2["jobs_per_s"], r2["jobs"]
    noop = _get(r2, "machine_limit_noop", "tasks_per_s")
    share = rate / noop if noop else None
    done = r2.get("finished") and r2.get("completed", jobs) >= jobs
    measured = (f"{r2.get('mode', 'chain')}: **{rate} jobs/s** ({r2.get('completed', jobs):,} of {jobs:,} in "
                f"{r2['seconds']} s" + ("" if done else ", the budget") + ")"
                + (f" = **{share:.0%}** of the no-op rate ({noop} tasks/s)" if share is not None
                   else "; no-op rate not measured"))
    floor = _get(r2, "lean_floor", "jobs_per_s")
    if floor and noop:  # the same per-job work with no library, no Celery (bench.drain_floor)
        measured += (f"; a lean client doing the same per-job work with no library and no Celery: "
                     f"{floor} jobs/s = {floor / noop:.0%} of the no-op rate, of which the "
                     f"library reaches {rate / floor:.0%}")
    ok = all_of([at_least(rate, 150), at_least(share, 0.5)])
    if ok and not (done and jobs >= 10_000):
        ok = None  # the rate holds for a partial or smaller drain: not the aim's
    return Aim(figure, measured, target, ok)


def _fig3_runs(r3: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{mode: {N: run}} of figure 3 (its chain runs, then its batch runs)."""
    out: dict[str, dict[str, Any]] = {}
    for n, v in (r3.get("runs") or {}).items():
        out.setdefault(v.get("mode", "chain") if isinstance(v, dict) else "chain", {})[n] = v
    for n, v in (_get(r3, "batch", "runs") or {}).items():
        out.setdefault("batch", {})[n] = v
    return out


def _iv(run: dict[str, Any]) -> tuple[float | None, bool]:
    return (_get(run, "overhead_in_poll_intervals", "p99"),
            bool(_get(run, "overhead_lower_bound", "p99")))


def in_flight(r3: dict[str, Any] | None, default: str) -> Aim:
    """p99 completion overhead; the verdict on the default mode at 10,000 in flight (when that
    mode only ran smaller, a miss there is a miss: more in flight on the same host is no
    faster)."""
    figure = "in flight, p99 completion overhead (figure 3)"
    target = "10,000 in flight at p99 ≤ 2 intervals on one worker host"
    if r3 is None:
        return Aim(figure, "not run", target, None)
    by_mode = _fig3_runs(r3)
    cells, ok = [], None
    for mode in _modes(default):
        runs = by_mode.get(mode) or {}
        label = f"{mode} (default)" if mode == default else mode
        parts = []
        for n, run in runs.items():
            if "error" in run:
                parts.append(f"{int(n):,}: failed")
                continue
            p99, lb = _iv(run)
            left = run.get("still_in_flight_at_cap")
            parts.append(f"{int(n):,}: p99 {_ge(lb)}{p99} intervals"
                         + (f" ({run['completed']:,} of {int(n):,} done by the cap)" if left
                            else ""))
        if mode == default:
            big = runs.get("10000")
            if big is not None and "error" not in big:
                p99, lb = _iv(big)
                ok = at_most(p99, 2.0, lb)
            else:
                missed = [f"{int(n):,}" for n, v in runs.items()
                          if "error" not in v and at_most(_iv(v)[0], 2.0, _iv(v)[1]) is False]
                ok = False if missed else None
                parts.append("not run at 10,000" + (f" (missed already at {', '.join(missed)})"
                                                    if missed else ""))
            cells.append(f"**{label}**: " + "; ".join(parts))
        elif runs:
            cells.append(f"{label}: " + "; ".join(parts))
    if not (_get(r3, "batch", "available", default=True)):
        cells.append("batch: not available in this library")
    return Aim(figure, "; ".join(cells), target, ok)


def cpu_per_poll(r3: dict[str, Any] | None, default: str) -> Aim:
    figure = "CPU per in-flight poll, worker + PostgreSQL + simulator (figure 3)"
    target = "≤ 3 ms in the default mode"
    if r3 is None:
        return Aim(figure, "not run", target, None)
    by_mode = _fig3_runs(r3)
    cells, ok = [], None
    for mode in _modes(default):
        measured = [(n, v["cpu_ms_per_poll"]) for n, v in (by_mode.get(mode) or {}).items()
                    if isinstance(v.get("cpu_ms_per_poll"), dict)]
        if mode == default:
            ok = all_of(at_most(c.get("total"), 3.0) for _, c in measured) if measured else None
        if not measured:
            if mode == default:
                cells.append(f"**{mode} (default)**: not measured (no steady window)")
            continue
        label = f"**{mode} (default)**" if mode == default else mode
        cells.append(f"{label}: " + "; ".join(
            f"{int(n):,}: {'**' if mode == default else ''}{c.get('total')} ms"
            f"{'**' if mode == default else ''} (worker {c.get('worker')} + PostgreSQL "
            f"{c.get('postgres')} + simulator {c.get('bench')})" for n, c in measured))
    return Aim(figure, "; ".join(cells), target, ok)


LEDGER_AIMS = {"hot_user": ("hot user", 0.50), "1000_users": ("1,000 users", 0.70)}


def ledger(r4: dict[str, Any] | None) -> Aim:
    """Ledger transactions/s ÷ pgbench tps: the median of the runs of each shape (min–max)."""
    figure = "ledger transactions/s ÷ pgbench simple-update tps (figure 4)"
    target = "≥ 50% hot user, ≥ 70% 1,000 users (median of the runs)"
    if r4 is None:
        return Aim(figure, "not run", target, None)
    by_shape: dict[str, list[float]] = {}
    for k, v in (r4.get("runs") or {}).items():
        if isinstance(v.get("txn_ratio_to_pgbench"), int | float):
            by_shape.setdefault(k.split("/")[-1], []).append(v["txn_ratio_to_pgbench"])
    cells: list[str] = []
    oks: list[bool | None] = []
    for shape, (label, limit) in LEDGER_AIMS.items():
        vals = by_shape.get(shape)
        if not vals:
            cells.append(f"{label}: not run")
            oks.append(None)
            continue
        mid = median(vals)
        cells.append(f"{label}: median **{mid:.1%}** ({min(vals):.1%}–{max(vals):.1%}, "
                     f"{len(vals)} runs)")
        oks.append(mid >= limit)
    cells += [f"{shape}: median {median(v):.1%}" for shape, v in by_shape.items()
              if shape not in LEDGER_AIMS]
    return Aim(figure, "; ".join(cells) + f"; pgbench {r4.get('pgbench_tps_mean')} tps",
               target, all_of(oks))


def statements(r5: dict[str, Any] | None, default: str = "chain") -> Aim:
    """The default mode's count decides (a result from before figure 5 counted batch mode has
    the chain's only); the other mode's is shown beside it."""
    figure = "statements per happy-path job outside polls (figure 5)"
    target = "≤ 8"
    if r5 is None:
        return Aim(figure, "not run", target, None)
    modes = r5.get("by_mode") or {"chain": r5["headline"]}
    cells = [f"{mode}{' (default)' if mode == default else ''}: **{h['outside_polls']}** "
             f"({h.get('per_poll')} per poll); {h.get('transactions_outside_polls')} transactions "
             f"outside the polls ({h.get('transactions_per_poll')} per poll)"
             for mode in _modes(default) if (h := modes.get(mode)) is not None]
    h = modes.get(default)
    return Aim(figure, "; ".join(cells) + ("" if len(modes) > 1 else " (chain only)"), target,
               None if h is None else at_most(h["outside_polls"], 8))


def fig9_modes(r9: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """Figure 9's runs by polling mode (a result from before it ran both modes was one chain
    run at its top level)."""
    if r9 is None:
        return {}
    return dict(r9.get("modes") or {r9.get("mode", "chain"): r9})


def recovery(r9: dict[str, Any] | None, p: dict[str, Any] | None, default: str,
             note: str = "") -> Aim:
    """Figure 9's kill → recovery of each affected job decides, on the default mode's run (both
    modes must meet it; a run of the default mode missing leaves the verdict open); the peers
    recovery runs (both modes) are shown beside it: they measure each job's completion delay
    past its upstream's done time, which hides a recovery shorter than the rest of the
    generation, so they do not decide the verdict."""
    figure = ("recovery after SIGKILL of every worker mid-poll, p99, default settings "
              "(figure 9; the peers recovery runs)")
    target = "≤ 10 s in both modes"
    cells: list[str] = []
    runs = fig9_modes(r9)
    oks = []
    for mode in _modes(default):
        r = runs.get(mode)
        if r is None:
            continue
        p99 = _get(r, "recovery_s", "p99")
        label = f"{mode} (default)" if mode == default else mode
        what = ("chains, kill → first poll of the resumed generation" if mode == "chain"
                else "claimed rows, kill → the row claimed again")
        cells.append(f"**{label}: {p99} s** ({_get(r, 'recovery_s', 'n')} of {r.get('affected')} "
                     f"{what}; {r.get('unresolved')} unresolved)")
        oks.append(None if p99 is None else (p99 <= 10 and not r.get("unresolved")))
    if not cells:
        cells.append("figure 9 (kill → resume): not run")
    ok = all_of(oks) if default in runs else None  # every mode run; open without the default's
    rec = (p or {}).get("recovery") or {}
    if r9 is None and not rec:
        return Aim(figure, "not run", target, None)
    peer_cells = []
    for mode in _modes(default):
        v = rec.get(f"reconcile-{mode}")
        if v is None:
            continue
        if "error" in v:
            peer_cells.append(f"{mode}: failed")
            continue
        d = v.get("delay_intervals") or {}
        lb = bool(d.get("lower_bound"))
        secs = _get(v, "delay_s", "p99")
        after = v.get("all_terminal_after_kill_s")
        peer_cells.append(
            f"{mode}: p99 {_ge(lb)}{d.get('p99')} intervals"
            + (f" ({secs} s)" if secs is not None and not lb else "")
            + (f", all terminal {after} s after the kill" if after is not None
               else f", {v.get('in_flight')} of {v.get('jobs')} in flight at the cap"))
    if peer_cells:
        jobs = next((v.get("jobs") for v in rec.values() if isinstance(v, dict) and "jobs" in v),
                    "?")
        cells.append(f"peers recovery runs ({jobs} jobs; delay past upstream done): "
                     + "; ".join(peer_cells) + note)
    return Aim(figure, "; ".join(cells), target, ok)


# ----------------------------------------------------------------------------- the table


def aims(figs: dict[str, Any], default: str, peers: dict[str, Any] | None = None) -> list[Aim]:
    """Every aim, in the table's order, from one run's ``figures`` (and, for the peers rows
    figure 10 lacks, a separate ``make bench-peers`` result)."""
    own = quiet_pass(result(figs, "fig10"))
    other = quiet_pass(peers) if peers else None
    side, side_note = (own, "") if own and own.get("runs") else (
        (other, _from_elsewhere(peers)) if other and peers else (None, ""))
    rec, rec_note = (own, "") if own and own.get("recovery") else (
        (other, _from_elsewhere(peers)) if other and other.get("recovery") and peers
        else (None, ""))
    return [*side_by_side(side, default, side_note),
            drain(result(figs, "fig2")),
            in_flight(result(figs, "fig3"), default),
            cpu_per_poll(result(figs, "fig3"), default),
            ledger(result(figs, "fig4")),
            statements(result(figs, "fig5"), default),
            recovery(result(figs, "fig9"), rec, default, rec_note),
            web_tier(side, default, side_note)]


def table(figs: dict[str, Any], default: str, peers: dict[str, Any] | None = None) -> list[str]:
    """The aims table's Markdown lines (heading row included)."""
    rows = ["| figure | measured | aim | verdict |", "|---|---|---|---|"]
    rows += [f"| {a.figure} | {a.measured} | {a.target} | {verdict(a.ok)} |"
             for a in aims(figs, default, peers)]
    return rows
