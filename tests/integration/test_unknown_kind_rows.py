"""Rows of a provider kind the sweeping process does not know, and platform rows of observe-only
kinds (issue 24: finding 2 and a suspected webhook hole; README, Design notes: Legacy rows).

A row the library did not submit (no ``submission_state``) follows the adoption rules whatever its
kind — by default one ``unknown_kind`` anomaly and nothing else; under ``enforce`` the legacy
rules (cutoff, ``LEGACY_AGE``, job types) exactly as for a row without a kind. A row the library
did submit gets one anomaly and waits: never a guess. Every process registers the same kinds,
which the start-up check enforces.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from reconcile import Kind, Runtime, Settings, lifecycle, register_kind
from reconcile.jobstore.adoption import SettingsError
from reconcile.kinds import unregister_kind
from reconcile.providers import CreateRequest
from reconcile.storage import LocalStorage
from reconcile.testing import sim_signing
from reconcile.testing.simulator import Script, Simulator
from reconcile.webhook_ingest import handle_webhook
from tests.integration._sweep_helpers import World, assert_refunded, snapshot
from tests.integration.test_sweep_adoption import before_adoption, defaults

UNKNOWN = "acme-video"  # registered by no process here
ANOMALY = "unknown_provider_kind"  # the anomaly the sweep's unknown_kind row records


def _untouched(w: World, job_id: uuid.UUID) -> None:
    job = w.job(job_id)
    assert (job.status, job.error_code, job.credits_actual) == ("processing", None, None)
    assert w.log_status(job_id) == "reserved" and w.refunds(job_id) == 0


def _ticks(w: World, *advances: timedelta) -> list[Any]:
    reports = []
    for delta in advances:
        w.clock.now += delta
        reports.append(w.tick())
    return reports


MIN = timedelta(minutes=1)


# ----------------------------------------------------------------------------- platform rows


def test_an_unknown_kind_platform_row_is_only_reported_under_the_defaults(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """The defaults (observe, the adoption time as cutoff, 165 min): a platform row of an
    unregistered kind, its call marked, created after adoption, is never failed — it used to be
    failed + refunded 5 minutes after its start (then the platform's worker delivered it)."""
    w = defaults(db, simulator, tmp_path)
    row = w.platform_row(provider_kind=UNKNOWN, provider_call_started_at=w.clock.now,
                         started_at=w.clock.now)
    reports = _ticks(w, 6 * MIN, 3 * 60 * MIN, 30 * 60 * MIN)
    _untouched(w, row)
    assert w.anomalies(row) == [ANOMALY]  # once, however many ticks
    assert [(a.row, a.outcome) for a in reports[0].actions] == [("unknown_kind", "anomaly")]


def test_an_old_unknown_kind_platform_row_is_observed_like_a_legacy_row(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """Observe (the default): a stale pre-adoption platform row of an unknown kind is counted as
    would-fail exactly as a row without a kind; nothing is written."""
    w = defaults(db, simulator, tmp_path)
    row = before_adoption(w, hours=4, provider_kind=UNKNOWN)
    assert w.job(row).provider_kind == UNKNOWN
    before = snapshot(db)
    report = w.tick()
    assert snapshot(db) == before
    assert (report.observed, report.observed_would_fail) == (1, 1)


def test_legacy_sweep_off_leaves_an_unknown_kind_platform_row(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """LEGACY_SWEEP=off: not failed, whatever its age and cutoff (one anomaly only)."""
    w = World(db, simulator, tmp_path, legacy_sweep="off")  # cutoff 2999, age 5 min
    row = w.platform_row(provider_kind=UNKNOWN, provider_call_started_at=w.clock.now)
    _ticks(w, 6 * MIN, 3 * 60 * MIN)
    _untouched(w, row)
    assert w.anomalies(row) == [ANOMALY]


@pytest.mark.parametrize("case", ["too_young", "excluded_job_type", "not_allowed_job_type",
                                  "after_cutoff"])
def test_enforce_applies_the_legacy_bounds_to_an_unknown_kind_platform_row(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path, case: str) -> None:
    """LEGACY_SWEEP=enforce: an unknown-kind platform row that the legacy rules would not fail —
    younger than LEGACY_AGE (default 165 min), an excluded or not allowed job type, created
    after the cutoff — is left (one anomaly), as a row without a kind is."""
    settings: dict[str, Any] = {"legacy_sweep": "enforce"}
    columns: dict[str, Any] = {}
    advance = [6 * MIN, 3 * 60 * MIN]
    if case == "too_young":
        settings["legacy_age"] = None  # the default: 165 minutes
        advance = [6 * MIN, 150 * MIN]
    elif case == "excluded_job_type":
        settings["legacy_exclude_job_types"] = ["pipeline"]
        columns["job_type"] = "pipeline"
    elif case == "not_allowed_job_type":
        settings["legacy_job_types"] = ["video"]
    else:
        settings["legacy_cutoff"] = datetime.now(UTC) - timedelta(hours=1)
    w = World(db, simulator, tmp_path, **settings)
    row = w.platform_row(provider_kind=UNKNOWN, provider_call_started_at=w.clock.now,
                         started_at=w.clock.now, **columns)
    _ticks(w, *advance)
    _untouched(w, row)
    assert w.anomalies(row) == [ANOMALY]


def test_enforce_fails_a_stale_unknown_kind_platform_row_as_legacy(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """Within every legacy bound (before the cutoff, past LEGACY_AGE, an allowed job type) an
    enforced sweep fails + refunds it once, as a legacy row — only past LEGACY_AGE."""
    w = World(db, simulator, tmp_path, legacy_age=timedelta(minutes=30))
    row = w.platform_row(provider_kind=UNKNOWN, provider_call_started_at=w.clock.now,
                         started_at=w.clock.now)
    report = _ticks(w, 29 * MIN)[0]
    _untouched(w, row)
    assert [(a.row, a.action) for a in report.actions] == [("unknown_kind", "anomaly")]
    report = _ticks(w, 2 * MIN)[0]
    assert [(a.row, a.action) for a in report.actions] == [("legacy", "fail")]
    assert_refunded(w, row)


# ----------------------------------------------------------------------------- the library's rows


@pytest.mark.parametrize("state", ["not_started", "submitting", "accepted", "uncertain"])
def test_a_library_row_of_a_kind_this_process_lacks_gets_one_anomaly_and_waits(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path, state: str) -> None:
    """The library submitted the row (another process registered the kind): whatever its state
    and age, and even with the legacy sweep enforced, one anomaly and nothing settled."""
    kind = Kind("acme-lost", False, timedelta(minutes=10), timedelta(seconds=5),
                timedelta(hours=1), "acme", client="")
    register_kind(kind)
    try:
        w = World(db, simulator, tmp_path)  # enforce, cutoff 2999, age 5 min
        job_id = lifecycle.submit_job(w.rt, w.user, kind.name, "m/x", {"prompt": "cat"}, 40,
                                      job_type="video", enqueue=False).job_id
    finally:
        unregister_kind(kind.name)
    if state != "not_started":
        w.set(job_id, submission_state=state, status="processing",
              provider_call_started_at=w.clock.now,
              provider_task_id="t-1" if state == "accepted" else None)
    reports = _ticks(w, 6 * MIN, 5 * 60 * MIN, 30 * 60 * MIN)
    job = w.job(job_id)
    assert job.error_code is None and job.credits_actual is None
    assert job.status in ("pending", "processing") and job.submission_state == state
    assert w.log_status(job_id) == "reserved" and w.refunds(job_id) == 0
    assert w.anomalies(job_id) == [ANOMALY]
    assert [(a.row, a.outcome) for a in reports[0].actions] == [("unknown_kind", "anomaly")]
    assert [a for r in reports[1:] for a in r.actions] == []  # later ticks: no action at all


# ----------------------------------------------------------------------------- start-up


def _runtime(db: sessionmaker[Session], tmp_path: Path, **kw: Any) -> Runtime:
    settings = kw.pop("settings", {})
    return Runtime(settings=Settings(**settings), sessions=db, storage=LocalStorage(tmp_path),
                   **kw)


def test_a_runtime_refuses_a_required_kind_it_has_not_registered(
        db: sessionmaker[Session], tmp_path: Path) -> None:
    """REQUIRED_KINDS names every kind the deployment's rows carry; a process (worker, gateway,
    the reconcile command: every Runtime) that has not registered one refuses to start. So does a
    completion hook keyed by a kind that is not registered (it would never run)."""
    with pytest.raises(SettingsError, match=UNKNOWN):
        _runtime(db, tmp_path, settings={"required_kinds": ["kie-standard", UNKNOWN]})
    with pytest.raises(SettingsError, match="completion_hooks.*kie-standrad"):
        _runtime(db, tmp_path, completion_hooks={"kie-standrad": lambda s, j, r: None})
    _runtime(db, tmp_path, settings={"required_kinds": ["kie-standard", "anthropic-sync"]},
             completion_hooks={"kie-standard": lambda s, j, r: None})


@pytest.mark.parametrize(("env", "value"), [
    ("RECONCILE_REQUIRED_KINDS", json.dumps(["kie-standard", UNKNOWN])),
    ("RECONCILE_OBSERVE_ONLY_KINDS", json.dumps(["legacy", "kie-standrad"])),
])
def test_worker_init_and_beat_init_stop_the_process_on_an_unregistered_kind(
        monkeypatch: pytest.MonkeyPatch, env: str, value: str) -> None:
    """Through Celery's own signal dispatch: Celery logs and swallows an Exception raised by a
    receiver, so the start-up check must stop the process with SystemExit (it used to raise a
    SettingsError that the worker merely logged)."""
    from celery.signals import beat_init, worker_init

    from reconcile.celery_install import check_settings

    for signal in (worker_init, beat_init):
        signal.connect(check_settings, weak=False, dispatch_uid=f"test.{signal.name}")
    try:
        monkeypatch.setenv(env, value)
        for signal in (worker_init, beat_init):
            with pytest.raises(SystemExit, match="refusing to start"):
                signal.send(sender=None)
        monkeypatch.setenv(env, json.dumps(["kie-standard"]))
        for signal in (worker_init, beat_init):
            signal.send(sender=None)
    finally:
        for signal in (worker_init, beat_init):
            signal.disconnect(check_settings, dispatch_uid=f"test.{signal.name}")


# ----------------------------------------------------------------------------- webhooks


def _platform_prediction(w: World, timeline: Any) -> uuid.UUID:
    """A platform row of replicate-prediction (no submission_state) whose prediction the
    platform's own code created upstream, with the library's callback planted."""
    job_id = w.platform_row(provider_kind="replicate-prediction",
                            provider_call_started_at=w.clock.now)
    w.sim.script(str(job_id), Script(timeline=timeline))
    client = w.rt.client(w.rt.kind("replicate-prediction"))  # type: ignore[arg-type]
    task = client.create(CreateRequest(  # type: ignore[union-attr]
        model="acme/upscaler:v1", input={"prompt": "cat"}, job_id=str(job_id),
        webhook_url=w.rt.webhook_url("replicate", job_id)))
    w.set(job_id, provider_task_id=task.task_id)
    return job_id


def _deliver(w: World, job_id: uuid.UUID, status: str) -> tuple[int, dict[str, Any]]:
    task_id = w.job(job_id).provider_task_id
    body = json.dumps({"id": task_id, "status": status, "error": "boom" if status == "failed"
                       else None, "urls": {
                           "get": f"https://api.replicate.com/v1/predictions/{task_id}"},
                       "webhook": w.rt.webhook_url("replicate", job_id)}).encode()
    headers = sim_signing.replicate_headers(w.sim.secrets.replicate_webhook_secret, body,
                                            f"msg_{uuid.uuid4().hex}", int(w.clock.now.timestamp()))
    return handle_webhook(w.rt, "replicate", headers, body, {"job_id": str(job_id)})


FAILED = ((0.0, "queued"), (0.0, "failed"))
SUCCEEDED = ((0.0, "queued"), (0.0, "succeeded"))


@pytest.mark.parametrize(("timeline", "status"), [(FAILED, "failed"), (SUCCEEDED, "succeeded")])
def test_a_webhook_never_changes_a_platform_row_of_an_observe_only_kind(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        timeline: Any, status: str) -> None:
    """OBSERVE_ONLY_KINDS=[replicate-prediction]: a signed delivery naming the platform's own row
    is stored and nothing else — no fail + refund on a failure, no poll chain to finish it on a
    success (the platform's own worker runs it). Suspected by the issue 24 audit: the delivery
    failed and refunded the row, or started a chain that completed it."""
    w = defaults(db, simulator, tmp_path, observe_only_kinds=["replicate-prediction"])
    job_id = _platform_prediction(w, timeline)
    w.clock.now += timedelta(seconds=5)
    before = snapshot(db)
    assert _deliver(w, job_id, status) == (202, {"status": "stored"})
    after = snapshot(db)
    assert after["jobs"] == before["jobs"] and after["txns"] == before["txns"]
    assert not w.q.polls and not w.q.creates  # no chain started for it
    _untouched(w, job_id)


def test_a_webhook_still_acts_on_a_platform_row_of_a_swept_kind(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """The guard is the observe-only name: without it the same delivery fails + refunds the
    platform row once a read confirms the failure (what the platform plumbed is swept)."""
    w = defaults(db, simulator, tmp_path)
    job_id = _platform_prediction(w, FAILED)
    w.clock.now += timedelta(seconds=5)
    status, answer = _deliver(w, job_id, "failed")
    assert status == 200 and answer["job_status"] == "failed"
    assert w.job(job_id).error_code is not None and w.log_status(job_id) == "refunded"
