"""The aims table of ``make bench``'s report (``bench/aims.py``, ``bench/report.py``), rendered
from hand-written results: each row's verdict follows its numbers (met, missed, n/a), a figure
absent from the run is "not run", the verdict is on the default poll mode, and a separate
peers run is labelled as such. Only the arithmetic on given numbers is checked; no timing is
measured or asserted."""

from __future__ import annotations

from typing import Any

from bench import aims, report


def _peer(rate: float, cpu: float, p99: float, web: float) -> dict[str, Any]:
    return {"jobs_per_s": rate, "cpu_ms_per_job": {"total": cpu},
            "delay_intervals": {"p99": p99, "lower_bound": False},
            "submit": {"web_cpu_ms_per_submit": web}}


def _figures() -> dict[str, Any]:
    return {
        "fig2": {"result": {"jobs": 10_000, "completed": 10_000, "finished": True,
                            "seconds": 200.0, "jobs_per_s": 50.0,
                            "machine_limit_noop": {"tasks_per_s": 300.0}}},
        "fig5": {"result": {"headline": {"outside_polls": 7, "per_poll": 1,
                                         "transactions_outside_polls": 3,
                                         "transactions_per_poll": 1}}},
        "fig4": {"result": {"pgbench_tps_mean": 1000.0, "runs": {
            "reserve+commit/hot_user": {"txn_ratio_to_pgbench": 0.60},
            "reserve+refund/hot_user": {"txn_ratio_to_pgbench": 0.40},
            "reserve+commit/1000_users": {"txn_ratio_to_pgbench": 0.80},
            "reserve+refund/1000_users": {"txn_ratio_to_pgbench": 0.75}}}},
        "fig3": {"result": {"jobs": 2000, "runs": {"2000": {
            "mode": "chain", "overhead_in_poll_intervals": {"p99": 1.5},
            "overhead_lower_bound": {"p99": False},
            "cpu_ms_per_poll": {"total": 2.5, "worker": 2.0, "postgres": 0.3, "bench": 0.2}}},
            "batch": {"available": True, "runs": {"10000": {
                "mode": "batch", "overhead_in_poll_intervals": {"p99": 9.0},
                "overhead_lower_bound": {"p99": True},
                "cpu_ms_per_poll": {"total": 4.0}}}}}},
        "fig10": {"result": {"passes": {"quiet": {"runs": {"500": {
            "plain-celery": _peer(10.0, 100.0, 0.1, 2.0),
            "reconcile-chain": _peer(11.0, 60.0, 0.2, 2.5),
            "reconcile-batch": _peer(9.0, 50.0, 0.5, 4.0),
            "dbos": _peer(8.0, 120.0, 1.0, 3.0)}}}}}},
    }


def _by_figure(rows: list[aims.Aim]) -> dict[str, aims.Aim]:
    return {a.figure.split(" (figure")[0].split(",")[0]: a for a in rows}


def test_each_aim_follows_its_numbers_met_missed_and_not_run() -> None:
    rows = _by_figure(aims.aims(_figures(), "chain"))
    assert rows["statements per happy-path job outside polls"].ok is True  # 7 ≤ 8
    assert rows["backlog drain"].ok is False  # 50 jobs/s < 150
    # the median per shape decides (hot user 50%, 1,000 users 77.5%), min–max shown too
    ledger = rows["ledger transactions/s ÷ pgbench simple-update tps"]
    assert ledger.ok is True and "40.0%–60.0%" in ledger.measured
    # chain (the default) met at 2,000 but never ran at 10,000: undecided; batch missing
    # 10,000 does not decide
    assert rows["in flight"].ok is None and "not run at 10,000" in rows["in flight"].measured
    assert rows["CPU per in-flight poll"].ok is True  # chain 2.5 ms; batch's 4 ms not judged
    assert rows["side by side"].ok is True
    assert rows["web tier CPU per submit"].ok is True
    recovery = rows["recovery after SIGKILL of every worker mid-poll"]
    assert (recovery.measured, recovery.ok) == ("not run", None)  # no figure 9, no peers


def test_the_verdict_is_on_the_default_poll_mode() -> None:
    rows = _by_figure(aims.aims(_figures(), "batch"))
    assert rows["side by side"].ok is False  # batch: 0.9× plain Celery's jobs/s
    assert rows["web tier CPU per submit"].ok is False  # batch: 4 ms
    assert rows["CPU per in-flight poll"].ok is False  # batch: 4 ms
    assert rows["in flight"].ok is False  # batch at 10,000: ≥ 9 intervals, a lower bound > 2
    assert rows["side by side"].measured.startswith("**batch (default)**")


def test_a_missing_figure_is_not_run_and_a_separate_peers_run_is_labelled() -> None:
    figs = _figures()
    side = figs.pop("fig10")["result"]
    lines = aims.table({}, "chain")
    assert len(lines) == 2 + 8 and all(line.endswith("| n/a |") for line in lines[2:])
    assert all("| not run |" in line for line in lines[2:])
    peers = {"environment": {"date_utc": "2026-01-01 00:00:00", "git_head": "abc1234"},
             "passes": {"quiet": {**side["passes"]["quiet"], "recovery": {
                 "reconcile-chain": {"jobs": 200, "delay_intervals": {"p99": 1.0},
                                     "delay_s": {"p99": 5.0}, "all_terminal_after_kill_s": 27.0}
             }}}}
    rows = _by_figure(aims.aims(figs, "chain", peers))
    assert rows["side by side"].ok is True and "not this run" in rows["side by side"].measured
    recovery = rows["recovery after SIGKILL of every worker mid-poll"]
    # the peers recovery run is shown; it measures the completion delay, not kill → resume
    assert "not this run" in recovery.measured and recovery.ok is None
    figs["fig9"] = {"result": {"recovery_s": {"p99": 12.0, "n": 200}, "affected": 200,
                               "unresolved": 0}}
    assert _by_figure(aims.aims(figs, "chain"))[
        "recovery after SIGKILL of every worker mid-poll"].ok is False


def test_the_report_opens_with_the_aims_table() -> None:
    env: dict[str, Any] = {k: "?" for k in ("date_utc", "git_head", "platform", "postgresql",
                                            "redis", "python", "celery", "sqlalchemy",
                                            "psycopg")}
    env.update(git_dirty_files=0, cpus=2)
    res = {"environment": env, "args": {}, "figures": {}, "wall_seconds": 0.0}
    text = report.markdown(res, default_mode="chain")
    summary = text.split("## Summary\n", 1)[1]
    assert summary.lstrip().startswith("The performance aims, every row from this one run:")
    assert "| figure | measured | aim | verdict |" in summary.split("Every figure", 1)[0]


def _ledger_result(with_functions: bool) -> dict[str, Any]:
    run = {"cycles_per_s": 300.0, "ratio_to_pgbench": 0.3, "txn_ratio_to_pgbench": 0.6,
           "client_cpu_ms_per_cycle": 1.2, "errors": 0, "per_second": [300, 300]}
    result: dict[str, Any] = {
        "clients": 2, "seconds_per_run": 2.0, "pgbench": [{"tps": 1000.0}],
        "pgbench_tps_mean": 1000.0,
        "runs": {"reserve+commit/hot_user": dict(run), "reserve+commit/1000_users": dict(run)}}
    if with_functions:
        result["runs"]["reserve+commit/hot_user"]["share_of_functions_ceiling"] = 0.75
        result["runs"]["reserve+commit/1000_users"]["share_of_functions_ceiling"] = 0.5
        result["functions_under_pgbench"] = {
            "reserve+commit/hot_user": {"cycles_per_s": 400.0, "txn_ratio_to_pgbench": 0.8,
                                        "command": "pgbench -n -f <cycle.sql>"},
            "reserve+commit/1000_users": {"cycles_per_s": 600.0, "txn_ratio_to_pgbench": 1.2,
                                          "command": "pgbench -n -f <cycle.sql>"}}
        result["functions_lean_python"] = {  # the hot user's only: a column left out shows —
            "reserve+commit/hot_user": {"cycles_per_s": 350.0, "txn_ratio_to_pgbench": 0.7,
                                        "client_cpu_ms_per_cycle": 0.4}}
    return result


def test_the_ledger_section_reports_the_functions_ceiling_and_the_python_share() -> None:
    """Figure 4 shows the ledger functions under pgbench (no Python client) beside the Python
    runs: each ceiling, its ratio to pgbench, a lean Python client's run of the same calls, and
    the share of the ceiling the library's run reached; a result without that measurement
    renders without the section."""
    text = report._fig4(_ledger_result(True))
    assert "| reserve+commit/hot_user | 400.0 | 80.0% | 350.0, 70.0%, 0.4 | 75% (300.0 cycles/s) |" \
        in text
    assert "| reserve+commit/1000_users | 600.0 | 120.0% | — | 50% (300.0 cycles/s) |" in text
    assert "(400.0 cycles/s against 600.0 for 1,000 users, both without Python)" in text
    assert "the library's runs: 1.2–1.2 ms of client CPU per cycle" in text
    bare = report._fig4(_ledger_result(False))
    assert "no Python" not in bare and "| reserve+commit/hot_user | 300.0 |" in bare


def test_the_drain_is_read_against_a_lean_floor_when_one_was_measured() -> None:
    """Figure 2's aim and section show the lean client's drain (the same per-job work with no
    library and no Celery) as a share of the no-op rate, and the library's share of it; a
    result without that measurement renders without it."""
    figs = _figures()
    figs["fig2"]["result"]["lean_floor"] = {"jobs": 2000, "processes": 2, "threads": 4,
                                            "seconds": 20.0, "jobs_per_s": 100.0,
                                            "client_cpu_ms_per_job": 3.0}
    row = _by_figure(aims.aims(figs, "batch"))["backlog drain"]
    assert row.ok is False
    assert "100.0 jobs/s = 33% of the no-op rate, of which the library reaches 50%" in row.measured
    r2 = {**figs["fig2"]["result"], "worker": "1 worker", "seed_cron_seconds_for_n": 60_000,
          "ratio_to_seed_cron": 300.0, "curve": [(0.0, 0), (200.0, 10_000)],
          "machine_limit_noop": {"tasks": 2000, "tasks_per_s": 300.0}}
    text = report._fig2(r2)
    assert "**100.0 jobs/s** (20.0 s; 3.0 ms of client CPU per job) = **33%** of the no-op" in text
    assert "The library's drain reaches 50% of it" in text
    assert "`reconcile.reconcile_jobs` messages (chunks of" in text  # chain mode's fan-out
    r2.update(made_due_by_sweep=9_000, fanned_out_messages=0)
    assert "the tick made 9,000 rows due for the batch poller" in report._fig2(r2)
    del r2["lean_floor"]
    assert "floor" not in report._fig2(r2)
    assert "lean client" not in _by_figure(aims.aims(_figures(), "batch"))["backlog drain"].measured
