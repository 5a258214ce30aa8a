"""The interleaving explorer (``reconcile.testing.explorer``) at a bounded size.

``make explore`` runs every scenario at the full bounds; here a chosen set runs with one
preemption and one clock jump, and the explorer proves it is not blind: a deliberately broken
writer (a completion without its compare-and-set) is caught, only by an interleaving, and the
violating schedule replays to the same trace.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import update

from reconcile import credits, jobstore
from reconcile.db.models import Job
from reconcile.jobstore.events import add_event
from reconcile.states import IN_FLIGHT, Status
from reconcile.testing import explorer as ex
from reconcile.testing.explorer import scenarios as sc
from tests.conftest import PG_ADMIN_URL

BOUNDS = ex.Bounds(preemptions=1, jumps=1)

# a scenario whose hole is still open on main would be listed here as (name, reason), run as a
# strict xfail: the day the fix lands the marker has to go. Holes 1 and 8 are fixed (i11b).
OPEN_HOLES: dict[str, str] = {}


@pytest.fixture(scope="module")
def explorer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ex.Explorer]:
    with ex.scratch_database(PG_ADMIN_URL) as url, \
            ex.Explorer(url, workdir=Path(tmp_path_factory.mktemp("explorer"))) as explorer:
        yield explorer


def _bounded(name: str) -> object:
    if name in OPEN_HOLES:
        return pytest.param(name, marks=pytest.mark.xfail(reason=OPEN_HOLES[name], strict=True))
    return name


@pytest.mark.parametrize("name", [_bounded(n) for n in sc.BOUNDED])
def test_bounded_exploration_finds_no_violation(explorer: ex.Explorer, name: str) -> None:
    scenario = sc.scenarios_named([name])[0]
    cap = sc.BOUNDED[name]
    report = explorer.explore(scenario, ex.Bounds(BOUNDS.preemptions, BOUNDS.jumps,
                                                  cap if cap is not None else 10_000))
    print(report.line())
    assert report.schedules > 1
    assert cap is not None or not report.truncated
    assert report.diverged == 0, "a replayed prefix took another path: the run is not deterministic"
    if report.first_violation is not None:
        pytest.fail(ex.describe(report.first_violation, scenario), pytrace=False)


# ----------------------------------------------------------------------------- self-tests


def _complete_without_cas(rt: object, ctx: ex.Context) -> str:
    """BROKEN on purpose: decides on a plain read, then completes with no status guard."""
    with rt.sessions() as session:  # type: ignore[attr-defined]
        job = jobstore.load(session, ctx.job_id)
    assert job is not None
    if job.status not in IN_FLIGHT:
        return "already terminal"
    now = rt.now()  # type: ignore[attr-defined]
    with rt.sessions.begin() as session:  # type: ignore[attr-defined]
        session.execute(update(Job).where(Job.id == ctx.job_id)  # the missing CAS
                        .values(status=Status.COMPLETED, completed_at=now, next_poll_at=None,
                                poll_lease_expires_at=None))
        credits.commit(session, ctx.job_id, now=now)
        session.execute(update(Job).where(Job.id == ctx.job_id).values(
            credits_actual=credits.settled_amount(session, ctx.job_id)))
        add_event(session, job, "completed", now)
    return "completed"


BROKEN = ex.Writer("complete_without_cas", _complete_without_cas)
DOUBLE = ex.Scenario("selftest:double_completion", sc.accepted(), (BROKEN, BROKEN))


def test_explorer_catches_a_double_completion_only_an_interleaving_shows(explorer: ex.Explorer) -> None:
    sequential = explorer.run_schedule(DOUBLE, ())
    assert sequential.violations == (), "the default (sequential) schedule must be clean"

    report = explorer.explore(DOUBLE, ex.Bounds(preemptions=1, jumps=0), stop_at_first=True)
    print(report.line())
    assert report.violating >= 1
    assert "two_completions" in report.violation_kinds
    found = report.first_violation
    assert found is not None

    again = explorer.run_schedule(DOUBLE, found.choices)  # the printed schedule replays
    assert not again.diverged
    assert again.trace == found.trace
    assert again.violations == found.violations
    assert "--replay" in ex.describe(found, DOUBLE)


def _raises(exc: BaseException) -> ex.Writer:
    def body(rt: object, ctx: ex.Context) -> str:
        raise exc
    return ex.Writer(f"raises_{type(exc).__name__}", body)


def test_a_writer_raising_what_the_library_never_raises_is_a_violation(explorer: ex.Explorer) -> None:
    """An ImportError (a module moved, an import left behind) or a TypeError out of a writer is a
    bug in the code under test, reported even when every row invariant holds; the library's own
    errors and a database error are outcomes the invariants judge."""
    from sqlalchemy.exc import OperationalError

    from reconcile.errors import Conflict, ErrorCode

    broken = ex.Scenario("selftest:raises", sc.accepted(),
                         (_raises(ImportError("cannot import name 'x' from 'reconcile.y'")),
                          _raises(TypeError("f() takes 1 positional argument"))))
    result = explorer.run_schedule(broken, ())
    assert [v for v in result.violations if v.startswith("unexpected raise")] == [
        "unexpected raise: raises_ImportError raised ImportError: cannot import name 'x' "
        "from 'reconcile.y'",
        "unexpected raise: raises_TypeError raised TypeError: f() takes 1 positional argument"]
    judged = ex.Scenario("selftest:raises_expected", sc.accepted(),
                         (_raises(Conflict(ErrorCode.JOB_NOT_CANCELABLE, "already cancelled")),
                          _raises(OperationalError("SELECT 1", {}, Exception("lock timeout")))))
    result = explorer.run_schedule(judged, ())
    assert not [v for v in result.violations if v.startswith("unexpected raise")], result.violations


def test_a_writer_waiting_on_a_row_lock_is_detected_and_the_other_runs(explorer: ex.Explorer) -> None:
    scenario = sc.scenarios_named(["unsettled:settle/settle"])[0]
    waits: list[tuple[str, ...]] = []
    report = explorer.explore(scenario, ex.Bounds(preemptions=1, jumps=0),
                              on_schedule=lambda r: waits.append(r.trace)
                              if any("waits on a row lock" in step for step in r.trace) else None)
    print(report.line())
    if report.first_violation is not None:
        pytest.fail(ex.describe(report.first_violation, scenario), pytrace=False)
    assert waits, "no schedule put one settle behind the other's row lock"
    trace = waits[0]
    blocked = next(i for i, step in enumerate(trace) if "waits on a row lock" in step)
    assert "FOR UPDATE" in trace[blocked - 1]  # the lock request that waits


def test_the_command_lists_every_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    assert ex.main(["--list"]) == 0
    listed = capsys.readouterr().out
    assert all(scenario.name in listed for scenario in sc.SCENARIOS)
    assert len(sc.SCENARIOS) >= 20


# ----------------------------------------------------------------------------- settlement policy


def test_a_scenario_s_policy_reaches_every_runtime_and_goes_with_it(explorer: ex.Explorer) -> None:
    """A scenario's settings (here the partial policy) are the deployment's for the whole
    schedule: both writers' runtimes and the quiescence's settle with it; the next scenario
    without them is back on the default policy."""
    from reconcile.settlement import DEFAULT_POLICY, SettlementPolicy
    from reconcile.testing.explorer.common import PARTIAL_POLICY

    seen: list[SettlementPolicy] = []

    def policy(rt: object, ctx: ex.Context) -> str:
        seen.append(rt.settlement_policy)  # type: ignore[attr-defined]
        return "seen"

    writer = ex.Writer("policy", policy)
    partial = SettlementPolicy(**dict(PARTIAL_POLICY))
    result = explorer.run_schedule(ex.Scenario("selftest:policy", sc.accepted(), (writer, writer),
                                               settings=PARTIAL_POLICY), ())
    assert result.violations == ()
    assert seen == [partial, partial]
    assert explorer.rt.settlement_policy == partial  # the quiescence's runtime
    explorer.run_schedule(ex.Scenario("selftest:default", sc.accepted(), (writer, writer)), ())
    assert seen[2:] == [DEFAULT_POLICY, DEFAULT_POLICY]
    assert explorer.rt.settlement_policy == DEFAULT_POLICY


def test_the_explorer_finds_a_cancel_settled_under_the_failure_share(
        explorer: ex.Explorer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 24 finding 3, its fix reverted here only: a cancel that does not record its request
    before asking the provider lets the poll read the upstream ``canceled`` first and settle
    the failure share (keep 20 of 40 under failures 1/2), then the cancel relabels the job
    cancelled — the cancel share keeps 26. The share invariant catches it (the audit does not),
    within the bounded run's cap (the 27th schedule; 110 in the tree)."""
    from reconcile.lifecycle import cancel

    monkeypatch.setattr(cancel, "record_cancel_request", lambda rt, job_id: True)
    scenario = sc.scenarios_named(["running_partial:poll/cancel"])[0]
    cap = sc.BOUNDED[scenario.name]
    assert cap is not None
    report = explorer.explore(scenario, ex.Bounds(BOUNDS.preemptions, BOUNDS.jumps, cap),
                              stop_at_first=True)
    print(report.line())
    found = report.first_violation
    assert found is not None, "the bounded run no longer finds finding 3 with its fix reverted"
    assert set(report.violation_kinds) == {"settled_off_rule"}, report.violation_kinds
    assert any("cancelled settled by a commit of 20" in v and "keep 26" in v
               for v in found.violations), found.violations
