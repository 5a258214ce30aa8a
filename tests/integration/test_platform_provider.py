"""A platform adds a provider family — kind, client and webhook scheme — without editing the
library, and its signed deliveries go through the real ingest path (issue 17).

The fake family "testfam" is registered at runtime (a name no real provider family will take).
Its kind is deliberately NOT named ``testfam-…``:
the webhook path, ``jobs.provider`` and the scheme all follow :attr:`Kind.provider`, never a
name prefix.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import uuid
from collections.abc import Iterator, Mapping
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from reconcile import Kind, lifecycle, register_kind, webhooks
from reconcile.db.models import Job, WebhookDelivery
from reconcile.errors import WebhookSignatureError
from reconcile.jobstore import evidence
from reconcile.kinds import get_kind, provider_of, unregister_kind
from reconcile.providers import Created, CreateRequest, ListedTask, Output, PollResult, PollStatus
from reconcile.testing.simulator import Simulator
from reconcile.webhook_ingest import handle_webhook
from tests.integration.harness import Queues, drain, fund, make_runtime

SECRET = "testfam-webhook-secret"
TOLERANCE = timedelta(minutes=5)


class FakeFamilyClient:
    """An in-memory AsyncProvider: a task runs until the test finishes it."""

    name = "studio-render"

    def __init__(self) -> None:
        self.creates: list[CreateRequest] = []
        self.done: set[str] = set()

    def create(self, request: CreateRequest) -> Created:
        self.creates.append(request)
        return Created(task_id=f"testfam-{len(self.creates)}")

    def poll(self, task_id: str, *, model: str | None = None) -> PollResult:
        if task_id in self.done:
            return PollResult(PollStatus.SUCCEEDED, progress=100, raw_status="done",
                              outputs=(Output(text="rendered", media_type="text/plain"),))
        return PollResult(PollStatus.RUNNING, raw_status="rendering")

    def cancel(self, task_id: str, *, model: str | None = None) -> bool:
        return False

    def find_created(self, job_id: str, created_after: datetime) -> ListedTask | None:
        return None


def verify_testfam(headers: Mapping[str, str], body: bytes, query: Mapping[str, str], key: Any,
                now: datetime) -> webhooks.WebhookEvent:
    """hex HMAC-SHA256 of ``{X-Testfam-Timestamp}.{body}``, built from the library's shared checks."""
    secret = webhooks.require_secret(key, "testfam")
    (given,) = webhooks.required_headers(headers, ("X-Testfam-Signature",),
                                         "missing X-Testfam-Signature header")
    ts = webhooks.fresh_timestamp(headers, "X-Testfam-Timestamp", now, TOLERANCE)
    expected = hmac.new(secret.encode(), f"{ts}.".encode() + body, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected.encode(), given.encode()):
        raise WebhookSignatureError("X-Testfam-Signature does not match the body")
    data = webhooks.json_object(body)
    status = data.get("status")
    return webhooks.event(
        "testfam", delivery_id=f"{data.get('id')}:{ts}", task_id=data.get("id"),
        planted=query.get("job_id"), status=status,
        outcome={"done": webhooks.SUCCEEDED, "error": webhooks.FAILED}.get(status),
        error=None, payload=data, signed_body=True,
    )


SCHEME = webhooks.WebhookScheme(
    provider="testfam",
    verify=verify_testfam,
    secret=lambda rt: SECRET,
    binding=webhooks.Binding("signed body `id`", None),
)


@pytest.fixture
def fake_family() -> Iterator[FakeFamilyClient]:
    client = FakeFamilyClient()
    kind = Kind("studio-render", sync=False, stale_threshold=timedelta(minutes=10),
                poll_interval=timedelta(seconds=5), result_url_lifetime=None,
                plant="webhook query", client="unused:unused",
                factory=lambda settings, session: client, provider="testfam")
    assert webhooks.get_scheme("testfam") is None
    register_kind(kind, webhook=SCHEME)
    try:
        yield client
    finally:
        unregister_kind("studio-render")
        webhooks.unregister_webhook_scheme("testfam")


def _signed(task_id: str, status: str, *, secret: str = SECRET) -> tuple[dict[str, str], bytes]:
    body = json.dumps({"id": task_id, "status": status}).encode()
    ts = str(int(datetime.now().timestamp()))
    signature = hmac.new(secret.encode(), f"{ts}.".encode() + body, hashlib.sha256).hexdigest()
    return {"X-Testfam-Signature": signature, "X-Testfam-Timestamp": ts}, body


def _deliveries(db: sessionmaker[Session]) -> int:
    with db() as s:
        return s.scalar(select(func.count()).select_from(WebhookDelivery).where(
            WebhookDelivery.provider == "testfam")) or 0


def _start(db: sessionmaker[Session], rt: Any, q: Queues) -> uuid.UUID:
    user = uuid.uuid4()
    fund(db, user)
    job_id = lifecycle.submit_job(rt, user, "studio-render", "testfam/v1", {"prompt": "x"}, 30,
                                  job_type="render").job_id
    lifecycle.create_step(rt, q.creates.popleft())
    q.polls.clear()  # the poll chain would finish the job too: only the webhook may here
    return job_id


def test_a_platform_kind_brings_its_webhook_scheme(db, simulator: Simulator, tmp_path,
                                                   fake_family: FakeFamilyClient) -> None:  # type: ignore[no-untyped-def]
    rt, q = make_runtime(db, simulator, tmp_path)
    kind = get_kind("studio-render")
    assert kind is not None and kind.provider == "testfam" and provider_of("studio-render") == "testfam"
    job_id = _start(db, rt, q)
    # the planted callback URL names the kind's provider family, not the kind name's prefix
    assert fake_family.creates[0].webhook_url == f"https://platform.example/hooks/webhooks/testfam?job_id={job_id}"
    query = {"job_id": str(job_id)}
    fake_family.done.add("testfam-1")

    # a bad signature is refused before anything is stored
    headers, body = _signed("testfam-1", "done", secret="not-the-secret")
    status, answer = handle_webhook(rt, "testfam", headers, body, query)
    assert status == 401 and answer["error"]["code"] == "WEBHOOK_REJECTED"
    assert _deliveries(db) == 0
    headers, body = _signed("testfam-1", "done")
    assert handle_webhook(rt, "testfam", {**headers, "X-Testfam-Timestamp": "1"}, body, query)[0] == 401

    # a signed delivery is stored, confirmed by a read, and the job completes through the CAS path
    status, answer = handle_webhook(rt, "testfam", headers, body, query)
    assert (status, answer) == (202, {"status": "enqueued"})
    assert _deliveries(db) == 1
    assert handle_webhook(rt, "testfam", headers, body, query) == (200, {"status": "duplicate"})
    drain(rt, q)
    with db() as s:
        job = s.get(Job, job_id)
        assert job is not None and job.status == "completed" and job.provider == "testfam"


def test_a_delivery_on_a_shipped_route_never_reads_a_platform_job(
        db, simulator: Simulator, tmp_path, fake_family: FakeFamilyClient) -> None:  # type: ignore[no-untyped-def]
    from reconcile.testing import sim_signing

    rt, q = make_runtime(db, simulator, tmp_path)
    job_id = _start(db, rt, q)
    fake_family.done.add("testfam-1")
    body = json.dumps({"code": 200, "data": {"taskId": "testfam-1", "state": "success"}}).encode()
    headers = sim_signing.kie_headers(simulator.secrets.kie_webhook_hmac_key, "testfam-1",
                                      sim_signing.now_seconds())
    status, answer = handle_webhook(rt, "kie", headers, body, {"job_id": str(job_id)})
    assert (status, answer) == (202, {"status": "stored"})  # the route's family is not the job's
    with db() as s:
        job = s.get(Job, job_id)
        assert job is not None and job.status == "processing"


def test_an_unregistered_scheme_is_refused_and_evidence_follows_the_scheme(
        db, simulator: Simulator, tmp_path, fake_family: FakeFamilyClient) -> None:  # type: ignore[no-untyped-def]
    rt, _ = make_runtime(db, simulator, tmp_path)
    headers, body = _signed("testfam-1", "done")
    status, answer = handle_webhook(rt, "testfam-typo", headers, body, {})
    assert status == 400 and "unknown webhook provider" in answer["error"]["message"]

    kind = get_kind("studio-render")
    assert kind is not None
    row = WebhookDelivery(provider="testfam", delivery_id="d", upstream_id="testfam-1",
                          job_id=uuid.uuid4(), payload={"id": "testfam-1"})
    # the scheme signs nothing that names a job and has no confirming read: operator only
    judged = evidence.assess(row, str(row.job_id), kind, rt.settings)
    assert not judged.usable and not judged.needs_read
    assert evidence.same_kind(row, kind) and not evidence.same_kind(row, get_kind("kie-standard"))
    # a kind may opt in to the echo check on its own
    echoing = Kind("studio-echo", False, timedelta(minutes=1), None, None, None, "unused:unused",
                   provider="testfam", echo_check=True)
    assert evidence.assess(row, str(row.job_id), echoing, rt.settings).needs_read


def test_register_kind_refuses_a_scheme_of_another_family(fake_family: FakeFamilyClient) -> None:
    other = Kind("studio-other", False, timedelta(minutes=1), None, None, None, "unused:unused",
                 provider="other")
    with pytest.raises(ValueError, match="not kind 'studio-other'"):
        register_kind(other, webhook=SCHEME)
    assert get_kind("studio-other") is None
    with pytest.raises(ValueError, match="already registered"):
        webhooks.register_webhook_scheme(
            webhooks.WebhookScheme("testfam", verify_testfam, lambda rt: "another secret"))
