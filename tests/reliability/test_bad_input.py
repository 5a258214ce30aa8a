"""Bad input, part 2 (real PostgreSQL + the simulator): arbitrary webhook deliveries, hostile
and oversize media URLs, replayed webhooks, another user's job id, and odd rows in the sweep."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from reconcile import api, credits, lifecycle, webhooks
from reconcile.db.models import Asset, CreditTransaction, Job, JobEvent, UsageLog, WebhookDelivery
from reconcile.kinds import Kind, register_kind, unregister_kind
from reconcile.providers.base import (
    Created,
    CreateRequest,
    ListedTask,
    Output,
    PollResult,
    PollStatus,
)
from reconcile.sweep import sweep
from reconcile.sync import sync_call
from reconcile.testing import sim_registry
from reconcile.testing.simulator import Script, Simulator
from reconcile.webhook_ingest import handle_webhook
from tests.integration.harness import Clock, drain, fund
from tests.reliability.support import (
    LoopbackServer,
    money_snapshot,
    runtime,
    truncate,
)

INSTANT = ((0.0, "queued"), (0.0, "succeeded"))
FOREVER = ((0.0, "queued"), (0.0, "running"))
DB_FUZZ = settings(deadline=None, max_examples=40,
                   suppress_health_check=[HealthCheck.function_scoped_fixture,
                                          HealthCheck.too_slow])
FAMILIES = {
    "kie-standard": ("seedream/4.5-edit", {"prompt": "a cat"}),
    "kie-veo": ("veo3_fast", {"prompt": "a dog"}),
    "replicate-prediction": ("owner/model:abc123", {"prompt": "x"}),
    "elevenlabs-async": ("dubbing", {"source_url": "https://example.com/a.mp4", "target_lang": "es"}),
    "fal-queue": ("fal-ai/flux/dev", {"prompt": "x"}),
}


def _job(db: sessionmaker[Session], job_id: uuid.UUID) -> Job:
    with db() as s:
        job = s.get(Job, job_id)
        assert job is not None
        return job


def _submit(rt: Any, db: sessionmaker[Session], kind: str, user: uuid.UUID | None = None,
            credits_: int = 40) -> uuid.UUID:
    user = user or uuid.uuid4()
    fund(db, user, 10_000)
    model, inp = FAMILIES.get(kind, ("m/x", {"prompt": "x"}))
    return lifecycle.submit_job(rt, user, kind, model, inp, credits_, job_type="image",
                                enqueue=False).job_id


# --------------------------------------------------------------------------- webhook fuzz


@dataclass
class Webhooks:
    rt: Any
    db: sessionmaker[Session]
    sim: Simulator
    job_ids: list[str]
    task_ids: list[str]


@pytest.fixture
def webhook_world(db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> Webhooks:
    """In flight on every async family (upstream running forever), one uncertain, one done."""
    rt, q = runtime(db, simulator, tmp_path)
    simulator.script_default(Script(timeline=FOREVER))
    simulator.configure(elevenlabs_webhook_url=None)
    ids = []
    for kind in FAMILIES:
        job_id = _submit(rt, db, kind)
        assert lifecycle.create_step(rt, job_id).action == "accepted"
        ids.append(job_id)
    uncertain = _submit(rt, db, "fal-queue")
    simulator.script(str(uncertain), Script(create="drop_after_accept", timeline=FOREVER))
    assert lifecycle.create_step(rt, uncertain).action == "uncertain"
    done = _submit(rt, db, "replicate-prediction")
    simulator.script(str(done), Script(timeline=INSTANT))
    lifecycle.create_step(rt, done)
    drain(rt, q)  # type: ignore[arg-type]
    assert _job(db, done).status == "completed"
    q.clear()
    ids += [uncertain, done]
    return Webhooks(rt, db, simulator, [str(i) for i in ids], list(simulator.tasks))


PROVIDERS = list(webhooks.PROVIDERS)  # every shipped webhook scheme


def _bodies(world: Webhooks, provider: str | None = None) -> st.SearchStrategy[bytes]:
    ids = st.sampled_from(world.task_ids) | st.text(max_size=12) | st.just("\x00")
    jobs = st.sampled_from(world.job_ids) | st.text(max_size=10)
    status = st.sampled_from(["succeeded", "failed", "canceled", "OK", "ERROR", "success",
                              "fail", "dubbed", "COMPLETED", "processing"]) | st.text(max_size=8)
    leaf = ids | jobs | status | st.integers() | st.none() | st.booleans()
    fields = st.sampled_from(["taskId", "task_id", "id", "request_id", "status", "state",
                              "successFlag", "output", "error", "webhook", "payload",
                              "dubbing_id", "name", "transcription_id", "webhook_metadata",
                              "code", "msg", "resultJson", "gateway_request_id", "logs"])
    obj = st.recursive(leaf, lambda c: st.lists(c, max_size=3)
                       | st.dictionaries(fields, c, max_size=6), max_leaves=20)
    shaped = st.one_of(
        st.dictionaries(fields, obj, max_size=8),
        st.builds(lambda d, c: {"code": c, "msg": "x", "data": d},
                  st.dictionaries(fields, obj, max_size=6), st.sampled_from([200, 500, 501])),
        st.builds(lambda d: {"type": "dubbing", "event_timestamp": int(time.time()), "data": d},
                  st.dictionaries(fields, obj, max_size=6)),
    )
    # the providers' own shapes, with the real task ids and odd values in them
    extra = st.dictionaries(fields, obj, max_size=4)
    templates = {
        "replicate": st.builds(lambda i, s, x: {"id": i, "status": s, **x}, ids, status, extra),
        "kie": st.builds(lambda i, s, x: {"code": 200, "msg": "success",
                                          "data": {"taskId": i, "state": s, **x}},
                         ids, status, extra),
        "fal": st.builds(lambda i, s, x: {"request_id": i, "status": s, **x}, ids,
                         st.sampled_from(["OK", "ERROR"]) | status, extra),
        "elevenlabs": st.builds(lambda i, s, x: {"type": "dubbing", "event_timestamp": 1,
                                                 "data": {"dubbing_id": i, "status": s, **x}},
                                ids, status, extra),
    }
    templated = templates.get(provider, shaped) if provider else st.one_of(*templates.values())
    return (shaped | templated).map(lambda d: json.dumps(d).encode()) | st.binary(max_size=80)


def _sign(world: Webhooks, provider: str, body: bytes, delivery: str) -> dict[str, str]:
    """``body`` signed as ``provider`` signs a delivery (its simulator module's signer)."""
    return sim_registry.sign(provider, world.sim, body, int(time.time()))


def _assert_answer(status: int, body: Any) -> None:
    assert 200 <= status < 500, (status, body)
    assert isinstance(body, dict)
    json.dumps(body)  # serialisable as the web layer will


def test_fuzz_unsigned_deliveries_answer_4xx_and_change_nothing(webhook_world: Webhooks) -> None:
    """Arbitrary provider names, headers, bodies and query strings: a 4xx (or 2xx), never an
    exception, never a stored delivery, never a job or ledger change."""
    world = webhook_world
    before = money_snapshot(world.db)

    header_names = st.sampled_from([
        "webhook-id", "webhook-timestamp", "webhook-signature", "X-Webhook-Timestamp",
        "X-Webhook-Signature", "ElevenLabs-Signature", "X-Fal-Webhook-Request-Id",
        "X-Fal-Webhook-User-Id", "X-Fal-Webhook-Timestamp", "X-Fal-Webhook-Signature"]) \
        | st.text(max_size=10)
    header_values = st.text(max_size=50) | st.sampled_from(
        [str(int(time.time())), "v1,AAAA", "t=1,v0=abcd", "00" * 64, "1e309", "-1"])

    @DB_FUZZ
    @given(provider=st.sampled_from(PROVIDERS) | st.text(max_size=10),
           headers=st.dictionaries(header_names, header_values, max_size=6),
           body=_bodies(world),
           query=st.dictionaries(st.sampled_from(["job_id", "x"]) | st.text(max_size=5),
                                 st.sampled_from(world.job_ids) | st.text(max_size=30), max_size=3))
    def run(provider: str, headers: dict[str, str], body: bytes, query: dict[str, str]) -> None:
        status, answer = handle_webhook(world.rt, provider, headers, body, query)
        _assert_answer(status, answer)
        assert status >= 400 or provider not in PROVIDERS, (status, answer)

    run()
    assert money_snapshot(world.db) == before
    with world.db() as s:
        assert s.execute(select(func.count()).select_from(WebhookDelivery)).scalar_one() == 0


def test_fuzz_signed_odd_deliveries_never_finish_a_running_job(webhook_world: Webhooks) -> None:
    """Correctly signed deliveries with arbitrary content naming real jobs and tasks: answered
    2xx/4xx, and since every upstream task is still running (or the job already settled), no
    job changes state or money — a delivery only makes the library re-read the task."""
    world = webhook_world
    before = money_snapshot(world.db)

    @DB_FUZZ
    @given(data=st.data(), job=st.sampled_from(world.job_ids) | st.text(max_size=10),
           delivery=st.uuids())
    def run(data: st.DataObject, job: str, delivery: uuid.UUID) -> None:
        provider = data.draw(st.sampled_from(PROVIDERS))
        body = data.draw(_bodies(world, provider))
        headers = _sign(world, provider, body, f"msg_{delivery.hex}")
        status, answer = handle_webhook(world.rt, provider, headers, body, {"job_id": job})
        _assert_answer(status, answer)

    run()
    assert money_snapshot(world.db) == before


# a genuinely signed delivery of each provider's own shape, with NUL characters in it
NUL = "\x00"
NUL_BODIES = {
    "replicate": {"id": f"task{NUL}", "status": f"succeeded{NUL}", "output": [NUL]},
    "kie": {"code": 200, "msg": NUL, "data": {"taskId": f"t{NUL}", "state": "success"}},
    "fal": {"request_id": f"r{NUL}", "status": "OK", "payload": {"x": NUL}},
    "elevenlabs": {"type": f"dubbing{NUL}", "data": {"dubbing_id": f"d{NUL}", "error": f"e{NUL}"}},
}


@pytest.mark.parametrize("provider", sorted(NUL_BODIES))
def test_signed_delivery_with_nul_characters_is_answered_not_a_500(
        webhook_world: Webhooks, provider: str) -> None:
    """PostgreSQL text/jsonb cannot hold NUL: a genuinely signed delivery carrying ``\\u0000``
    in its ids, status or body is still stored and answered (regression: it raised a
    DataError, i.e. a 500 the provider would retry forever)."""
    world = webhook_world
    body = json.dumps(NUL_BODIES[provider]).encode()
    before = money_snapshot(world.db)
    status, answer = handle_webhook(world.rt, provider, _sign(world, provider, body, "msg_nul"),
                                    body, {"job_id": world.job_ids[0]})
    assert 200 <= status < 300, (status, answer)
    assert money_snapshot(world.db) == before
    with world.db() as s:
        assert s.execute(select(func.count()).select_from(WebhookDelivery)).scalar_one() == 1


# --------------------------------------------------------------------------- replayed webhooks


@pytest.mark.parametrize("kind", ["kie-standard", "replicate-prediction", "fal-queue",
                                  "elevenlabs-async"])
def test_replayed_webhook_is_deduped(db: sessionmaker[Session], simulator: Simulator,
                                     tmp_path: Path, kind: str) -> None:
    """The provider's own signed delivery, delivered three times: the job completes once, one
    commit, one completion event, one asset per output; the replays answer "duplicate"."""
    rt, q = runtime(db, simulator, tmp_path)
    simulator.configure(elevenlabs_webhook_url="http://127.0.0.1:9/hooks/webhooks/elevenlabs")
    job_id = _submit(rt, db, kind)
    simulator.script(str(job_id), Script(timeline=((0.0, "queued"), (0.2, "succeeded")),
                                         outputs=2 if kind != "elevenlabs-async" else 1,
                                         webhook=True))
    assert lifecycle.create_step(rt, job_id).action == "accepted"
    q.clear()  # the poll chain is lost: only the webhook can finish the job
    task_id = _job(db, job_id).provider_task_id
    deadline = time.monotonic() + 10
    while not [d for d in simulator.deliveries if d["task_id"] == task_id]:
        assert time.monotonic() < deadline, "the simulator sent no webhook"
        time.sleep(0.05)
    delivery = [d for d in simulator.deliveries if d["task_id"] == task_id][0]
    url = urlsplit(delivery["url"])
    provider, query = url.path.rsplit("/", 1)[-1], dict(parse_qsl(url.query))
    answers = [handle_webhook(rt, provider, delivery["headers"], delivery["body"], query)
               for _ in range(3)]
    # the first is confirmed and handed to a worker (no media work in the request thread)
    assert answers[0] == (202, {"status": "enqueued"}), answers
    assert answers[1:] == [(200, {"status": "duplicate"})] * 2
    drain(rt, q)  # type: ignore[arg-type]
    job = _job(db, job_id)
    assert job.status == "completed" and job.credits_actual == 40
    with db() as s:
        assert s.execute(select(func.count()).select_from(CreditTransaction).where(
            CreditTransaction.job_id == job_id, CreditTransaction.type == "COMMIT")).scalar_one() == 1
        assert s.execute(select(func.count()).select_from(JobEvent).where(
            JobEvent.job_id == job_id, JobEvent.type == "completed")).scalar_one() == 1
        outputs = len(job.output_data["outputs"])
        assert s.execute(select(func.count()).select_from(Asset).where(
            Asset.job_id == job_id)).scalar_one() == outputs >= 1
        assert s.execute(select(func.count()).select_from(WebhookDelivery)).scalar_one() == 1
        assert credits.audit(s) == []
    assert simulator.creates(str(job_id)) == 1


# --------------------------------------------------------------------------- another user's job


def test_another_users_job_id_is_not_found(db: sessionmaker[Session], simulator: Simulator,
                                           tmp_path: Path) -> None:
    """snapshot and cancel with another user's job id → 404 JOB_NOT_FOUND; nothing changes.
    A malformed id is also 404."""
    rt, _ = runtime(db, simulator, tmp_path)
    owner, stranger = uuid.uuid4(), uuid.uuid4()
    fund(db, stranger, 100)
    job_id = _submit(rt, db, "kie-standard", user=owner)  # not_started: cancelable by its owner
    before = money_snapshot(db)
    not_found = {"error": {"type": "not_found_error", "code": "JOB_NOT_FOUND",
                           "message": "No such job."}}
    for call in (api.snapshot, api.cancel):
        for ident in (job_id, str(job_id), str(job_id).upper(), "not-a-uuid", "", "../" * 8,
                      str(uuid.uuid4())):
            assert call(rt, stranger, ident) == (404, not_found), (call.__name__, ident)
    assert money_snapshot(db) == before
    assert api.snapshot(rt, owner, job_id)[0] == 200  # the owner still sees it


# --------------------------------------------------------------------------- hostile media


class HostileClient:
    """An AsyncProvider whose task 'succeeds' with whatever URLs the test gives it."""

    name = "reliability-hostile"

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self.polls = 0

    def create(self, request: CreateRequest) -> Created:
        return Created(f"hostile-{request.job_id}")

    def poll(self, task_id: str, *, model: str | None = None) -> PollResult:
        self.polls += 1
        return PollResult(status=PollStatus.SUCCEEDED, raw_status="succeeded",
                          outputs=tuple(Output(url=u) for u in self.urls))

    def cancel(self, task_id: str, *, model: str | None = None) -> bool:
        return False

    def find_created(self, job_id: str, created_after: datetime) -> ListedTask | None:
        return None


@pytest.fixture
def media_server() -> Iterator[LoopbackServer]:
    with LoopbackServer() as server:
        yield server


def _hostile_urls(port: int) -> dict[str, list[str]]:
    allowed = f"http://127.0.0.1:{port}"  # allow-listed (the simulator's host)
    return {
        "metadata": ["http://169.254.169.254/latest/meta-data"],
        "metadata-v6": ["http://[fd00:ec2::254]/latest/meta-data"],
        "file": ["file:///etc/passwd"],
        "gopher": [f"gopher://localhost:{port}/_secret"],
        "localhost": [f"http://localhost:{port}/secret-localhost"],
        "hex-loopback": [f"http://0x7f000001:{port}/secret-hex"],
        "mapped-v6": [f"http://[::ffff:127.0.0.1]:{port}/secret-v6"],
        "unspecified": [f"http://0.0.0.0:{port}/secret-zero"],
        "redirect-to-loopback": [f"{allowed}/redirect-loopback"],
        "redirect-to-metadata": [f"{allowed}/redirect-metadata"],
        "redirect-to-file": [f"{allowed}/redirect-file"],
        "oversize-declared": [f"{allowed}/big-declared"],
        "oversize-streamed": [f"{allowed}/big-streamed"],
        "one-good-one-bad": [f"{allowed}/good.png", "file:///etc/passwd"],
    }


HOSTILE = sorted(_hostile_urls(0))


@pytest.mark.parametrize("case", HOSTILE)
def test_hostile_or_oversize_media_is_never_fetched_or_completed(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        media_server: LoopbackServer, case: str) -> None:
    """A provider that 'succeeds' with a hostile or oversize URL: nothing private is fetched,
    nothing is stored, the job never completes; it stays in flight and, at exhaustion, fails and
    is refunded exactly once (outcome table: media errors are retried until exhaustion)."""
    port = media_server.port
    media_server.route("/redirect-loopback", 302, {"Location": f"http://localhost:{port}/secret-r"})
    media_server.route("/redirect-metadata", 302,
                       {"Location": "http://169.254.169.254/latest/meta-data/iam"})
    media_server.route("/redirect-file", 302, {"Location": "file:///etc/passwd"})
    media_server.route("/big-declared", 200, {"Content-Type": "image/png",
                                              "Content-Length": str(5_000_000)}, b"x" * 10)
    media_server.route("/big-streamed", 200, {"Content-Type": "image/png"}, b"x" * 300_000)
    media_server.route("/good.png", 200, {"Content-Type": "image/png",
                                          "Content-Length": "3"}, b"png")
    client = HostileClient(_hostile_urls(port)[case])
    name = f"reliability-hostile-{uuid.uuid4().hex[:6]}"
    register_kind(Kind(name, False, timedelta(minutes=10), timedelta(seconds=5), timedelta(hours=1),
                       "test", client="", factory=lambda settings, session: client))
    try:
        clock = Clock(datetime.now(UTC))
        rt, q = runtime(db, simulator, tmp_path, clock=clock, media_max_bytes=100_000,
                        media_timeout=5.0, media_allowed_hosts=["127.0.0.1:*"])
        job_id = _submit(rt, db, name)
        lifecycle.create_step(rt, job_id)
        drain(rt, q, max_steps=6)  # type: ignore[arg-type]
        assert client.polls >= 2
        job = _job(db, job_id)
        assert job.status == "processing", (job.status, job.error_code)
        # exhaustion: attempts past the threshold, one per 5 minutes, through the sweep
        for _ in range(MAX_TICKS):
            clock.advance(minutes=6)
            sweep(rt)
            q.clear()
            if _job(db, job_id).status != "processing":
                break
        job = _job(db, job_id)
        assert job.status == "failed" and job.credits_actual == 0, (job.status, job.error_code)
        # a refused URL is a media failure, retried to exhaustion (not expired media): the code
        # is the exhaustion's, the refusal itself is kept as the last error
        assert job.error_code in ("UPSTREAM_TIMEOUT", "UPSTREAM_FAILED"), job.error_code
        assert "media" in (job.reconcile_last_error or ""), job.reconcile_last_error
        with db() as s:
            assert s.execute(select(UsageLog.status).where(UsageLog.job_id == job_id)
                             ).scalar_one() == "refunded"
            assert s.execute(select(func.count()).select_from(Asset)).scalar_one() == 0
            assert credits.audit(s, now=clock.now) == []
        # a fetch that fails part-way leaves the outputs already stored as orphans (no asset row
        # names them; the chaos report counts such objects): only the good output may be there
        good = [f"image/{job_id}/0.png"] if case == "one-good-one-bad" else []
        assert set(rt.storage.keys()) <= set(good)
        assert [h for h in media_server.hits if "secret" in h[1]] == []
    finally:
        unregister_kind(name)


MAX_TICKS = 40


def test_sync_call_with_a_hostile_output_url_never_completes(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        media_server: LoopbackServer) -> None:
    """A sync answer whose output is a metadata URL: the finalize refuses it, the job is left
    for the sweep, which fails and refunds it past the kind's threshold; nothing is fetched."""
    from reconcile.errors import MediaError
    from reconcile.providers.base import SyncResult

    clock = Clock(datetime.now(UTC))
    rt, _ = runtime(db, simulator, tmp_path, clock=clock)
    job_id = _submit(rt, db, "anthropic-sync")
    with pytest.raises(MediaError), sync_call(rt, job_id) as call:
        call.result = SyncResult((Output(url=f"http://localhost:{media_server.port}/secret"),))
    assert _job(db, job_id).status == "pending"
    clock.advance(minutes=6)
    sweep(rt)
    job = _job(db, job_id)
    assert (job.status, job.error_code, job.credits_actual) == ("failed", "RECONCILE_NO_RECOVERY", 0)
    assert media_server.hits == [] and rt.storage.keys() == []


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
            assert _job(db, legacy.id).status == "failed"
            assert _job(db, legacy.id).credits_actual == 0
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
            assert (_job(db, job.id).status, _job(db, job.id).credits_actual) == ("failed", 0)
        for job in rows[0::2]:  # the broken rows stay in flight, untouched money-wise
            assert _job(db, job.id).status == "processing"
        with db() as s:
            assert credits.audit(s, now=NOW) == []
    finally:
        unregister_kind(BROKEN)
