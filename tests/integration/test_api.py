"""The gateway helpers answer exactly the JSON of the customer contract (``reconcile/api.py``).

Every response is compared as parsed JSON, key for key; ``TEXT`` stands for a message whose
wording is the lifecycle's, not the contract's.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from reconcile import Runtime, api, credits, jobstore, lifecycle
from reconcile.db.models import Asset, CreditBalance, CreditTransaction, Job
from reconcile.errors import InvalidParam
from reconcile.settlement import SettleOutcome
from reconcile.states import CREATE_CLAIM_LEASE
from reconcile.storage import LocalStorage
from reconcile.testing.simulator import Script, Simulator
from tests.integration.harness import Clock, Queues, clocked_runtime, drain, fund

KIE = "kie-standard"
KIE_MODEL = "seedream/4.5-edit"
INSTANT = ((0.0, "queued"), (0.0, "succeeded"))
RUNNING = ((0.0, "queued"), (3600.0, "succeeded"))
T0 = datetime(2026, 12, 1, 10, 3, 30, tzinfo=UTC)


class _Text:
    """Equals any non-empty string (a message the contract does not fix)."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and bool(other.strip())

    def __repr__(self) -> str:
        return "<text>"


TEXT = _Text()


def as_json(response: tuple[int, dict[str, Any]]) -> tuple[int, Any]:
    """What the client receives: the status and the body after a JSON round trip."""
    status, body = response
    return status, json.loads(json.dumps(body))


@pytest.fixture
def env(db: sessionmaker[Session], simulator: Simulator,
        tmp_path: Path) -> tuple[Runtime, Queues, Clock]:
    return clocked_runtime(db, simulator, tmp_path, T0)


def submit_kie(rt: Runtime, user: uuid.UUID, *, inline: bool = True, credits_: int = 40,
               model: str = KIE_MODEL, **kwargs: Any) -> tuple[int, Any]:
    return as_json(api.submit(rt, user, KIE, model, {"prompt": "a cat"}, credits_, job_type="image",
                              inline=inline, **kwargs))


def balance(db: sessionmaker[Session], user: uuid.UUID) -> int:
    with db() as s:
        row = s.get(CreditBalance, user)
        return 0 if row is None else row.sub + row.topup


def load(db: sessionmaker[Session], job_id: str) -> Job:
    with db() as s:
        job = s.get(Job, uuid.UUID(job_id))
        assert job is not None
        return job


def job_count(db: sessionmaker[Session]) -> int:
    with db() as s:
        return len(s.execute(select(Job.id)).all())


# ----------------------------------------------------------------------------- submit


def test_queued_submit_answers_202_and_enqueues_the_create(env, db, simulator) -> None:
    """Queued path: 202 with the job id at once; the create runs later in a worker."""
    rt, queues, _ = env
    user = uuid.uuid4()
    fund(db, user)
    status, body = submit_kie(rt, user, inline=False)
    assert (status, body) == (202, {"job_id": TEXT, "state": "queued"})
    job = load(db, body["job_id"])
    assert (job.status, job.submission_state) == ("pending", "not_started")
    assert list(queues.creates) == [job.id]
    assert simulator.attempts(body["job_id"]) == 0
    assert balance(db, user) == 960


def test_inline_accepted_answers_202(env, db, simulator) -> None:
    """Inline path: the create ran in the request and was accepted."""
    rt, queues, _ = env
    user = uuid.uuid4()
    fund(db, user)
    simulator.script_default(Script(timeline=RUNNING))
    status, body = submit_kie(rt, user)
    assert (status, body) == (202, {"job_id": TEXT, "state": "queued"})
    job = load(db, body["job_id"])
    assert (job.status, job.submission_state) == ("processing", "accepted")
    assert job.provider_task_id and not queues.creates
    assert simulator.creates(body["job_id"]) == 1


def test_sync_kind_is_queued_not_created(env, db, simulator) -> None:
    """A sync kind answers 202 queued even inline: the platform's sync-call helper runs it."""
    rt, queues, _ = env
    user = uuid.uuid4()
    fund(db, user)
    status, body = as_json(api.submit(rt, user, "anthropic-sync", "claude-sonnet-4-5",
                                      {"prompt": "hi"}, 5, job_type="text", inline=True))
    assert (status, body) == (202, {"job_id": TEXT, "state": "queued"})
    assert not queues.creates and simulator.attempts() == 0


def test_inline_422_is_submission_failed_and_the_job_names_the_cause(env, db, simulator) -> None:
    """A 422 validation error: 502 SUBMISSION_FAILED; the job's own code is INVALID_INPUT."""
    rt, _, _ = env
    user = uuid.uuid4()
    fund(db, user)
    simulator.script_model(KIE_MODEL, Script(create="reject_invalid"))
    status, body = submit_kie(rt, user)
    assert (status, body) == (502, {"error": {
        "type": "upstream_error", "code": "UPSTREAM_SUBMISSION_FAILED",
        "message": "Upstream submission failed. Check the job for credit reconciliation.",
        "job_id": TEXT}})
    job_id = body["error"]["job_id"]
    job = load(db, job_id)
    assert (job.status, job.error_code, job.submission_state) == \
        ("failed", "UPSTREAM_INVALID_INPUT", "rejected")
    assert balance(db, user) == 1000
    assert as_json(api.snapshot(rt, user, job_id)) == (200, {
        "id": job_id, "state": "failed", "outputs": None,
        "error": {"code": "UPSTREAM_INVALID_INPUT", "message": TEXT, "submissionOutcome": "rejected"},
        "credits_actual": 0, "credits_returned": 40,
        "next_poll_at": None})


def test_inline_401_is_submission_failed_with_the_upstream_request_id(env, db, simulator) -> None:
    """A 401 (ElevenLabs dubbing): 502 SUBMISSION_FAILED carrying the provider's request id."""
    rt, _, _ = env
    user = uuid.uuid4()
    fund(db, user)
    simulator.script_model("dubbing", Script(create="reject_auth"))
    status, body = as_json(api.submit(
        rt, user, "elevenlabs-async", "dubbing",
        {"source_url": "https://media.example/clip.mp4", "target_lang": "es"}, 30,
        job_type="audio", inline=True))
    assert (status, body) == (502, {"error": {
        "type": "upstream_error", "code": "UPSTREAM_SUBMISSION_FAILED",
        "message": "Upstream submission failed. Check the job for credit reconciliation.",
        "job_id": TEXT, "upstream_request_id": "req_sim_error"}})
    job = load(db, body["error"]["job_id"])
    assert (job.status, job.error_code, job.submission_state, job.credits_actual) == \
        ("failed", "UPSTREAM_SUBMISSION_FAILED", "rejected", 0)


def test_kie_401_is_submission_failed_without_an_invented_request_id(env, db, simulator) -> None:
    """A KIE 401 carries no request id, so the 502 has none (never invented)."""
    rt, _, _ = env
    user = uuid.uuid4()
    fund(db, user)
    simulator.script_model(KIE_MODEL, Script(create="reject_auth"))
    status, body = submit_kie(rt, user)
    assert (status, body) == (502, {"error": {
        "type": "upstream_error", "code": "UPSTREAM_SUBMISSION_FAILED",
        "message": "Upstream submission failed. Check the job for credit reconciliation.",
        "job_id": TEXT}})
    assert load(db, body["error"]["job_id"]).error_code == "UPSTREAM_SUBMISSION_FAILED"


@pytest.mark.parametrize("mode, upstream_creates", [("drop_after_accept", 1), ("server_error", 0)])
def test_inline_unknown_outcome_is_uncertain(env, db, simulator, mode: str,
                                             upstream_creates: int) -> None:
    """A dropped connection or a 5xx: 502 UNCERTAIN; reservation kept, never resubmitted."""
    rt, queues, _ = env
    user = uuid.uuid4()
    fund(db, user)
    simulator.script_model(KIE_MODEL, Script(create=mode))
    status, body = submit_kie(rt, user)
    assert (status, body) == (502, {"error": {
        "type": "upstream_error", "code": "UPSTREAM_SUBMISSION_UNCERTAIN",
        "message": "Upstream submission outcome is unknown. Do not resubmit; check the job.",
        "job_id": TEXT}})
    job_id = body["error"]["job_id"]
    job = load(db, job_id)
    assert (job.status, job.submission_state, job.credits_actual) == ("pending", "uncertain", None)
    assert balance(db, user) == 960 and not queues.creates
    assert simulator.creates(job_id) == upstream_creates
    assert as_json(api.snapshot(rt, user, job_id)) == (200, {
        "id": job_id, "state": "queued", "outputs": None,
        "error": {"code": "UPSTREAM_SUBMISSION_UNCERTAIN", "message": TEXT,
                  "submissionOutcome": "uncertain"},
        "credits_actual": None, "credits_returned": None,
        "next_poll_at": None})


def test_inline_429_answers_202_and_leaves_the_retry_to_the_worker(env, db, simulator) -> None:
    """A 429 is not waited out in the request: 202, the claim released, the create re-enqueued."""
    rt, queues, clock = env
    user = uuid.uuid4()
    fund(db, user)
    simulator.script_model(KIE_MODEL, Script(create="rate_limit", rate_limit_times=1))
    status, body = submit_kie(rt, user)
    assert (status, body) == (202, {"job_id": TEXT, "state": "queued"})
    job = load(db, body["job_id"])
    assert (job.status, job.submission_state, job.create_rate_limit_count) == \
        ("pending", "not_started", 1)
    assert list(queues.creates) == [job.id]
    assert job.create_not_before is not None and job.create_not_before > clock.now
    clock.now = job.create_not_before  # the worker's retry, at its not-before time
    drain(rt, queues, max_steps=1)
    job = load(db, body["job_id"])
    assert (job.status, job.submission_state) == ("processing", "accepted")
    assert simulator.creates(body["job_id"]) == 1


def _invalid(param: str, message: Any = TEXT) -> dict[str, Any]:
    return {"error": {"type": "invalid_request_error", "code": "INVALID_PARAM",
                      "message": message, "param": param}}


def test_invalid_params_answer_400_and_reserve_nothing(env, db) -> None:
    """Unknown kind, credits ≤ 0, input that is not JSON: 400 INVALID_PARAM naming the param."""
    rt, _, _ = env
    user = uuid.uuid4()
    fund(db, user)
    cases = [
        (dict(provider_kind="kie-nope"), "provider_kind"),
        (dict(credits=0), "credits"),
        (dict(credits=-5), "credits"),
        (dict(input="{not json"), "input"),
        (dict(input={"x": float("nan")}), "input"),
    ]
    for overrides, param in cases:
        args: dict[str, Any] = dict(provider_kind=KIE, model=KIE_MODEL, input={"prompt": "a"},
                                    credits=40)
        args.update(overrides)
        response = api.submit(rt, user, args["provider_kind"], args["model"], args["input"],
                              args["credits"], job_type="image", inline=True)
        assert as_json(response) == (400, _invalid(param)), overrides
    assert job_count(db) == 0 and balance(db, user) == 1000


def test_raw_json_text_input_is_accepted(env, db) -> None:
    """The request body's JSON text is parsed at the gateway."""
    rt, _, _ = env
    user = uuid.uuid4()
    fund(db, user)
    status, body = as_json(api.submit(rt, user, KIE, KIE_MODEL, '{"prompt": "a cat"}', 40,
                                      job_type="image"))
    assert (status, body) == (202, {"job_id": TEXT, "state": "queued"})
    assert load(db, body["job_id"]).input_data == {"prompt": "a cat"}


def test_validator_hook_rejection_is_400(env, db) -> None:
    """The platform's validator hook raising InvalidParam: 400 with its message and param."""
    rt, _, _ = env
    user = uuid.uuid4()
    fund(db, user)

    def validator(kind: str, model: str, input: Any) -> None:
        raise InvalidParam("prompt is too long for this model", param="prompt")

    assert submit_kie(rt, user, validator=validator) == \
        (400, _invalid("prompt", "prompt is too long for this model"))
    assert job_count(db) == 0


def test_insufficient_credits_is_402(env, db) -> None:
    """Too low a balance: 402, no job, nothing reserved."""
    rt, _, _ = env
    user = uuid.uuid4()
    fund(db, user, 10)
    assert submit_kie(rt, user) == (402, {"error": {
        "type": "invalid_request_error", "code": "INSUFFICIENT_CREDITS", "message": TEXT}})
    assert job_count(db) == 0 and balance(db, user) == 10


def test_unexpected_exception_is_500_without_internals(env, db) -> None:
    """Any other exception: 500 INTERNAL, nothing of the exception in the body."""
    rt, _, _ = env
    user = uuid.uuid4()
    fund(db, user)

    def validator(kind: str, model: str, input: Any) -> None:
        raise RuntimeError("secret database password in a traceback")

    status, body = submit_kie(rt, user, validator=validator)
    assert (status, body) == (500, {"error": {
        "type": "internal_error", "code": "INTERNAL", "message": TEXT}})
    assert "secret" not in json.dumps(body)


# ----------------------------------------------------------------------------- reads


def test_another_users_job_is_not_found(env, db, simulator) -> None:
    """Reads and cancels are scoped to the owner: someone else's job id is 404, as is garbage."""
    rt, _, _ = env
    owner, other = uuid.uuid4(), uuid.uuid4()
    fund(db, owner)
    _, body = submit_kie(rt, owner, inline=False)
    not_found = (404, {"error": {"type": "not_found_error", "code": "JOB_NOT_FOUND",
                                 "message": "No such job."}})
    assert as_json(api.snapshot(rt, other, body["job_id"])) == not_found
    assert as_json(api.cancel(rt, other, body["job_id"])) == not_found
    assert as_json(api.snapshot(rt, owner, "not-a-uuid")) == not_found
    assert as_json(api.snapshot(rt, owner, uuid.uuid4())) == not_found
    assert load(db, body["job_id"]).status == "pending"  # the other user's cancel did nothing


def test_snapshot_of_an_empty_result(env, db, simulator) -> None:
    """fal reports COMPLETED with no media: failed EMPTY_RESULT, refunded, request id kept."""
    rt, queues, _ = env
    user = uuid.uuid4()
    fund(db, user)
    simulator.script_default(Script(timeline=INSTANT, outputs=0))
    status, body = as_json(api.submit(rt, user, "fal-queue", "fal-ai/flux/dev", {"prompt": "a"},
                                      25, job_type="image", inline=True))
    assert status == 202
    drain(rt, queues)
    job_id = body["job_id"]
    task_id = load(db, job_id).provider_task_id
    assert as_json(api.snapshot(rt, user, job_id)) == (200, {
        "id": job_id, "state": "failed", "outputs": None,
        "error": {"code": "UPSTREAM_EMPTY_RESULT", "message": TEXT, "upstreamRequestId": task_id},
        "credits_actual": 0, "credits_returned": 25,
        "next_poll_at": None})
    assert balance(db, user) == 1000


def test_snapshot_of_a_completed_job(env, db, simulator, tmp_path: Path) -> None:
    """Completed: one output per asset row, in index order, with the public URL; credits charged."""
    rt, queues, _ = env
    rt.storage = LocalStorage(tmp_path / "media", public_base_url="https://cdn.example/m")
    user = uuid.uuid4()
    fund(db, user)
    simulator.script_default(Script(timeline=INSTANT, outputs=2))
    _, body = submit_kie(rt, user)
    drain(rt, queues)
    job_id = body["job_id"]
    with db() as s:
        assets = s.execute(select(Asset).where(Asset.job_id == uuid.UUID(job_id))
                           .order_by(Asset.index)).scalars().all()
    assert [a.media_type for a in assets] == ["image/png", "image/png"]
    assert as_json(api.snapshot(rt, user, job_id)) == (200, {
        "id": job_id, "state": "completed",
        "outputs": [{"url": f"https://cdn.example/m/image/{job_id}/{i}.png",
                     "media_type": "image/png"} for i in range(2)],
        "error": None, "credits_actual": 40, "credits_returned": 0,
        "next_poll_at": None})


def test_snapshot_of_a_running_job(env, db, simulator) -> None:
    """Accepted upstream and not finished: running, nothing else yet."""
    rt, _, _ = env
    user = uuid.uuid4()
    fund(db, user)
    simulator.script_default(Script(timeline=RUNNING))
    _, body = submit_kie(rt, user)
    assert as_json(api.snapshot(rt, user, body["job_id"])) == (200, {
        "id": body["job_id"], "state": "running", "outputs": None, "error": None,
        "credits_actual": None, "credits_returned": None,
        "next_poll_at": None})


def _refund_breaks(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any, **kwargs: Any) -> bool:
        raise ConnectionError("ledger unavailable")

    monkeypatch.setattr(credits, "refund", broken)


def test_unsettled_rejection_then_a_read_settles_it_exactly_once(env, db, simulator,
                                                                monkeypatch) -> None:
    """A rejection whose refund fails stays failed + unsettled with next_poll_at; each read
    tries once; once the ledger is back a read settles it, and later reads add nothing."""
    rt, _, clock = env
    user = uuid.uuid4()
    fund(db, user)
    simulator.script_model(KIE_MODEL, Script(create="reject_auth"))
    _refund_breaks(monkeypatch)
    status, body = submit_kie(rt, user)  # at 10:03:30: refund fails, retry at 10:04:00
    assert status == 502
    job_id = body["error"]["job_id"]
    assert load(db, job_id).next_poll_at == datetime(2026, 12, 1, 10, 4, 0, tzinfo=UTC)

    clock.now = datetime(2026, 12, 1, 10, 4, 0, tzinfo=UTC)  # the read's attempt fails too
    unsettled = (200, {
        "id": job_id, "state": "failed", "outputs": None,
        "error": {"code": "UPSTREAM_SUBMISSION_FAILED", "message": TEXT,
                  "submissionOutcome": "rejected"},
        "credits_actual": None, "credits_returned": None,
        "next_poll_at": "2026-12-01T10:05:00Z"})
    assert as_json(api.snapshot(rt, user, job_id)) == unsettled
    assert balance(db, user) == 960

    monkeypatch.undo()  # the ledger is back
    calls: list[uuid.UUID] = []
    real_settle = lifecycle.settle

    def counting_settle(rt_: Runtime, jid: uuid.UUID) -> SettleOutcome:
        calls.append(jid)
        return real_settle(rt_, jid)

    monkeypatch.setattr(lifecycle, "settle", counting_settle)
    clock.advance(minutes=1)
    settled = (200, {**unsettled[1], "credits_actual": 0, "credits_returned": 40,
                     "next_poll_at": None})
    assert as_json(api.snapshot(rt, user, job_id)) == settled
    assert as_json(api.snapshot(rt, user, job_id)) == settled
    assert calls == [uuid.UUID(job_id)]
    with db() as s:
        refunds = s.execute(select(CreditTransaction).where(
            CreditTransaction.job_id == uuid.UUID(job_id),
            CreditTransaction.type == "REFUND")).scalars().all()
        assert [r.id for r in refunds] == [f"job-refund:{job_id}"]
        assert credits.audit(s, now=clock.now) == []
    assert balance(db, user) == 1000


def test_a_platform_rows_old_failure_is_not_settled_by_a_read(env, db, monkeypatch) -> None:
    """A platform's failed row (no next_poll_at) is reported, never refunded by a read."""
    rt, _, _ = env
    user = uuid.uuid4()
    fund(db, user)
    job_id = uuid.uuid4()
    with db.begin() as s:
        s.add(Job(id=job_id, user_id=user, job_type="image", status="failed",
                  error_message="worker crashed", created_at=T0))
        s.flush()
        credits.reserve(s, user, job_id, 30, now=T0)
    monkeypatch.setattr(lifecycle, "settle", lambda *a: pytest.fail("settled a platform row"))
    assert as_json(api.snapshot(rt, user, job_id)) == (200, {
        "id": str(job_id), "state": "failed", "outputs": None,
        "error": {"code": "INTERNAL", "message": "worker crashed"},
        "credits_actual": None, "credits_returned": None,
        "next_poll_at": None})
    assert balance(db, user) == 970


# ----------------------------------------------------------------------------- cancel (HTTP shapes)


def test_cancel_answers_200_with_the_snapshot(env, db) -> None:
    """A queued job cancels: 200 with its canceled snapshot, refunded."""
    rt, _, _ = env
    user = uuid.uuid4()
    fund(db, user)
    _, body = submit_kie(rt, user, inline=False)
    assert as_json(api.cancel(rt, user, body["job_id"])) == (200, {
        "id": body["job_id"], "state": "canceled", "outputs": None,
        "error": {"code": "CANCELED", "message": TEXT},
        "credits_actual": 0, "credits_returned": 40,
        "next_poll_at": None})
    assert balance(db, user) == 1000


def _conflict(code: str, job_id: str) -> dict[str, Any]:
    return {"error": {"type": "conflict_error", "code": code, "message": TEXT, "job_id": job_id}}


def test_cancel_of_an_uncertain_submission_is_409(env, db, simulator) -> None:
    """Uncertain: 409 SUBMISSION_RECONCILIATION_REQUIRED; the reservation stays."""
    rt, _, _ = env
    user = uuid.uuid4()
    fund(db, user)
    simulator.script_model(KIE_MODEL, Script(create="drop_after_accept"))
    _, body = submit_kie(rt, user)
    job_id = body["error"]["job_id"]
    assert as_json(api.cancel(rt, user, job_id)) == \
        (409, _conflict("SUBMISSION_RECONCILIATION_REQUIRED", job_id))
    job = load(db, job_id)
    assert (job.status, job.submission_state) == ("pending", "uncertain")
    assert balance(db, user) == 960


def test_cancel_while_submitting_is_409(env, db) -> None:
    """A worker holds the submission claim (the create is in progress): 409."""
    rt, _, clock = env
    user = uuid.uuid4()
    fund(db, user)
    _, body = submit_kie(rt, user, inline=False)
    job_id = uuid.UUID(body["job_id"])
    with db.begin() as s:
        assert jobstore.claim_create(s, job_id, "worker-token", clock.now, CREATE_CLAIM_LEASE)
    assert as_json(api.cancel(rt, user, job_id)) == \
        (409, _conflict("SUBMISSION_RECONCILIATION_REQUIRED", str(job_id)))
    assert load(db, str(job_id)).submission_state == "submitting"
    assert balance(db, user) == 960


def test_cancel_of_a_terminal_job_is_409_not_cancelable(env, db, simulator) -> None:
    """A completed job cannot be canceled: 409 JOB_NOT_CANCELABLE, nothing refunded."""
    rt, queues, _ = env
    user = uuid.uuid4()
    fund(db, user)
    simulator.script_default(Script(timeline=INSTANT))
    _, body = submit_kie(rt, user)
    drain(rt, queues)
    assert load(db, body["job_id"]).status == "completed"
    assert as_json(api.cancel(rt, user, body["job_id"])) == \
        (409, _conflict("JOB_NOT_CANCELABLE", body["job_id"]))
    assert balance(db, user) == 960


# ----------------------------------------------------------------------------- ledger & events


def test_credit_history_shows_only_the_callers_transactions(env, db) -> None:
    """Each user sees their own grant, usage and refund — never another user's."""
    rt, _, clock = env
    alice, bob = uuid.uuid4(), uuid.uuid4()
    with db.begin() as s:
        credits.grant(s, alice, "sub", 100, "grant-alice", now=T0)
        credits.grant(s, bob, "topup", 50, "grant-bob", now=T0)
    clock.advance(minutes=1)
    _, body = submit_kie(rt, alice, inline=False, credits_=40)
    job_id = body["job_id"]
    clock.advance(minutes=1)
    assert api.cancel(rt, alice, job_id)[0] == 200
    assert as_json(api.credit_history(rt, alice)) == (200, {"data": [
        {"id": "grant-alice", "type": "GRANT", "amount": 100, "job_id": None,
         "from_sub": 100, "from_topup": 0, "created_at": "2026-12-01T10:03:30Z"},
        {"id": f"job-usage:{job_id}", "type": "USAGE", "amount": 40, "job_id": job_id,
         "from_sub": 40, "from_topup": 0, "created_at": "2026-12-01T10:04:30Z"},
        {"id": f"job-refund:{job_id}", "type": "REFUND", "amount": 40, "job_id": job_id,
         "from_sub": 40, "from_topup": 0, "created_at": "2026-12-01T10:05:30Z"},
    ]})
    assert as_json(api.credit_history(rt, bob)) == (200, {"data": [
        {"id": "grant-bob", "type": "GRANT", "amount": 50, "job_id": None,
         "from_sub": 0, "from_topup": 50, "created_at": "2026-12-01T10:03:30Z"},
    ]})
    assert as_json(api.credit_history(rt, uuid.uuid4())) == (200, {"data": []})


def test_follow_yields_sse_fields_for_the_owner_only(env, db) -> None:
    """The owner's stream carries the job's events in order as SSE fields; others get nothing."""
    rt, _, _ = env
    user = uuid.uuid4()
    fund(db, user)
    _, body = submit_kie(rt, user, inline=False)
    api.cancel(rt, user, body["job_id"])
    frames = list(api.follow(rt, user, body["job_id"], sleep=lambda s: None))
    assert [f["event"] for f in frames] == ["queued", "canceled"]
    for frame in frames:
        assert set(frame) == {"id", "event", "data"}
        data = json.loads(frame["data"])
        assert (data["event_id"], data["job_id"], data["type"]) == \
            (frame["id"], body["job_id"], frame["event"])
    assert list(api.follow(rt, uuid.uuid4(), body["job_id"], sleep=lambda s: None)) == []
    assert list(api.follow(rt, user, "nope", sleep=lambda s: None)) == []


def test_events_after_is_one_step_of_follow_with_a_cursor(env, db) -> None:
    """``api.events_after`` (what an async server awaits between sleeps): the events after the
    cursor, the next cursor, and whether the stream is over; the same frames as ``follow``."""
    rt, _, _ = env
    user = uuid.uuid4()
    fund(db, user)
    _, body = submit_kie(rt, user, inline=False)
    frames, cursor, over = api.events_after(rt, user, body["job_id"])
    assert [f["event"] for f in frames] == ["queued"] and not over
    assert api.events_after(rt, user, body["job_id"], cursor) == ([], cursor, False)
    api.cancel(rt, user, body["job_id"])
    later, end, over = api.events_after(rt, user, body["job_id"], cursor)
    assert [f["event"] for f in later] == ["canceled"] and over and end > cursor
    assert frames + later == list(api.follow(rt, user, body["job_id"], sleep=lambda s: None))
    assert api.events_after(rt, uuid.uuid4(), body["job_id"]) == ([], 0, True)
    assert api.events_after(rt, user, "nope") == ([], 0, True)
