"""The demo's batch-mode evidence (``reconcile.demo.claims``) and its "settled by" labels: how a
row worker A held claimed at its death came back, who reaped A, which ticks expired unrun."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

from reconcile.demo import how_settled
from reconcile.demo.claims import discarded_ticks, reaped_by, release

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_a_claim_is_released_when_its_claimer_was_reaped_before_its_lease_ended() -> None:
    claim = ("host:1:a", T0 + timedelta(seconds=12))
    assert release(claim, {"host:1:a": T0 + timedelta(seconds=5)}) == "released"
    assert release(claim, {"host:1:a": T0 + timedelta(seconds=13)}) == "due-again"
    # the other process of the same worker reaped early says nothing about this claim
    assert release(claim, {"host:2:b": T0 + timedelta(seconds=1)}) == "due-again"
    assert release(claim, {}) == "due-again"


def test_reaped_by_reads_worker_b_log(tmp_path: Path) -> None:
    log = tmp_path / "worker-B.log"
    log.write_text("[..: WARNING/ForkPoolWorker-1] worker_lapsed workers=host:1:a,host:9:z "
                   "claims_ended=0\n"
                   "[..: INFO/MainProcess] Discarding revoked task: reconcile.poll_due[1-2]\n"
                   "[..: INFO/MainProcess] Discarding revoked task: reconcile.poll_due[3-4]\n")
    assert reaped_by(log, {"host:1:a", "host:2:b"}) == {
        "host:1:a": "worker B's heartbeat", "host:2:b": "the sweep tick"}
    assert discarded_ticks(log) == 2
    assert discarded_ticks(tmp_path / "missing.log") == 0


def test_settled_by_in_batch_mode_ignores_the_generation() -> None:
    job = SimpleNamespace(id=uuid.uuid4(), status="completed", submission_state="accepted",
                          error_detail=None, poll_generation=2)
    assert how_settled(job, "poll") == "sweep-resumed"  # chain mode: a new generation
    assert how_settled(job, "poll", {}) == "worker"
    assert how_settled(job, "poll", {job.id: "released"}) == "released"
    assert how_settled(job, "webhook", {job.id: "due-again"}) == "webhook"
