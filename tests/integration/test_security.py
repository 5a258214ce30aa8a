"""Issue 12 (security) end to end: forged webhook evidence, unbounded outputs and bodies,
what customers and operators see, bad gateway input (real PostgreSQL, the simulator on loopback).
"""

from __future__ import annotations

import json
import logging
import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from reconcile import Kind, api, lifecycle, register_kind, webhooks
from reconcile.db.models import CreditAnomaly, Job, WebhookDelivery
from reconcile.errors import MediaFetchFailed
from reconcile.kinds import unregister_kind
from reconcile.media import fetch as media
from reconcile.providers import Created, CreateRequest, ListedTask, Output, PollResult, PollStatus
from reconcile.testing import sim_signing
from reconcile.testing.simulator import Script, Simulator
from reconcile.webhook_ingest import handle_webhook
from tests.integration._sweep_helpers import FOREVER, INSTANT, World
from tests.integration.harness import drain
from tests.unit.test_media_ssrf import RawServer

ATTACKER = "attacker-fal-account"


def _uncertain_without_upstream_task(w: World, kind: str = "replicate-prediction") -> uuid.UUID:
    """An uncertain create that created nothing upstream (a 5xx): only evidence could adopt."""
    job_id = w.submit(kind)
    w.sim.script(str(job_id), Script(timeline=FOREVER, create="server_error"))
    assert lifecycle.create_step(w.rt, job_id).action == "uncertain"
    assert w.sim.tasks_for(str(job_id)) == []
    return job_id


def _fal_delivery(sim: Simulator, request_id: str, user_id: str) -> tuple[dict[str, str], bytes]:
    body = json.dumps({"request_id": request_id, "status": "OK",
                       "payload": {"images": [{"url": "https://evil.example/x.png"}]}}).encode()
    return sim_signing.fal_headers(sim.fal_key, request_id, user_id, body,
                                   sim_signing.now_seconds()), body


def _record_polls(w: World, kind: str, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    client = w.rt.client(w.rt.kind(kind))  # type: ignore[arg-type]
    seen: list[str] = []
    real = client.poll

    def poll(task_id: str, **kw: Any) -> Any:
        seen.append(task_id)
        return real(task_id, **kw)

    monkeypatch.setattr(client, "poll", poll)
    return seen


# ----------------------------------------------------------------------------- forged evidence


@pytest.mark.parametrize("configured", [True, False], ids=["fal-user-id-set", "fal-user-id-unset"])
def test_forged_fal_evidence_leaves_the_uncertain_job_reserved_and_unchanged(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, configured: bool) -> None:
    """The reproduction of issue 12's forged evidence: a delivery validly signed by fal's one JWKS, but for
    another fal account, plants ``?job_id=<victim>`` for an uncertain Replicate job. With our
    fal user id configured it is refused (401); without, it is stored but is no evidence for a
    Replicate job. Either way the sweep never adopts it, never reads it from Replicate, and the
    job ends as it was: uncertain, reserved, not refunded."""
    w = World(db, simulator, tmp_path,
              fal_webhook_user_id=simulator.secrets.fal_user_id if configured else None)
    victim = _uncertain_without_upstream_task(w)
    polls = _record_polls(w, "replicate-prediction", monkeypatch)
    headers, body = _fal_delivery(simulator, "attacker-request", ATTACKER)
    status, answer = handle_webhook(w.rt, "fal", headers, body, {"job_id": str(victim)})
    assert status == (401 if configured else 202), answer
    for _ in range(4):
        w.clock.advance(minutes=5)
        report = w.tick()
        assert "adopted" not in [a.outcome for a in report.actions]
    job = w.job(victim)
    assert (job.status, job.submission_state, job.provider_task_id) == ("pending", "uncertain", None)
    assert job.error_code == "UPSTREAM_SUBMISSION_UNCERTAIN" and job.credits_actual is None
    assert w.log_status(victim) == "reserved" and w.refunds(victim) == 0
    assert "attacker-request" not in polls


def test_fal_delivery_signed_for_another_account_is_refused(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """With RECONCILE_FAL_WEBHOOK_USER_ID set, only our account's deliveries are accepted."""
    w = World(db, simulator, tmp_path, fal_webhook_user_id=simulator.secrets.fal_user_id)
    headers, body = _fal_delivery(simulator, "r-1", ATTACKER)
    assert handle_webhook(w.rt, "fal", headers, body, {})[0] == 401
    headers, body = _fal_delivery(simulator, "r-2", simulator.secrets.fal_user_id)
    assert handle_webhook(w.rt, "fal", headers, body, {})[0] == 202
    with db() as s:
        assert s.execute(select(WebhookDelivery.delivery_id)).scalars().all() == ["r-2"]


def test_fal_delivery_naming_a_replicate_task_never_reads_replicate(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Provider checked at ingestion: a fal delivery (our own account) whose request id is a running
    Replicate job's prediction id is stored, and makes no Replicate read."""
    w = World(db, simulator, tmp_path)
    job_id = w.accept("replicate-prediction", Script(timeline=FOREVER))
    polls = _record_polls(w, "replicate-prediction", monkeypatch)
    headers, body = _fal_delivery(simulator, w.task_id(job_id), simulator.secrets.fal_user_id)
    assert handle_webhook(w.rt, "fal", headers, body, {"job_id": str(job_id)}) \
        == (202, {"status": "stored"})
    assert polls == [] and w.job(job_id).status == "processing"


def _replicate_delivery(w: World, task_id: str, webhook_job: uuid.UUID) -> tuple[dict, bytes]:
    body = json.dumps({"id": task_id, "status": "processing", "urls": {
        "get": f"https://api.replicate.com/v1/predictions/{task_id}"},
        "webhook": f"https://platform.example/hooks/webhooks/replicate?job_id={webhook_job}",
    }).encode()
    headers = sim_signing.replicate_headers(w.sim.secrets.replicate_webhook_secret, body,
                                            f"msg_{uuid.uuid4().hex}", int(w.clock.now.timestamp()))
    return headers, body


def test_replicate_evidence_binds_through_the_signed_webhook_field(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A genuinely signed Replicate delivery whose signed ``webhook`` names another job is not
    evidence for the job in the (unsigned) query; one naming this job is adopted once the
    prediction read echoes it."""
    w = World(db, simulator, tmp_path)
    victim = _uncertain_without_upstream_task(w)
    other = w.accept("replicate-prediction", Script(timeline=FOREVER))
    headers, body = _replicate_delivery(w, w.task_id(other), other)
    assert handle_webhook(w.rt, "replicate", headers, body, {"job_id": str(victim)})[0] == 202
    w.clock.advance(minutes=5)
    w.tick()
    assert w.job(victim).provider_task_id is None

    mine = _uncertain_without_upstream_task(w)
    # the prediction the "lost" create made upstream, made here directly
    simulator.script(str(mine), Script(timeline=FOREVER))
    client = w.rt.client(w.rt.kind("replicate-prediction"))  # type: ignore[arg-type]
    task = client.create(CreateRequest(model="acme/upscaler:v1", input={"prompt": "cat"},  # type: ignore[union-attr]
                                       job_id=str(mine),
                                       webhook_url=w.rt.webhook_url("replicate", mine)))
    assert task.task_id
    monkeypatch.setattr(client, "find_created", lambda *a, **k: None)  # evidence only
    headers, body = _replicate_delivery(w, task.task_id, mine)
    assert handle_webhook(w.rt, "replicate", headers, body, {"job_id": str(mine)})[0] == 202
    w.clock.advance(minutes=5)
    w.tick()
    job = w.job(mine)
    assert (job.submission_state, job.provider_task_id) == ("accepted", task.task_id)
    assert job.error_detail == {"adopted_from": "webhook"}


# ----------------------------------------------------------------------------- bounds


def test_outputs_over_the_cap_fail_and_refund_without_any_download(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """More outputs than MAX_OUTPUTS_PER_JOB: failed UPSTREAM_OUTPUT_LIMIT and refunded, and
    not one output fetched."""
    w = World(db, simulator, tmp_path, max_outputs_per_job=3)
    monkeypatch.setattr(media, "safe_fetch", lambda *a, **k: pytest.fail("fetched an output"))
    job_id = w.accept("kie-standard", Script(timeline=INSTANT, outputs=4))
    lifecycle.resume_chain(w.rt, job_id)
    drain(w.rt, w.q)
    job = w.job(job_id)
    assert (job.status, job.error_code, job.credits_actual) == ("failed", "UPSTREAM_OUTPUT_LIMIT", 0)
    assert w.refunds(job_id) == 1


def test_outputs_already_stored_are_not_downloaded_again(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A poll that stored two of three outputs before the third failed: the next poll fetches
    only the third."""
    w = World(db, simulator, tmp_path)
    job_id = w.accept("kie-standard", Script(timeline=INSTANT, outputs=3))
    real = media.safe_fetch
    fetched: list[str] = []

    def third_fails_once(url: str, **kw: Any) -> Any:
        fetched.append(url)
        if len(fetched) == 3:
            raise MediaFetchFailed("reset by peer")
        return real(url, **kw)

    monkeypatch.setattr(media, "safe_fetch", third_fails_once)
    lifecycle.resume_chain(w.rt, job_id)
    job_id_, generation, seq = w.q.polls.popleft()
    assert lifecycle.poll_step(w.rt, job_id_, generation, seq) == "in_flight"
    first = list(fetched)
    assert len(first) == 3
    fetched.clear()
    drain(w.rt, w.q)
    job = w.job(job_id)
    assert job.status == "completed" and len(job.output_data["outputs"]) == 3
    assert fetched == [first[2]]


def test_webhook_success_does_no_media_work_in_the_request_thread(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A signed delivery for a finished task is stored and handed to a worker: the request
    thread fetches no output; the worker's poll then completes the job."""
    w = World(db, simulator, tmp_path)
    job_id = w.accept("kie-standard", Script(timeline=FOREVER, outputs=5))
    task_id = w.task_id(job_id)
    simulator.set_state(task_id, "succeeded")
    body = json.dumps({"code": 200, "msg": "ok", "data": {"taskId": task_id, "state": "success"}})
    headers = sim_signing.kie_headers(simulator.secrets.kie_webhook_hmac_key, task_id,
                                      sim_signing.now_seconds())
    real = media.safe_fetch
    monkeypatch.setattr(media, "safe_fetch", lambda *a, **k: pytest.fail("media in the request"))
    assert handle_webhook(w.rt, "kie", headers, body.encode(), {"job_id": str(job_id)}) \
        == (202, {"status": "enqueued"})
    assert w.job(job_id).status == "processing"
    monkeypatch.setattr(media, "safe_fetch", real)
    drain(w.rt, w.q)
    assert w.job(job_id).status == "completed"


@pytest.mark.parametrize("provider", webhooks.PROVIDERS)  # every shipped scheme
def test_webhook_body_over_the_cap_is_refused_before_parsing(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, provider: str) -> None:
    """A body over WEBHOOK_MAX_BODY_BYTES answers 413 without being parsed (KIE's unsigned
    body included) and stores nothing."""
    w = World(db, simulator, tmp_path, webhook_max_body_bytes=10_000)
    body = json.dumps({"data": {"taskId": "t", "pad": "x" * 20_000}}).encode()
    monkeypatch.setattr(json, "loads", lambda *a, **k: pytest.fail("parsed an oversize body"))
    status, _ = handle_webhook(w.rt, provider, {}, body, {})
    monkeypatch.undo()
    assert status == 413
    with db() as s:
        assert s.execute(select(func.count()).select_from(WebhookDelivery)).scalar_one() == 0


# ----------------------------------------------------------------------------- what users see

PRESIGNED = ("https://bucket.s3.amazonaws.com/out.png?X-Amz-Algorithm=AWS4-HMAC-SHA256"
             "&X-Amz-Credential=AKIAEXAMPLE%2F20261201&X-Amz-Signature=deadbeefcafe&x=1")


def test_customer_sees_the_code_and_library_message_operator_sees_redacted_detail(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """Media refused at exhaustion: the operator's last error keeps the host and address (the
    signature redacted); the customer reads neither."""
    w = World(db, simulator, tmp_path)
    job_id = w.accept("kie-standard", Script(timeline=FOREVER))
    internal = ("media refused: media host 'db-primary.internal' resolves to non-public address "
                f"10.20.30.40 fetching {PRESIGNED}")
    assert lifecycle.fail_job(w.rt, job_id, "UPSTREAM_FAILED", internal,
                              {"last_error": internal}, anomaly="reconcile_exhausted")
    status, body = api.snapshot(w.rt, w.user, job_id)
    assert status == 200
    message = body["error"]["message"]
    for leak in ("db-primary", "10.20.30.40", "X-Amz", "deadbeef", "bucket.s3"):
        assert leak not in message, message
    assert body["error"]["code"] == "UPSTREAM_FAILED"
    job = w.job(job_id)
    assert "db-primary.internal" in job.error_message  # operators keep the detail …
    stored = json.dumps([job.error_message, job.error_detail]) + json.dumps(
        [a.detail for a in _anomalies(db, job_id)])
    assert "deadbeefcafe" not in stored and "AKIAEXAMPLE" not in stored  # … minus the signature
    assert "X-Amz-Signature=REDACTED" in stored


def _anomalies(db: sessionmaker[Session], job_id: uuid.UUID) -> list[CreditAnomaly]:
    with db() as s:
        return list(s.execute(select(CreditAnomaly).where(CreditAnomaly.job_id == job_id))
                    .scalars())


def test_provider_message_reaches_the_customer_without_urls_hosts_or_addresses(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """UPSTREAM_FAILED / UPSTREAM_INVALID_INPUT carry the provider's own words, scrubbed;
    upstreamRequestId is unchanged."""
    w = World(db, simulator, tmp_path)
    job_id = w.accept("kie-standard", Script(timeline=FOREVER))
    provider = f"NSFW content detected in {PRESIGNED} (from 10.1.2.3, edge cdn-7.internal:8443)"
    assert lifecycle.fail_job(w.rt, job_id, "UPSTREAM_FAILED", provider,
                              {"provider_message": provider, "upstreamRequestId": "req-123"})
    _, body = api.snapshot(w.rt, w.user, job_id)
    message = body["error"]["message"]
    assert "NSFW content detected" in message
    for leak in ("amazonaws", "10.1.2.3", "cdn-7", "8443", "X-Amz"):
        assert leak not in message, message
    assert body["error"]["upstreamRequestId"] == "req-123"


def test_uncertain_create_shows_the_library_message_not_the_exception(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """An uncertain create's snapshot says the library's words, not the transport error with
    the provider's host and port."""
    w = World(db, simulator, tmp_path)
    job_id = _uncertain_without_upstream_task(w, "kie-standard")
    w.set(job_id, error_detail={"message": "KIE create: ConnectionError: HTTPConnectionPool("
                                           "host='10.9.8.7', port=8443): RemoteDisconnected"})
    _, body = api.snapshot(w.rt, w.user, job_id)
    assert body["error"]["message"] == api.SUBMISSION_UNCERTAIN_MESSAGE


def test_signed_query_strings_are_redacted_from_third_party_debug_logs(
        caplog: pytest.LogCaptureFixture) -> None:
    """urllib3's own DEBUG line for a presigned GET never carries the signature."""
    with caplog.at_level(logging.DEBUG, logger="urllib3.connectionpool"):
        logging.getLogger("urllib3.connectionpool").debug(
            '%s://%s:%s "%s %s %s" %s %s', "https", "bucket.s3.amazonaws.com", 443, "GET",
            PRESIGNED.split(".com", 1)[1], "HTTP/1.1", 200, 3)
    text = caplog.text
    assert "deadbeefcafe" not in text and "AKIAEXAMPLE" not in text
    assert "X-Amz-Signature=REDACTED" in text


# ----------------------------------------------------------------------------- gateway input


@pytest.mark.parametrize(("field", "value"), [
    ("input", {"prompt": "a\x00cat"}),
    ("input", {"prompt": "\ud800"}),
    ("input", {"a\x00": "x"}),
    ("model", "seedream\x00"),
    ("model", "seedream\udc80"),
    ("job_type", "image\x00"),
    ("job_type", "\ud83d"),
    ("input", {"prompt": "x" * (2 * 1024 * 1024)}),
    ("job_type", "i" * (1024 * 1024)),
])
def test_bad_text_and_sizes_are_400_and_change_nothing(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path, field: str,
        value: Any) -> None:
    """NUL, lone surrogates and oversize input / job_type: 400 INVALID_PARAM, no job, no
    reservation (not the 500 of a refused INSERT)."""
    w = World(db, simulator, tmp_path)
    args: dict[str, Any] = {"model": "seedream/4.5-edit", "input": {"prompt": "cat"},
                            "job_type": "image"}
    args[field] = value
    with db() as s:
        before = s.execute(select(func.count()).select_from(Job)).scalar_one()
    status, body = api.submit(w.rt, w.user, "kie-standard", args["model"], args["input"], 40,
                              job_type=args["job_type"])
    assert status == 400 and body["error"]["code"] == "INVALID_PARAM", body
    assert body["error"]["param"] == field
    with db() as s:
        assert s.execute(select(func.count()).select_from(Job)).scalar_one() == before


def test_credit_history_of_a_non_uuid_user_is_400(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    w = World(db, simulator, tmp_path)
    status, body = api.credit_history(w.rt, "not-a-uuid")  # type: ignore[arg-type]
    assert status == 400 and body["error"]["code"] == "INVALID_PARAM", body


def test_signed_webhook_nested_600_deep_is_a_400_not_a_recursion_error(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """The NUL-scrubbing pass never recurses over an arbitrarily deep signed body."""
    w = World(db, simulator, tmp_path)
    deep: Any = "x"
    for _ in range(600):
        deep = {"a": deep}
    body = json.dumps({"id": "p-deep", "status": "processing", "output": deep}).encode()
    headers = sim_signing.replicate_headers(simulator.secrets.replicate_webhook_secret, body,
                                            "msg_deep", sim_signing.now_seconds())
    status, answer = handle_webhook(w.rt, "replicate", headers, body, {})
    assert status == 400, answer


# ----------------------------------------------------------------------------- per-URL auth


class KeyedClient:
    """A client whose outputs live on another host than its API, like an ElevenLabs dubbing."""

    name = "security-keyed"
    api = "https://api.keyed.example"

    def __init__(self, url: str) -> None:
        self.url = url

    def create(self, request: CreateRequest) -> Created:
        return Created(f"keyed-{request.job_id}")

    def poll(self, task_id: str, *, model: str | None = None) -> PollResult:
        return PollResult(status=PollStatus.SUCCEEDED, raw_status="succeeded",
                          outputs=(Output(url=self.url),))

    def cancel(self, task_id: str, *, model: str | None = None) -> bool:
        return False

    def find_created(self, job_id: str, created_after: datetime) -> ListedTask | None:
        return None

    def media_headers(self, url: str | None = None) -> dict[str, str]:
        if url is not None and not url.startswith(self.api + "/"):
            return {}
        return {"X-Api-Key": "provider-secret"}


def test_media_headers_are_asked_per_url_so_the_key_stays_on_its_host(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """The lifecycle passes each output URL to ``media_headers``: a client's key is never sent
    to an output host that is not its own API."""
    server = RawServer()
    client = KeyedClient(f"http://127.0.0.1:{server.port}/out.bin")
    name = f"security-keyed-{uuid.uuid4().hex[:6]}"
    register_kind(Kind(name, False, timedelta(minutes=10), timedelta(seconds=5),
                       timedelta(hours=1), "test", client="", factory=lambda s, h: client))
    try:
        # (the bare entry is how the old allow-list spelled every port)
        w = World(db, simulator, tmp_path, media_allowed_hosts=["127.0.0.1:*", "127.0.0.1"])
        job_id = w.submit(name, model="m")
        assert lifecycle.create_step(w.rt, job_id).action == "accepted"
        drain(w.rt, w.q)
        assert w.job(job_id).status == "completed"
        assert len(server.requests) == 1
        assert b"provider-secret" not in server.requests[0]
    finally:
        unregister_kind(name)
        server.close()
