"""The sweep's decision table (reconcile.sweep.table.decide), database-free and table-driven.

One row per line of the table (README, The sweep; the rows' docstrings in
``reconcile/sweep/table.py``): the job's columns, its kind and the settings in, the matched row
and the action out. The expected actions are those the PostgreSQL tests in
``tests/integration/test_sweep*.py`` see the sweep carry out. Most lines come in pairs either
side of one condition (an age, a lease, a count, a mode), so flipping any row function's
condition fails at least one line.
"""

from __future__ import annotations

import ast
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from reconcile import Kind, Settings
from reconcile.db.models import Job
from reconcile.sweep import Action, Decision, decide as decide_rt
from reconcile.sweep.table import SETTLE_GRACE, Guard, decide, needs_legacy_cutoff

MIN = timedelta(minutes=1)
NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
CUTOFF = datetime(2026, 1, 1, tzinfo=UTC)  # the adoption time: legacy rows were created before
OLD = datetime(2025, 12, 1, tzinfo=UTC)

# a 10-minute async kind and a 5-minute sync kind (thresholds as kie-standard / anthropic-sync)
ASYNC = Kind("unit-async", False, 10 * MIN, timedelta(seconds=5), None, None, "x:y")
SYNC = Kind("unit-sync", True, 5 * MIN, None, None, None, "x:y")
KINDS = {"async": ASYNC, "sync": SYNC, None: None}

# the legacy sweep as first specified (tests/integration/_sweep_helpers.py SEED_PHASE_2)
BASE_SETTINGS: dict[str, Any] = {"legacy_sweep": "enforce", "legacy_age": 5 * MIN,
                                 "time_scale": 1.0, "poll_mode": "chain"}


def ago(minutes: float) -> datetime:
    return NOW - timedelta(minutes=minutes)


def job(**columns: Any) -> Job:
    """A transient ``jobs`` row (never added to a session): in flight, created long ago."""
    values: dict[str, Any] = {"id": uuid.uuid4(), "user_id": uuid.uuid4(), "status": "processing",
                              "created_at": ago(60), "job_type": "image"}
    values.update(columns)
    return Job(**values)


def accepted(**columns: Any) -> dict[str, Any]:
    """An accepted async task: a task id, the call started ``started`` minutes ago."""
    values: dict[str, Any] = {"provider_kind": "unit-async", "submission_state": "accepted",
                              "provider_task_id": "t-1", "provider_call_started_at": ago(1),
                              "poll_lease_expires_at": NOW + MIN}
    values.update(columns)
    return values


L, F, R, U, P, RS, E, A, S = (Action.LEAVE, Action.FAIL, Action.REENQUEUE, Action.MARK_UNCERTAIN,
                              Action.POLL, Action.RESUME, Action.EVIDENCE, Action.ANOMALY,
                              Action.SETTLE)

# (id, job columns, kind, settings overrides, legacy cutoff, expected decision)
TABLE: list[tuple[str, dict[str, Any], str | None, dict[str, Any], datetime | None, Decision]] = [
    # --- terminal rows: only a due, unsettled failure/cancel (row 13)
    ("completed", {"status": "completed", "credits_actual": 40}, None, {}, None,
     Decision("none", L)),
    ("failed_due", {"status": "failed", "next_poll_at": ago(1)}, None, {}, None,
     Decision("unsettled", S)),
    ("cancelled_due", {"status": "cancelled", "next_poll_at": ago(1)}, None, {}, None,
     Decision("unsettled", S)),
    ("failed_in_grace", {"status": "failed", "next_poll_at": NOW - SETTLE_GRACE / 2}, None, {},
     None, Decision("none", L)),
    ("failed_at_grace", {"status": "failed", "next_poll_at": NOW - SETTLE_GRACE}, None, {}, None,
     Decision("unsettled", S)),
    ("failed_settled", {"status": "failed", "next_poll_at": ago(1), "credits_actual": 0}, None,
     {}, None, Decision("none", L)),
    ("failed_platform_old", {"status": "failed", "next_poll_at": None}, None, {}, None,
     Decision("none", L)),
    # --- row 1: legacy (no submission state, no kind)
    ("legacy_stale", {"created_at": OLD, "started_at": ago(6)}, None, {}, CUTOFF,
     Decision("legacy", F, observable=True)),
    ("legacy_by_created_at", {"created_at": OLD, "status": "pending"}, None, {}, CUTOFF,
     Decision("legacy", F, observable=True)),
    ("legacy_young", {"created_at": OLD, "started_at": ago(4)}, None, {}, CUTOFF,
     Decision("legacy", L)),
    ("legacy_observe", {"created_at": OLD, "started_at": ago(6)}, None,
     {"legacy_sweep": "observe"}, CUTOFF, Decision("legacy", F, observable=True)),  # the executor only logs it
    ("legacy_off", {"created_at": OLD, "started_at": ago(6)}, None, {"legacy_sweep": "off"},
     CUTOFF, Decision("legacy_off", L)),
    ("legacy_no_cutoff", {"created_at": OLD, "started_at": ago(6)}, None, {}, None,
     Decision("foreign_after_cutoff", L)),
    ("legacy_after_cutoff", {"created_at": CUTOFF + MIN, "started_at": ago(6)}, None, {}, CUTOFF,
     Decision("foreign_after_cutoff", L)),
    ("legacy_excluded_type", {"created_at": OLD, "started_at": ago(6), "job_type": "pipeline"},
     None, {"legacy_exclude_job_types": ["pipeline"]}, CUTOFF, Decision("legacy", L)),
    ("legacy_not_allowed_type", {"created_at": OLD, "started_at": ago(6)}, None,
     {"legacy_job_types": ["video"]}, CUTOFF, Decision("legacy", L)),
    ("legacy_allowed_type", {"created_at": OLD, "started_at": ago(6), "job_type": "video"}, None,
     {"legacy_job_types": ["video"]}, CUTOFF, Decision("legacy", F, observable=True)),
    # --- rows 1-2: a platform row of a kind this process does not know follows the adoption
    # rules (issue 24 finding 2), else one unknown_kind anomaly; never failed merely by age
    ("unknown_kind_candidate", {"provider_kind": "unregistered-video", "created_at": OLD,
                                "started_at": ago(6), "provider_call_started_at": ago(6)},
     None, {}, CUTOFF, Decision("legacy", F, observable=True)),
    ("unknown_kind_observe", {"provider_kind": "unregistered-video", "created_at": OLD,
                              "started_at": ago(6)}, None, {"legacy_sweep": "observe"}, CUTOFF,
     Decision("legacy", F, observable=True)),  # the executor only logs it
    ("unknown_kind_young", {"provider_kind": "unregistered-video", "created_at": OLD,
                            "started_at": ago(4), "provider_call_started_at": ago(4)},
     None, {}, CUTOFF, Decision("unknown_kind", A)),
    ("unknown_kind_default_age", {"provider_kind": "unregistered-video", "created_at": OLD,
                                  "started_at": ago(6), "provider_call_started_at": ago(6)},
     None, {"legacy_sweep": "observe", "legacy_age": None}, CUTOFF,
     Decision("unknown_kind", A)),
    ("unknown_kind_off", {"provider_kind": "unregistered-video", "created_at": OLD,
                          "started_at": ago(6)}, None, {"legacy_sweep": "off"}, CUTOFF,
     Decision("unknown_kind", A)),
    ("unknown_kind_after_cutoff", {"provider_kind": "unregistered-video", "created_at": CUTOFF + MIN,
                                   "provider_call_started_at": ago(6)}, None, {}, CUTOFF,
     Decision("unknown_kind", A)),
    ("unknown_kind_no_cutoff", {"provider_kind": "unregistered-video", "created_at": OLD,
                                "provider_call_started_at": ago(6)}, None, {}, None,
     Decision("unknown_kind", A)),
    ("unknown_kind_excluded_type", {"provider_kind": "unregistered-video", "created_at": OLD,
                                    "started_at": ago(6), "job_type": "pipeline"}, None,
     {"legacy_exclude_job_types": ["pipeline"]}, CUTOFF, Decision("unknown_kind", A)),
    ("unknown_kind_empty_name", {"provider_kind": "", "created_at": ago(6)}, None, {}, CUTOFF,
     Decision("unknown_kind", A)),
    # --- row 3: an unknown kind on a row the library submitted, or on a platform row with a
    # task id (an upstream job only a process knowing the kind can read): one anomaly, any age
    ("unknown_kind_platform_task", {"provider_kind": "unregistered-video", "created_at": OLD,
                                    "started_at": ago(60), "provider_task_id": "t-1"},
     None, {}, CUTOFF, Decision("unknown_kind", A)),
    ("unknown_kind_task", {"provider_kind": "unregistered-video", "submission_state": "accepted",
                           "provider_task_id": "t-1", "created_at": OLD,
                           "provider_call_started_at": ago(60)}, None, {}, CUTOFF,
     Decision("unknown_kind", A)),
    ("unknown_kind_state", {"provider_kind": "unregistered-video", "submission_state": "submitting",
                            "provider_call_started_at": ago(1)}, None, {}, None,
     Decision("unknown_kind", A)),
    ("unknown_kind_not_started", {"provider_kind": "unregistered-video", "created_at": OLD,
                                  "submission_state": "not_started", "status": "pending"},
     None, {}, CUTOFF, Decision("unknown_kind", A)),
    # --- row 4: a platform row (no submission state) with no upstream handle
    ("platform_sync_stale", {"provider_kind": "unit-sync", "provider_call_started_at": ago(6)},
     "sync", {}, None, Decision("platform_untracked", F)),
    ("platform_sync_young", {"provider_kind": "unit-sync", "provider_call_started_at": ago(4)},
     "sync", {}, None, Decision("platform_untracked", L)),
    ("platform_sync_with_task", {"provider_kind": "unit-sync", "provider_task_id": "t-1",
                                 "provider_call_started_at": ago(6)}, "sync", {}, None,
     Decision("platform_untracked", F)),
    ("platform_async_no_task_stale", {"provider_kind": "unit-async",
                                      "provider_call_started_at": ago(11)}, "async", {}, None,
     Decision("platform_untracked", F)),
    ("platform_async_no_task_young", {"provider_kind": "unit-async",
                                      "provider_call_started_at": ago(9)}, "async", {}, None,
     Decision("platform_untracked", L)),
    # --- row 5: a platform row with a task id: as accepted once past the threshold
    ("platform_task_young", {"provider_kind": "unit-async", "provider_task_id": "t-1",
                             "provider_call_started_at": ago(9)}, "async", {}, None,
     Decision("platform_task", L)),
    ("platform_task_stale_no_lease", {"provider_kind": "unit-async", "provider_task_id": "t-1",
                                      "provider_call_started_at": ago(11)}, "async", {}, None,
     Decision("platform_task", P, resume=True)),
    ("platform_task_stale_leased", {"provider_kind": "unit-async", "provider_task_id": "t-1",
                                    "provider_call_started_at": ago(11),
                                    "poll_lease_expires_at": NOW + MIN}, "async", {}, None,
     Decision("platform_task", P)),
    ("platform_task_attempt_not_due", {"provider_kind": "unit-async", "provider_task_id": "t-1",
                                       "provider_call_started_at": ago(11),
                                       "reconcile_last_attempt_at": ago(1),
                                       "poll_lease_expires_at": NOW + MIN}, "async", {}, None,
     Decision("platform_task", L)),
    # --- rows 6 and 7: not started (async: re-enqueue, bounded; sync: fail when stale)
    ("not_started_due", {"provider_kind": "unit-async", "submission_state": "not_started",
                         "status": "pending", "created_at": ago(3)}, "async", {}, None,
     Decision("not_started", R)),
    ("not_started_young", {"provider_kind": "unit-async", "submission_state": "not_started",
                           "status": "pending", "created_at": ago(1)}, "async", {}, None,
     Decision("not_started", L)),
    ("not_started_not_before", {"provider_kind": "unit-async", "submission_state": "not_started",
                                "status": "pending", "created_at": ago(3),
                                "create_not_before": NOW + MIN}, "async", {}, None,
     Decision("not_started", L)),
    ("not_started_not_before_past", {"provider_kind": "unit-async",
                                     "submission_state": "not_started", "status": "pending",
                                     "created_at": ago(3), "create_not_before": ago(1)},
     "async", {}, None, Decision("not_started", R)),
    ("not_started_just_enqueued", {"provider_kind": "unit-async",
                                   "submission_state": "not_started", "status": "pending",
                                   "created_at": ago(30), "create_enqueued_at": ago(1),
                                   "create_enqueue_count": 1}, "async", {}, None,
     Decision("not_started", L)),
    ("not_started_enqueued_long_ago", {"provider_kind": "unit-async",
                                       "submission_state": "not_started", "status": "pending",
                                       "created_at": ago(30), "create_enqueued_at": ago(3),
                                       "create_enqueue_count": 4}, "async", {}, None,
     Decision("not_started", R)),
    ("not_started_exhausted", {"provider_kind": "unit-async", "submission_state": "not_started",
                               "status": "pending", "created_at": ago(30),
                               "create_enqueued_at": ago(3), "create_enqueue_count": 5},
     "async", {}, None, Decision("not_started_exhausted", F, guard=Guard.STILL_NOT_STARTED)),
    ("not_started_sync_stale", {"provider_kind": "unit-sync", "submission_state": "not_started",
                                "status": "pending", "created_at": ago(6)}, "sync", {}, None,
     Decision("not_started_sync", F)),
    ("not_started_sync_young", {"provider_kind": "unit-sync", "submission_state": "not_started",
                                "status": "pending", "created_at": ago(4)}, "sync", {}, None,
     Decision("not_started_sync", L)),
    # --- rows 8 and 9: submitting (a live claim is left; an expired one is uncertain / fails)
    ("submitting_claimed", {"provider_kind": "unit-async", "submission_state": "submitting",
                            "status": "pending", "provider_call_started_at": ago(30),
                            "claim_expires_at": NOW + MIN}, "async", {}, None,
     Decision("submitting", L)),
    ("submitting_expired", {"provider_kind": "unit-async", "submission_state": "submitting",
                            "status": "pending", "provider_call_started_at": ago(1),
                            "claim_expires_at": NOW}, "async", {}, None,
     Decision("submitting_expired", U)),
    ("submitting_no_claim", {"provider_kind": "unit-async", "submission_state": "submitting",
                             "status": "pending", "provider_call_started_at": ago(1)}, "async",
     {}, None, Decision("submitting_expired", U)),
    ("submitting_sync_expired_stale", {"provider_kind": "unit-sync",
                                       "submission_state": "submitting", "status": "pending",
                                       "provider_call_started_at": ago(6),
                                       "claim_expires_at": ago(1)}, "sync", {}, None,
     Decision("submitting_sync_expired", F)),
    ("submitting_sync_expired_young", {"provider_kind": "unit-sync",
                                       "submission_state": "submitting", "status": "pending",
                                       "provider_call_started_at": ago(4),
                                       "claim_expires_at": ago(1)}, "sync", {}, None,
     Decision("submitting_sync_expired", L)),
    # --- rows 10 and 11: accepted (poll once when an attempt is due; resume a dead chain)
    ("accepted_young_leased", accepted(), "async", {}, None, Decision("accepted", L)),
    ("accepted_young_lease_expired", accepted(poll_lease_expires_at=NOW), "async", {}, None,
     Decision("accepted", RS)),
    ("accepted_young_no_lease", accepted(poll_lease_expires_at=None), "async", {}, None,
     Decision("accepted", RS)),
    ("accepted_stale_leased", accepted(provider_call_started_at=ago(10)), "async", {}, None,
     Decision("accepted", P)),
    ("accepted_stale_lease_expired", accepted(provider_call_started_at=ago(11),
                                              poll_lease_expires_at=ago(1)), "async", {}, None,
     Decision("accepted", P, resume=True)),
    ("accepted_stale_attempt_recent", accepted(provider_call_started_at=ago(11),
                                               reconcile_last_attempt_at=ago(4)), "async", {},
     None, Decision("accepted", L)),
    ("accepted_stale_attempt_spaced", accepted(provider_call_started_at=ago(11),
                                               reconcile_last_attempt_at=ago(5)), "async", {},
     None, Decision("accepted", P)),
    ("accepted_stale_attempt_recent_dead_chain",
     accepted(provider_call_started_at=ago(11), reconcile_last_attempt_at=ago(4),
              poll_lease_expires_at=ago(1)), "async", {}, None, Decision("accepted", RS)),
    ("accepted_no_task_id", accepted(provider_task_id=None, poll_lease_expires_at=None),
     "async", {}, None, Decision("accepted", L)),
    ("accepted_batch_due_never_resumed", accepted(poll_due_at=ago(1), poll_lease_expires_at=None),
     "async", {"poll_mode": "batch"}, None, Decision("accepted", L)),
    ("accepted_batch_stale_polled_not_resumed",
     accepted(provider_call_started_at=ago(11), poll_due_at=ago(1), poll_lease_expires_at=None),
     "async", {"poll_mode": "batch"}, None, Decision("accepted", P)),
    ("accepted_batch_unscheduled_resumed", accepted(poll_due_at=None, poll_lease_expires_at=None),
     "async", {"poll_mode": "batch"}, None, Decision("accepted", RS)),
    ("accepted_chain_ignores_due_time", accepted(poll_due_at=ago(1), poll_lease_expires_at=None),
     "async", {}, None, Decision("accepted", RS)),
    ("accepted_time_scale", accepted(provider_call_started_at=ago(2)), "async",
     {"time_scale": 0.1}, None, Decision("accepted", P)),  # 10 min scaled to 1
    ("accepted_sync_stale", {"provider_kind": "unit-sync", "submission_state": "accepted",
                             "provider_call_started_at": ago(6)}, "sync", {}, None,
     Decision("accepted_sync", F)),
    ("accepted_sync_young", {"provider_kind": "unit-sync", "submission_state": "accepted",
                             "provider_call_started_at": ago(4)}, "sync", {}, None,
     Decision("accepted_sync", L)),
    # --- row 12: uncertain (evidence every 5 minutes; never refunded automatically)
    ("uncertain_first_look", {"provider_kind": "unit-async", "submission_state": "uncertain",
                              "status": "pending", "provider_call_started_at": ago(1)}, "async",
     {}, None, Decision("uncertain", E)),
    ("uncertain_attempt_recent", {"provider_kind": "unit-async", "submission_state": "uncertain",
                                  "status": "pending", "provider_call_started_at": ago(60),
                                  "reconcile_last_attempt_at": ago(4)}, "async", {}, None,
     Decision("uncertain", L)),
    ("uncertain_attempt_spaced", {"provider_kind": "unit-async", "submission_state": "uncertain",
                                  "status": "pending", "provider_call_started_at": ago(60),
                                  "reconcile_last_attempt_at": ago(5)}, "async", {}, None,
     Decision("uncertain", E)),
    ("uncertain_sync_stale", {"provider_kind": "unit-sync", "submission_state": "uncertain",
                              "status": "pending", "provider_call_started_at": ago(6)}, "sync",
     {}, None, Decision("uncertain_sync", F)),
    ("uncertain_sync_young", {"provider_kind": "unit-sync", "submission_state": "uncertain",
                              "status": "pending", "provider_call_started_at": ago(4)}, "sync",
     {}, None, Decision("uncertain_sync", L)),
    # --- no row matches: a rejected submission still in flight
    ("rejected_in_flight", {"provider_kind": "unit-async", "submission_state": "rejected",
                            "status": "pending"}, "async", {}, None, Decision("none", L)),
]


@pytest.mark.parametrize(("columns", "kind", "overrides", "cutoff", "expected"),
                         [t[1:] for t in TABLE], ids=[t[0] for t in TABLE])
def test_decide(columns: dict[str, Any], kind: str | None, overrides: dict[str, Any],
                cutoff: datetime | None, expected: Decision) -> None:
    settings = Settings(**{**BASE_SETTINGS, **overrides})
    assert decide(settings, job(**columns), KINDS[kind], NOW, legacy_cutoff=cutoff) == expected


def test_the_table_covers_every_action_and_row() -> None:
    """Every action but LEAVE is decided somewhere above, and every row name appears."""
    decided = {t[-1].action for t in TABLE}
    assert decided == set(Action)
    rows = {t[-1].row for t in TABLE}
    assert rows >= {"legacy", "legacy_off", "foreign_after_cutoff",
                    "unknown_kind", "platform_untracked", "platform_task", "not_started",
                    "not_started_exhausted", "not_started_sync", "submitting",
                    "submitting_expired", "submitting_sync_expired", "accepted",
                    "accepted_sync", "uncertain", "uncertain_sync", "unsettled", "none"}


def test_a_flipped_condition_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The table is not blind: swapping one row's condition (the re-enqueue bound) changes the
    decision a line above pins."""
    import reconcile.sweep.table as table

    settings = Settings(**BASE_SETTINGS)
    row = job(provider_kind="unit-async", submission_state="not_started", status="pending",
              created_at=ago(30), create_enqueued_at=ago(3), create_enqueue_count=4)
    assert decide(settings, row, ASYNC, NOW) == Decision("not_started", R)
    monkeypatch.setattr(table, "MAX_CREATE_REENQUEUES", 4)  # one lower: the 5th now fails
    assert decide(settings, row, ASYNC, NOW) == Decision("not_started_exhausted", F, guard=Guard.STILL_NOT_STARTED)


def test_legacy_cutoff_is_needed_only_for_foreign_rows_in_flight() -> None:
    settings = Settings(**BASE_SETTINGS)
    assert needs_legacy_cutoff(settings, job(), None)
    assert not needs_legacy_cutoff(settings, job(status="failed"), None)
    assert not needs_legacy_cutoff(settings, job(provider_kind="unit-async"), ASYNC)
    # a platform row of a kind this process does not know is decided by the adoption rules
    assert needs_legacy_cutoff(settings, job(provider_kind="unregistered-video"), None)
    assert not needs_legacy_cutoff(settings, job(submission_state="accepted"), None)
    assert not needs_legacy_cutoff(
        settings, job(provider_kind="unregistered-video", submission_state="accepted"), None)
    assert not needs_legacy_cutoff(Settings(**{**BASE_SETTINGS, "legacy_sweep": "off"}), job(),
                                   None)


class _NoDatabase:
    def __call__(self) -> Any:
        raise AssertionError("the decision read the database")

    begin = __call__


def _runtime(**overrides: Any) -> Any:
    """What ``reconcile.sweep.decide`` reads of a runtime: settings, the kind registry, the
    adoption cache; its sessions refuse (so a database read fails the test)."""
    return SimpleNamespace(settings=Settings(**{**BASE_SETTINGS, **overrides}),
                           kind={"unit-async": ASYNC, "unit-sync": SYNC}.get,
                           adoption_cache={}, sessions=_NoDatabase())


def test_the_runtime_wrapper_passes_kind_and_cutoff() -> None:
    rt = _runtime(legacy_cutoff=CUTOFF)
    assert decide_rt(rt, job(created_at=OLD, started_at=ago(6)), NOW) == Decision("legacy", F, observable=True)
    assert decide_rt(rt, job(**accepted(provider_call_started_at=ago(11))), NOW) \
        == Decision("accepted", P)
    assert decide_rt(rt, job(provider_kind="unregistered-video", provider_task_id="t-1"), NOW) \
        == Decision("unknown_kind", A)
    # an unknown kind on an old platform row: the wrapper reads the cutoff for it too
    assert decide_rt(rt, job(provider_kind="unregistered-video", created_at=OLD, started_at=ago(6)),
                     NOW) == Decision("legacy", F, observable=True)


def test_the_runtime_wrapper_reads_no_cutoff_for_other_rows() -> None:
    """No legacy cutoff setting, and a runtime whose database refuses: a non-legacy row is
    decided without reading the adoption time."""
    rt = _runtime()
    assert decide_rt(rt, job(**accepted(provider_call_started_at=ago(11))), NOW) \
        == Decision("accepted", P)
    assert decide_rt(rt, job(status="failed", next_poll_at=ago(1)), NOW) \
        == Decision("unsettled", S)
    with pytest.raises(AssertionError, match="read the database"):  # a legacy row does read it
        decide_rt(rt, job(created_at=OLD, started_at=ago(6)), NOW)


TABLE_MODULE = Path(__file__).resolve().parents[2] / "reconcile" / "sweep" / "table.py"
# the job-event outbox is reconcile.jobstore.events (reconcile.events before the layout move);
# the batch poller is reconcile.lifecycle.batch, under "..lifecycle"
TABLE_FORBIDDEN = ("sqlalchemy", "..runtime", "..lifecycle", "..jobstore.events", ".claims",
                   ".carry", ".tick")


def _impure_imports(source: str) -> tuple[set[str], list[str]]:
    """(every module the source imports, with ``from X import y`` also as ``X.y``; the forbidden
    ones among them)."""
    imported = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            imported.add(base)
            joiner = "" if base.endswith(".") else "."
            imported.update(base + joiner + a.name for a in node.names)
        elif isinstance(node, ast.Import):
            imported.update(a.name for a in node.names)
    return imported, sorted(i for i in imported if i.startswith(TABLE_FORBIDDEN))


def test_the_table_module_is_pure() -> None:
    """reconcile/sweep/table.py imports no SQLAlchemy, runtime, lifecycle, outbox or executor
    module."""
    imported, impure = _impure_imports(TABLE_MODULE.read_text())
    assert impure == []
    assert "..jobstore.predicates" in imported  # the predicate, not the writers


@pytest.mark.parametrize("planted", [
    "from ..jobstore.events import publish",
    "from ..jobstore import events",
    "from ..lifecycle import batch",
    "from ..lifecycle.batch import first_due",
    "from .. import lifecycle",
])
def test_the_purity_check_sees_the_moved_modules(planted: str) -> None:
    """The check follows the layout move: the outbox and the batch poller are found under
    their package paths, whether imported as a module or from their package."""
    _, impure = _impure_imports(TABLE_MODULE.read_text() + "\n" + planted + "\n")
    assert impure, planted


def test_the_executor_reads_the_decision_never_its_row_name() -> None:
    """The guard, the observe-only rule and whether an attempt is counted travel on the
    decision: a renamed row keeps its behaviour, and no executor module compares row names."""
    import reconcile.sweep.carry as carry
    import reconcile.sweep.claims as claims
    import reconcile.sweep.tick as tick

    for module in (claims, carry, tick):
        source = Path(module.__file__).read_text()
        assert ".row ==" not in source and ".row in" not in source, module.__name__
    renamed = Decision("a_new_name", F, guard=Guard.STILL_NOT_STARTED, observable=True)
    assert claims._GUARDS[renamed.guard]  # the guard's SQL, found by the guard itself
    assert Decision("x", Action.POLL).counts_attempt and Decision("x", Action.EVIDENCE).counts_attempt
    assert not any(Decision("x", a).counts_attempt
                   for a in Action if a not in (Action.POLL, Action.EVIDENCE))
