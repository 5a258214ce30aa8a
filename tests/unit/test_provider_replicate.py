"""Replicate client: create classification, status mapping, outputs, evidence search.

What every provider family does alike (``run`` reporting the task before the first poll,
transport failures on create, read retries, ReadFailed) is ``tests/integration/
test_provider_contract.py``, once for every family; this file keeps what only this provider does.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from urllib.parse import parse_qs, urlsplit

import pytest
import responses
from hypothesis import given, settings, strategies as st
from responses import matchers

from reconcile import Settings
from reconcile.errors import (
    CreateRateLimited,
    CreateRejected,
    CreateUncertain,
    ErrorCode,
    InvalidParam,
    ReconcileError,
)
from reconcile.providers import CreateRequest, PollStatus, replicate
from reconcile.providers.replicate import ReplicateClient

BASE = "https://api.replicate.test"
VERSION = "5c7d5dc6dd8bf75c1acaa8565735e7986bc5b66206b55cca93cb72c9bf15ccaa"
WEBHOOK = "https://platform.test/hooks/replicate?job_id=job-123"


@pytest.fixture
def rsps() -> Iterator[responses.RequestsMock]:
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        yield mock


def make(resource: str = "predictions", sleeps: list[float] | None = None) -> ReplicateClient:
    cfg = Settings(replicate_base_url=BASE, replicate_api_key="r8_test")
    record = sleeps.append if sleeps is not None else (lambda s: None)
    return ReplicateClient(cfg, resource=resource, sleep=record)  # type: ignore[arg-type]


def prediction(status: str, **extra: object) -> dict:
    return {
        "id": "ufawqhfynnddngldkgtslldrkq",
        "status": status,
        "webhook": WEBHOOK,
        "created_at": "2026-01-01T10:00:00.000Z",
        **extra,
    }


def request(model: str = f"owner/name:{VERSION}", **extra: object) -> CreateRequest:
    return CreateRequest(
        model=model, input={"prompt": "a cat"}, job_id="job-123", webhook_url=WEBHOOK, extra=extra
    )


# --- create -----------------------------------------------------------------------------------


def test_create_with_version_posts_predictions_and_plants_job_id_only_in_webhook(rsps):
    """A versioned model is created via /v1/predictions; the job id is only in the webhook URL."""
    rsps.post(
        f"{BASE}/v1/predictions",
        status=201,
        json=prediction("starting"),
        headers={"x-request-id": "req-AbC"},
    )
    created = make().create(request())
    sent = json.loads(rsps.calls[0].request.body)
    assert sent == {
        "version": VERSION,
        "input": {"prompt": "a cat"},
        "webhook": WEBHOOK,
        "webhook_events_filter": ["completed"],
    }
    assert "job-123" not in json.dumps(sent["input"])
    assert parse_qs(urlsplit(sent["webhook"]).query)["job_id"] == ["job-123"]
    assert rsps.calls[0].request.headers["Authorization"] == "Bearer r8_test"
    assert created.task_id == "ufawqhfynnddngldkgtslldrkq"
    assert created.request_id == "req-AbC"


def test_create_official_model_uses_models_path(rsps):
    """A model without :version is created via /v1/models/{owner}/{name}/predictions."""
    rsps.post(
        f"{BASE}/v1/models/black-forest-labs/flux-schnell/predictions",
        status=201,
        json=prediction("starting"),
    )
    make().create(request("black-forest-labs/flux-schnell"))
    assert "version" not in json.loads(rsps.calls[0].request.body)


def test_create_deployment_and_cancel_after_header(rsps):
    """deployment:owner/name posts to the deployment and forwards Cancel-After."""
    rsps.post(
        f"{BASE}/v1/deployments/acme/sdxl/predictions", status=201, json=prediction("starting")
    )
    make().create(request("deployment:acme/sdxl", cancel_after="30m"))
    assert rsps.calls[0].request.headers["Cancel-After"] == "30m"


def test_training_create_sends_destination(rsps):
    """A training posts to the version's trainings path with extra['destination']."""
    rsps.post(
        f"{BASE}/v1/models/owner/name/versions/{VERSION}/trainings",
        status=201,
        json=prediction("starting"),
    )
    make("trainings").create(request(destination="me/my-lora"))
    assert json.loads(rsps.calls[0].request.body)["destination"] == "me/my-lora"


@pytest.mark.parametrize(
    ("model", "resource", "extra"),
    [
        ("no-slash", "predictions", {}),
        ("a/b/c", "predictions", {}),
        ("owner/name", "trainings", {"destination": "me/x"}),
        (f"owner/name:{VERSION}", "trainings", {}),
    ],
)
def test_unusable_model_or_training_is_invalid_param_and_nothing_is_sent(
    rsps, model, resource, extra
):
    """A model string or training we cannot build is refused before any request."""
    with pytest.raises(InvalidParam):
        make(resource).create(request(model, **extra))
    assert len(rsps.calls) == 0


@pytest.mark.parametrize(
    ("status", "body", "headers", "error", "code"),
    [
        (
            422,
            {
                "title": "Input validation failed",
                "status": 422,
                "detail": "- input.seed: Invalid type",
                "invalid_fields": [{"type": "invalid_type", "field": "input.seed"}],
            },
            {},
            CreateRejected,
            ErrorCode.UPSTREAM_INVALID_INPUT,
        ),
        (
            400,
            {"title": "Bad request", "detail": "bad"},
            {},
            CreateRejected,
            ErrorCode.UPSTREAM_INVALID_INPUT,
        ),
        (
            401,
            {"title": "Unauthenticated", "detail": "Invalid token"},
            {},
            CreateRejected,
            ErrorCode.UPSTREAM_SUBMISSION_FAILED,
        ),
        (
            402,
            {"title": "Payment required", "detail": "no credit"},
            {},
            CreateRejected,
            ErrorCode.UPSTREAM_SUBMISSION_FAILED,
        ),
        (403, {"detail": "forbidden"}, {}, CreateRejected, ErrorCode.UPSTREAM_SUBMISSION_FAILED),
        (
            404,
            {"title": "Not found", "detail": "model not found"},
            {},
            CreateRejected,
            ErrorCode.UPSTREAM_SUBMISSION_FAILED,
        ),
        (
            429,
            {"detail": "Request was throttled."},
            {"Retry-After": "7"},
            CreateRateLimited,
            ErrorCode.UPSTREAM_RATE_LIMITED,
        ),
        (500, {"detail": "Internal"}, {}, CreateUncertain, ErrorCode.UPSTREAM_SUBMISSION_UNCERTAIN),
        (
            502,
            "<html>bad gateway</html>",
            {},
            CreateUncertain,
            ErrorCode.UPSTREAM_SUBMISSION_UNCERTAIN,
        ),
        (
            404,
            "<html>not here</html>",
            {},
            CreateUncertain,
            ErrorCode.UPSTREAM_SUBMISSION_UNCERTAIN,
        ),
        (201, "<html>oops</html>", {}, CreateUncertain, ErrorCode.UPSTREAM_SUBMISSION_UNCERTAIN),
        (201, {"status": "starting"}, {}, CreateUncertain, ErrorCode.UPSTREAM_SUBMISSION_UNCERTAIN),
    ],
)
def test_create_classification_and_never_retried(rsps, status, body, headers, error, code):
    """Each create answer maps to the outcome table's row, after exactly one request."""
    kwargs = {"json": body} if isinstance(body, dict) else {"body": body}
    rsps.post(
        f"{BASE}/v1/predictions",
        status=status,
        headers={"x-request-id": "rq-1", **headers},
        **kwargs,
    )
    with pytest.raises(error) as info:
        make().create(request())
    assert info.value.code is code
    assert info.value.status == status
    assert info.value.request_id == "rq-1"
    assert info.value.body  # the raw answer is kept as evidence
    assert len(rsps.calls) == 1
    if status == 429:
        assert info.value.retry_after == 7.0


def test_429_without_header_reads_the_reset_hint(rsps):
    """Without Retry-After, Replicate's "resets in ~30s" sets the retry delay."""
    rsps.post(
        f"{BASE}/v1/predictions",
        status=429,
        json={"detail": "Request was throttled. Your rate limit resets in ~30s."},
    )
    with pytest.raises(CreateRateLimited) as info:
        make().create(request())
    assert info.value.retry_after == 30.0


# --- poll -------------------------------------------------------------------------------------


URL1 = "https://replicate.delivery/a/out-0.png"
URL2 = "https://replicate.delivery/a/out-1.png"


@pytest.mark.parametrize(
    ("body", "status", "urls"),
    [
        (prediction("starting"), PollStatus.RUNNING, []),
        (prediction("processing"), PollStatus.RUNNING, []),
        (prediction("succeeded", output=URL1), PollStatus.SUCCEEDED, [URL1]),
        (prediction("succeeded", output=[URL1, URL2]), PollStatus.SUCCEEDED, [URL1, URL2]),
        (
            prediction("succeeded", output={"image": URL1, "extra": {"mask": [URL2]}, "seed": 4}),
            PollStatus.SUCCEEDED,
            [URL1, URL2],
        ),
        (prediction("canceled", output=[URL1]), PollStatus.CANCELED, []),
        (prediction("aborted"), PollStatus.CANCELED, []),
    ],
)
def test_poll_maps_status_and_keeps_every_output_in_order(rsps, body, status, urls):
    """Statuses map to ours; a string, list or nested object output keeps every URL in order."""
    rsps.get(f"{BASE}/v1/predictions/ufawqhfynnddngldkgtslldrkq", json=body)
    result = make().poll("ufawqhfynnddngldkgtslldrkq")
    assert result.status is status
    assert [o.url for o in result.outputs] == urls
    assert result.raw_status == body["status"]
    assert result.planted_job_id == "job-123"


def test_failed_prediction_carries_error_text(rsps):
    """A failed prediction is FAILED with Replicate's error text."""
    rsps.get(f"{BASE}/v1/predictions/p1", json=prediction("failed", error="CUDA out of memory"))
    result = make().poll("p1")
    assert (result.status, result.error_message) == (PollStatus.FAILED, "CUDA out of memory")


def test_unknown_status_and_not_found(rsps):
    """An unknown status is UNKNOWN with the raw value; a 404 is NOT_FOUND."""
    rsps.get(f"{BASE}/v1/predictions/p1", json=prediction("booting"))
    rsps.get(f"{BASE}/v1/predictions/gone", status=404, json={"detail": "Not found."})
    unknown = make().poll("p1")
    assert (unknown.status, unknown.raw_status) == (PollStatus.UNKNOWN, "booting")
    assert make().poll("gone").status is PollStatus.NOT_FOUND


def test_text_output_is_kept_not_read_as_empty(rsps):
    """An LLM's token list is joined into one text output; a null output has none."""
    rsps.get(f"{BASE}/v1/predictions/llm", json=prediction("succeeded", output=["Hel", "lo"]))
    rsps.get(f"{BASE}/v1/predictions/none", json=prediction("succeeded", output=None))
    assert [o.text for o in make().poll("llm").outputs] == ["Hello"]
    assert make().poll("none").outputs == ()


def test_sdk_wrapped_success_is_read_with_its_media(rsps):
    """A {data, requestId} wrapper is unwrapped: success with media and the wrapper's request id."""
    rsps.get(
        f"{BASE}/v1/predictions/p1",
        json={"data": prediction("succeeded", output=[URL1]), "requestId": "wrap-1"},
    )
    result = make().poll("p1")
    assert result.status is PollStatus.SUCCEEDED
    assert [o.url for o in result.outputs] == [URL1]
    assert result.request_id == "wrap-1"


def test_training_poll_reads_trainings_and_weights(rsps):
    """A training is read from /v1/trainings and its weights URL is an output."""
    weights = "https://replicate.delivery/w/trained.tar"
    rsps.get(
        f"{BASE}/v1/trainings/t1",
        json=prediction("succeeded", output={"version": "me/x:abc", "weights": weights}),
    )
    assert [o.url for o in make("trainings").poll("t1").outputs] == [weights]


def test_cancel_posts_and_reports_2xx(rsps):
    """cancel POSTs .../cancel and is True only on 2xx."""
    rsps.post(f"{BASE}/v1/predictions/p1/cancel", json=prediction("canceled"))
    rsps.post(f"{BASE}/v1/predictions/p2/cancel", status=404, json={"detail": "Not found."})
    assert make().cancel("p1") is True
    assert make().cancel("p2") is False


# --- find_created -----------------------------------------------------------------------------


def listed(pid: str, job: str, created: str = "2026-01-01T10:05:00Z") -> dict:
    return {
        "id": pid,
        "status": "processing",
        "created_at": created,
        "webhook": f"https://platform.test/hooks/replicate?job_id={job}",
    }


def test_find_created_matches_planted_job_id_across_pages(rsps):
    """The evidence search follows `next` and matches the job id planted in `webhook`."""
    since = datetime(2026, 1, 1, 10, 0, tzinfo=UTC)
    page2 = f"{BASE}/v1/predictions?cursor=abc"
    rsps.get(
        f"{BASE}/v1/predictions",
        match=[matchers.query_param_matcher({"created_after": "2026-01-01T10:00:00Z"})],
        json={
            "next": page2,
            "previous": None,
            "results": [listed("x1", "other"), {"garbage": True}, listed("x2", "job-9")],
        },
    )
    rsps.get(page2, json={"next": None, "previous": None, "results": [listed("mine", "job-123")]})
    found = make().find_created("job-123", since)
    assert found is not None and found.task_id == "mine"
    assert found.planted_job_id == "job-123"
    assert found.created_at == datetime(2026, 1, 1, 10, 5, tzinfo=UTC)


def test_find_created_returns_none_and_never_follows_a_foreign_next(rsps):
    """No match is None, and a `next` on another host is not followed (the token stays home)."""
    rsps.get(
        f"{BASE}/v1/predictions",
        json={
            "next": "https://evil.test/v1/predictions?cursor=x",
            "results": [listed("x1", "other")],
        },
    )
    assert make().find_created("job-123", datetime(2026, 1, 1, tzinfo=UTC)) is None
    assert len(rsps.calls) == 1


def test_find_created_is_bounded(rsps):
    """An endless chain of pages stops at max_pages."""
    rsps.get(
        f"{BASE}/v1/predictions", json={"next": f"{BASE}/v1/predictions?cursor=n", "results": []}
    )
    assert make().find_created("job-123", datetime(2026, 1, 1)) is None
    assert len(rsps.calls) == replicate.MAX_LIST_PAGES


# --- the kinds' factories ---------------------------------------------------------------------


def test_factories_build_clients_with_the_kind_names():
    """The registry's factories build prediction and training clients."""
    cfg = Settings(replicate_api_key="k")
    assert replicate.prediction_client(cfg, None).name == "replicate-prediction"
    assert replicate.training_client(cfg, None).resource == "trainings"


# --- robustness -------------------------------------------------------------------------------

KEYS = st.sampled_from(
    [
        "id",
        "status",
        "output",
        "error",
        "webhook",
        "created_at",
        "results",
        "next",
        "detail",
        "title",
        "type",
        "data",
        "requestId",
    ]
) | st.text(max_size=5)
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.sampled_from(["succeeded", "failed", "starting", URL1, "2026-01-01T00:00:00Z"]),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(KEYS, children, max_size=6),
    max_leaves=30,
)
STATUSES = st.sampled_from([200, 201, 400, 401, 404, 422, 429, 500, 503]) | st.integers(100, 599)


@settings(deadline=None, max_examples=300)
@given(status=STATUSES, payload=JSON, raw=st.booleans(), junk=st.binary(max_size=30))
def test_parse_functions_only_raise_library_errors(status, payload, raw, junk):
    """Arbitrary JSON (or bytes) fed to every parse function escapes only as a ReconcileError."""
    body = junk if raw else json.dumps(payload).encode()
    headers = {"Retry-After": "soon", "x-request-id": "r"}
    for parse in (replicate.parse_create, replicate.parse_status, replicate.parse_list):
        try:
            parse(status, body, headers)
        except ReconcileError:
            pass
    replicate.extract_outputs(payload)
