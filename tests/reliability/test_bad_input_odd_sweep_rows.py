"""Odd rows in the sweep (real PostgreSQL, hypothesis): rows with unknown kinds, unknown
states and NULLs in odd places never crash a tick, never get settled twice and never block the
good rows beside them; a row whose handling raises is isolated from the rest.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from hypothesis import given, strategies as st
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from reconcile import Kind, credits, register_kind
from reconcile.db.models import CreditTransaction, Job
from reconcile.kinds import unregister_kind
from reconcile.providers import Created, CreateRequest, ListedTask, PollResult
from reconcile.sweep import sweep
from reconcile.testing.simulator import Script, Simulator
from tests.integration.harness import fund
from tests.reliability._bad_input_helpers import DB_FUZZ, FOREVER, load_job
from tests.reliability.support import runtime, truncate

# --------------------------------------------------------------------------- odd rows in the sweep


BROKEN_NAME = "reliability-broken"


class BrokenClient:
    """A client whose every read blows up with a non-library exception (a bug elsewhere)."""

    name = BROKEN_NAME

    def create(self, request: CreateRequest) -> Created:
        raise RuntimeError("boom")

    def poll(self, task_id: str, *, model: str | None = None) -> PollResult:
        raise RuntimeError("boom")

    def cancel(self, task_id: str, *, model: str | None = None) -> bool:
        raise RuntimeError("boom")

    def find_created(self, job_id: str, created_after: datetime) -> ListedTask | None:
        raise RuntimeError("boom")


BROKEN = BROKEN_NAME
NOW = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
OLD, RECENT, FUTURE = NOW - timedelta(hours=5), NOW - timedelta(seconds=10), NOW + timedelta(hours=1)
# the legacy sweep enforced (fail + refund), every row here created before the cutoff
LEGACY_ENFORCED: dict[str, Any] = {"legacy_sweep": "enforce", "legacy_cutoff": FUTURE}
when = st.sampled_from([None, OLD, RECENT, FUTURE])
odd_rows = st.fixed_dictionaries({
    "status": st.sampled_from(["pending", "processing", "failed", "cancelled", "completed",
                               "PENDING", "weird", ""]),
    "submission_state": st.sampled_from([None, "not_started", "submitting", "accepted",
                                         "rejected", "uncertain", "bogus", ""]),
    "provider_kind": st.sampled_from([None, "", "kie-standard", "replicate-prediction",
                                      "anthropic-sync", "no-such-kind", "KIE-STANDARD", BROKEN]),
    "provider_task_id": st.sampled_from([None, "", "task-x", "../../etc", "x" * 300]),
    "provider_model": st.sampled_from([None, "", "m/x"]),
    "input_data": st.sampled_from([None, {}, "a string", [1, 2], {"prompt": None}]),
    "provider_call_started_at": when, "started_at": when, "claim_expires_at": when,
    "poll_lease_expires_at": when, "next_poll_at": when, "reconcile_last_attempt_at": when,
    "create_not_before": when, "create_enqueued_at": when,
    "created_at": st.sampled_from([OLD, RECENT, FUTURE]),
    "credits_actual": st.sampled_from([None, None, 0, -5]),
    "reconcile_attempts": st.sampled_from([0, 17, 18, 10_000]),
    "create_enqueue_count": st.sampled_from([0, 4, 5, 99]),
    "poll_generation": st.sampled_from([0, 3]),
    "claim_token": st.sampled_from([None, "tok"]),
    "reserve": st.booleans(),
})


def test_odd_rows_never_crash_the_tick_nor_block_good_rows(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """Rows with unknown kinds, unknown states and NULLs in odd places (plus a kind whose client
    raises a non-library exception) reach the sweep beside good rows: the tick returns a report
    every time, never settles anything twice, and still handles the good rows — a stale legacy
    row is failed + refunded and a lost create is re-enqueued."""
    register_kind(Kind(BROKEN, False, timedelta(minutes=10), timedelta(seconds=5),
                       timedelta(hours=1), "test", client="",
                       factory=lambda settings, session: BrokenClient()), replace=True)
    simulator.script_default(Script(timeline=FOREVER))
    user = uuid.uuid4()
    try:
        @DB_FUZZ
        @given(rows=st.lists(odd_rows, min_size=1, max_size=6))
        def run(rows: list[dict[str, Any]]) -> None:
            truncate(db)
            fund(db, user, 1_000_000)
            rt, q = runtime(db, simulator, tmp_path, clock=lambda: NOW, **LEGACY_ENFORCED)
            bad_ids = []
            with db.begin() as s:
                for values in rows:
                    values = dict(values)
                    reserve = values.pop("reserve")
                    job = Job(id=uuid.uuid4(), user_id=user, job_type="image", **values)
                    s.add(job)
                    s.flush()
                    bad_ids.append(job.id)
                    if reserve:
                        credits.reserve(s, user, job.id, 7, now=NOW - timedelta(hours=6))
                legacy = Job(id=uuid.uuid4(), user_id=user, job_type="image", status="processing",
                             created_at=OLD, started_at=OLD)
                lost = Job(id=uuid.uuid4(), user_id=user, job_type="image", status="pending",
                           created_at=OLD, provider_kind="kie-standard", provider_model="m/x",
                           input_data={"prompt": "x"}, submission_state="not_started")
                s.add_all([legacy, lost])
                s.flush()
                credits.reserve(s, user, legacy.id, 11, now=OLD)
                credits.reserve(s, user, lost.id, 13, now=OLD)
            reports = [sweep(rt) for _ in range(2)]  # a second tick must not settle again
            assert reports[0].scanned >= 2 and all(r.elapsed_ms >= 0 for r in reports)
            assert load_job(db, legacy.id).status == "failed"
            assert load_job(db, legacy.id).credits_actual == 0
            assert lost.id in q.creates
            with db() as s:
                problems = credits.audit(s, now=NOW)
                refunds = s.execute(select(CreditTransaction.job_id, func.count())
                                    .where(CreditTransaction.type == "REFUND")
                                    .group_by(CreditTransaction.job_id)).all()
            assert [p for p in problems if p.kind in ("settled_twice", "unbalanced",
                                                      "negative_balance", "balance_mismatch",
                                                      "lot_out_of_range")] == []
            assert all(n == 1 for _, n in refunds), refunds
            q.clear()

        run()
    finally:
        unregister_kind(BROKEN)


def test_a_row_that_raises_is_isolated_from_the_rest(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """A row whose handling raises a non-library exception (its kind's client is broken) is
    counted as an error; the rows around it in the same batch are still handled."""
    register_kind(Kind(BROKEN, False, timedelta(minutes=10), timedelta(seconds=5),
                       timedelta(hours=1), "test", client="",
                       factory=lambda settings, session: BrokenClient()), replace=True)
    try:
        user = uuid.uuid4()
        fund(db, user, 1_000)
        rt, q = runtime(db, simulator, tmp_path, clock=lambda: NOW, **LEGACY_ENFORCED)
        with db.begin() as s:
            rows = []
            for i in range(3):
                broken = Job(id=uuid.uuid4(), user_id=user, job_type="image",
                             status="processing", created_at=OLD, provider_kind=BROKEN,
                             submission_state="accepted", provider_task_id=f"t{i}",
                             provider_call_started_at=OLD, poll_lease_expires_at=OLD)
                legacy = Job(id=uuid.uuid4(), user_id=user, job_type="image",
                             status="processing", created_at=OLD, started_at=OLD)
                rows += [broken, legacy]
            s.add_all(rows)
            s.flush()
            for job in rows:
                credits.reserve(s, user, job.id, 5, now=OLD)
        report = sweep(rt)
        assert report.errors == 3, report
        for job in rows[1::2]:
            assert (load_job(db, job.id).status, load_job(db, job.id).credits_actual) == ("failed", 0)
        for job in rows[0::2]:  # the broken rows stay in flight, untouched money-wise
            assert load_job(db, job.id).status == "processing"
        with db() as s:
            assert credits.audit(s, now=NOW) == []
    finally:
        unregister_kind(BROKEN)
