"""The peers benchmark's arithmetic (``bench/peers/measure.py``) and its table
(``bench/peers/report.py``): a delay is measured from the upstream's done time in poll
intervals, a job still in flight makes its percentile a lower bound ("≥"), and the checks fail
a run that did not complete every job or left the ledger unbalanced. No timing is asserted."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

from bench.peers import measure, report

CREATED = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def _task(task_id: str, created: datetime = CREATED) -> dict[str, str]:
    return {"task_id": task_id, "created_at": created.isoformat().replace("+00:00", "Z")}


def _row(task_id: str | None, status: str, completed: datetime | None) -> SimpleNamespace:
    return SimpleNamespace(task_id=task_id, status=status, completed_at=completed)


def test_a_delay_is_the_result_time_past_the_upstream_done_time() -> None:
    done_at = CREATED + timedelta(seconds=measure.GENERATION_S)
    rows = [_row("a", "completed", done_at + timedelta(seconds=2.5)),
            _row("b", "completed", (done_at + timedelta(seconds=10)).replace(tzinfo=None)),
            _row(None, "pending", None)]  # never created upstream: no upstream done time
    done, still_open, completions = measure._delays(
        rows, {"a": _task("a"), "b": _task("b")}, end=done_at + timedelta(seconds=60))
    assert done == [2.5, 10.0]  # a naive timestamp is read as UTC
    assert still_open == []
    assert len(completions) == 2
    delays = measure._intervals(done, still_open)
    assert delays["p50"] == round(6.25 / measure.INTERVAL_S, 2)
    assert delays["lower_bound"] is False


def test_a_job_still_in_flight_counts_its_delay_so_far_as_a_lower_bound() -> None:
    done_at = CREATED + timedelta(seconds=measure.GENERATION_S)
    end = done_at + timedelta(seconds=100)
    rows = [_row("a", "completed", done_at + timedelta(seconds=1)),
            _row("b", "processing", None), _row("c", "failed", None)]
    tasks = {t: _task(t) for t in "abc"}
    done, still_open, _ = measure._delays(rows, tasks, end)
    assert (done, still_open) == ([1.0], [100.0])  # a failed job is terminal: not open
    delays = measure._intervals(done, still_open)
    assert delays["p99"] >= 19 and delays["lower_bound"] is True
    assert report._delay(delays).startswith("≥ ")


def test_the_checks_fail_a_run_with_a_job_not_completed_or_an_unbalanced_ledger() -> None:
    good = {"ledger": {"by_status": {"completed": 3}, "problems": {}}, "in_flight": 0}
    assert measure._checks(good, 3, recovery=False) == []
    short = {"ledger": {"by_status": {"completed": 2, "running": 1}, "problems": {}},
             "in_flight": 1}
    assert len(measure._checks(short, 3, recovery=False)) == 2
    # a recovery run may end with jobs in flight (the cap), never with the ledger unbalanced
    assert measure._checks(short, 3, recovery=True) == []
    unbalanced = {"ledger": {"by_status": {"completed": 3}, "problems": {"bad_commit": 1}},
                  "in_flight": 0}
    assert measure._checks(unbalanced, 3, recovery=True) == [
        "ledger not balanced: {'bad_commit': 1}"]


def test_the_table_has_a_row_per_system_with_its_recovery_and_names_an_error() -> None:
    run = {"jobs_per_s": 10.0, "cpu_ms_per_job": {"workers": 1.0, "postgres": 2.0, "redis": 0.5,
                                                 "simulator": 0.5, "total": 4.0},
           "submit": {"web_cpu_ms_per_submit": 3.0}, "xacts_per_job": 7.5,
           "delay_intervals": {"n": 3, "p50": 0.2, "p99": 0.4, "lower_bound": False}}
    recovered = {"jobs": 200, "all_terminal_after_kill_s": 20.0, "in_flight": 0,
                 "delay_intervals": {"n": 200, "p99": 1.1, "lower_bound": False}}
    stuck = {"jobs": 200, "all_terminal_after_kill_s": None, "in_flight": 200,
             "delay_intervals": {"n": 200, "p99": 30.0, "lower_bound": True}}
    text = report.tables({"quiet": {
        "runs": {"500": {"reconcile-chain": run, "plain-celery": run,
                         "dbos": {"error": "Traceback…\nRuntimeError: boom"}}},
        "recovery": {"reconcile-chain": recovered, "plain-celery": stuck}}})
    lines = text.splitlines()
    chain = next(line for line in lines if line.startswith("| reconcile-chain"))
    assert "**4.0** = 1.0 + 2.0 + 0.5 + 0.5" in chain and "0.2 / 0.4" in chain
    assert "1.1 (all terminal 20.0 s after the kill)" in chain
    plain = next(line for line in lines if line.startswith("| plain-celery"))
    assert "≥ 30.0 (200 of 200 still in flight at the cap)" in plain
    assert [line for line in lines if line.startswith("| ")][1].startswith("| plain-celery")
    assert "**500 dbos failed:**" in text and "RuntimeError: boom" in text
