"""fal queue client: submit classification, COMPLETED decided by the result, media extraction.

What every provider family does alike (``run`` reporting the task before the first poll,
transport failures on create, read retries, ReadFailed) is ``tests/integration/
test_provider_contract.py``, once for every family; this file keeps what only this provider does.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from urllib.parse import parse_qs, urlsplit

import pytest
import responses
from hypothesis import given, settings, strategies as st

from reconcile import Settings
from reconcile.errors import (
    CreateRateLimited,
    CreateRejected,
    CreateUncertain,
    ErrorCode,
    InvalidParam,
    ReadFailed,
    ReconcileError,
)
from reconcile.providers import CreateRequest, PollStatus, fal
from reconcile.providers.fal import FalQueueClient

BASE = "https://queue.fal.test"
MODEL = "fal-ai/flux/dev"
APP = f"{BASE}/fal-ai/flux/requests"
RID = "764cabcf-b745-4b3e-ae38-1200304cf45b"
WEBHOOK = "https://platform.test/hooks/fal?job_id=job-42"
IMG1 = "https://v3.fal.media/files/a/1.jpg"
IMG2 = "https://v3.fal.media/files/a/2.jpg"


@pytest.fixture
def rsps() -> Iterator[responses.RequestsMock]:
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        yield mock


def make(sleeps: list[float] | None = None) -> FalQueueClient:
    cfg = Settings(fal_base_url=BASE, fal_api_key="fal-key")
    return FalQueueClient(cfg, sleep=sleeps.append if sleeps is not None else (lambda s: None))


def request(model: str = MODEL) -> CreateRequest:
    return CreateRequest(
        model=model, input={"prompt": "a fox"}, job_id="job-42", webhook_url=WEBHOOK
    )


def submitted() -> dict:
    return {
        "request_id": RID,
        "response_url": f"{APP}/{RID}",
        "status_url": f"{APP}/{RID}/status",
        "cancel_url": f"{APP}/{RID}/cancel",
        "queue_position": 0,
    }


def completed(rsps: responses.RequestsMock, **result: object) -> None:
    rsps.get(f"{APP}/{RID}/status", json={"status": "COMPLETED", "request_id": RID, "logs": []})
    rsps.get(f"{APP}/{RID}", **result)


# --- submit -----------------------------------------------------------------------------------


def test_submit_posts_input_and_plants_job_id_only_in_fal_webhook(rsps):
    """Submit posts the input as the body and the job id only inside the fal_webhook URL."""
    rsps.post(f"{BASE}/{MODEL}", json=submitted(), headers={"x-fal-request-id": "hdr"})
    created = make().create(request())
    call = rsps.calls[0]
    assert json.loads(call.request.body) == {"prompt": "a fox"}
    assert parse_qs(urlsplit(call.request.url).query)["fal_webhook"] == [WEBHOOK]
    assert call.request.headers["Authorization"] == "Key fal-key"
    assert created.task_id == RID  # kept exactly
    assert created.request_id == "hdr"


def test_submit_without_webhook_has_no_query(rsps):
    """Without a webhook URL no fal_webhook parameter is sent."""
    rsps.post(f"{BASE}/{MODEL}", json=submitted())
    make().create(CreateRequest(model=MODEL, input={}, job_id="j"))
    assert "fal_webhook" not in rsps.calls[0].request.url


@pytest.mark.parametrize("model", ["flux", "", "/fal-ai", "fal-ai/../admin"])
def test_unusable_model_is_invalid_param(rsps, model):
    """A model id without owner/app (or with dot segments) is refused before sending."""
    with pytest.raises(InvalidParam):
        make().create(request(model))
    assert len(rsps.calls) == 0


@pytest.mark.parametrize(
    ("status", "body", "headers", "error", "code"),
    [
        (
            422,
            {"detail": [{"loc": ["body", "prompt"], "msg": "field required", "type": "missing"}]},
            {},
            CreateRejected,
            ErrorCode.UPSTREAM_INVALID_INPUT,
        ),
        (
            400,
            {"detail": "bad", "error_type": "bad_request"},
            {},
            CreateRejected,
            ErrorCode.UPSTREAM_INVALID_INPUT,
        ),
        (
            401,
            {"detail": "No user found for Key ID and Secret"},
            {},
            CreateRejected,
            ErrorCode.UPSTREAM_SUBMISSION_FAILED,
        ),
        (
            403,
            {"detail": "User is locked. Reason: Exhausted balance."},
            {},
            CreateRejected,
            ErrorCode.UPSTREAM_SUBMISSION_FAILED,
        ),
        (
            404,
            {"detail": "Application 'nope' not found"},
            {},
            CreateRejected,
            ErrorCode.UPSTREAM_SUBMISSION_FAILED,
        ),
        (
            429,
            {"detail": "Too many requests"},
            {"Retry-After": "12"},
            CreateRateLimited,
            ErrorCode.UPSTREAM_RATE_LIMITED,
        ),
        (
            500,
            {"detail": "Internal", "error_type": "internal_error"},
            {},
            CreateUncertain,
            ErrorCode.UPSTREAM_SUBMISSION_UNCERTAIN,
        ),
        (504, "gateway timeout", {}, CreateUncertain, ErrorCode.UPSTREAM_SUBMISSION_UNCERTAIN),
        (
            499,
            {"detail": "client disconnected", "error_type": "client_disconnected"},
            {},
            CreateUncertain,
            ErrorCode.UPSTREAM_SUBMISSION_UNCERTAIN,
        ),
        (200, "<html></html>", {}, CreateUncertain, ErrorCode.UPSTREAM_SUBMISSION_UNCERTAIN),
        (200, {"status": "IN_QUEUE"}, {}, CreateUncertain, ErrorCode.UPSTREAM_SUBMISSION_UNCERTAIN),
    ],
)
def test_submit_classification_and_never_retried(rsps, status, body, headers, error, code):
    """Each submit answer maps to its outcome row after exactly one request."""
    kwargs = {"json": body} if isinstance(body, dict) else {"body": body}
    rsps.post(
        f"{BASE}/{MODEL}",
        status=status,
        headers={"x-fal-request-id": "fal-rq", **headers},
        **kwargs,
    )
    with pytest.raises(error) as info:
        make().create(request())
    assert info.value.code is code
    assert info.value.request_id == "fal-rq"
    assert info.value.body
    assert len(rsps.calls) == 1
    if status == 429:
        assert info.value.retry_after == 12.0


# --- poll -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        ("IN_QUEUE", PollStatus.RUNNING),
        ("IN_PROGRESS", PollStatus.RUNNING),
        ("PAUSED", PollStatus.UNKNOWN),
    ],
)
def test_status_without_subpath(rsps, state, expected):
    """Status is read under owner/app (subpath dropped); no result fetch while running."""
    rsps.get(f"{APP}/{RID}/status", status=202, json={"status": state, "queue_position": 3})
    result = make().poll(RID, model=MODEL)
    assert (result.status, result.raw_status) == (expected, state)
    assert len(rsps.calls) == 1


def test_status_404_is_not_found(rsps):
    """A 404 on the status read is NOT_FOUND."""
    rsps.get(f"{APP}/{RID}/status", status=404, json={"detail": "Request not found"})
    assert make().poll(RID, model=MODEL).status is PollStatus.NOT_FOUND


def test_poll_needs_the_model():
    """Without the model the status URL cannot be built: InvalidParam."""
    with pytest.raises(InvalidParam):
        make().poll(RID)


def test_completed_with_media_keeps_every_output(rsps):
    """COMPLETED + a result with several images is SUCCEEDED with every image in order."""
    completed(
        rsps,
        json={
            "images": [
                {"url": IMG1, "content_type": "image/jpeg", "width": 1},
                {"url": IMG2, "content_type": "image/png"},
            ],
            "seed": 7,
            "has_nsfw_concepts": [False, False],
        },
    )
    result = make().poll(RID, model=MODEL)
    assert result.status is PollStatus.SUCCEEDED
    assert [(o.url, o.media_type) for o in result.outputs] == [
        (IMG1, "image/jpeg"),
        (IMG2, "image/png"),
    ]


@pytest.mark.parametrize(
    ("payload", "urls"),
    [
        ({"image": {"url": IMG1}}, [IMG1]),
        (
            {"video": {"url": IMG1, "thumbnail": {"url": IMG2, "content_type": "image/jpeg"}}},
            [IMG1],
        ),
        ({"audio": {"url": IMG1}, "audio_file": {"url": IMG2}}, [IMG1, IMG2]),
        ({"output": {"mesh": {"url": IMG1, "content_type": "model/gltf"}}}, [IMG1]),
        ({"frames": [{"url": IMG1}, {"url": IMG2}]}, [IMG1, IMG2]),
        ({"meta": {"url": IMG1}, "timings": {"inference": 1.0}}, []),
    ],
)
def test_media_locations(payload, urls):
    """Media is found at image/video/audio.url, any url with content_type, and urls in lists."""
    assert [o.url for o in fal.extract_media(payload)] == urls


def test_completed_hiding_an_error_is_failed(rsps):
    """COMPLETED whose result fetch answers 422 is FAILED with fal's detail and type."""
    completed(
        rsps,
        status=422,
        json={
            "detail": [
                {
                    "loc": ["body", "image_url"],
                    "msg": "could not load",
                    "type": "no_media_generated",
                }
            ]
        },
    )
    result = make().poll(RID, model=MODEL)
    assert result.status is PollStatus.FAILED
    assert result.error_code == "no_media_generated"
    assert result.error_message == "body.image_url: could not load"


def test_completed_with_infra_error_type_is_failed(rsps):
    """A 504 result naming an error_type (fal already retried) is FAILED with that type."""
    completed(
        rsps,
        status=504,
        json={"detail": "Request timed out", "error_type": "request_timeout"},
        headers={"X-Fal-Error-Type": "request_timeout"},
    )
    result = make().poll(RID, model=MODEL)
    assert (result.status, result.error_code, result.error_message) == (
        PollStatus.FAILED,
        "request_timeout",
        "Request timed out",
    )


def test_completed_with_bare_gateway_5xx_is_a_read_failure(rsps):
    """A bare 503 on the result says nothing about the request: retried, then ReadFailed."""
    completed(rsps, status=503, body="upstream unavailable")
    with pytest.raises(ReadFailed):
        make().poll(RID, model=MODEL)


def test_completed_with_empty_result_is_success_without_outputs(rsps):
    """COMPLETED + a 2xx result without media is SUCCEEDED with no outputs (-> EMPTY_RESULT)."""
    completed(rsps, json={"images": [], "seed": 1})
    result = make().poll(RID, model=MODEL)
    assert (result.status, result.outputs) == (PollStatus.SUCCEEDED, ())


def test_wrapped_result_is_success_with_media(rsps):
    """A {data, requestId} wrapped result is read as success with its media (README, Design notes: The SDK result wrapper)."""
    completed(
        rsps,
        json={"data": {"video": {"url": IMG1, "content_type": "video/mp4"}}, "requestId": "w-9"},
    )
    result = make().poll(RID, model=MODEL)
    assert result.status is PollStatus.SUCCEEDED
    assert [o.url for o in result.outputs] == [IMG1]
    assert result.request_id == "w-9"


def test_cancel_puts_under_the_app(rsps):
    """cancel PUTs .../requests/{id}/cancel under owner/app and is True on 2xx only."""
    rsps.put(f"{APP}/{RID}/cancel", status=202, json={"status": "CANCELLATION_REQUESTED"})
    rsps.put(f"{APP}/done/cancel", status=400, json={"status": "ALREADY_COMPLETED"})
    assert make().cancel(RID, model=MODEL) is True
    assert make().cancel("done", model=MODEL) is False


def test_find_created_is_none():
    """fal has no listing: the evidence search finds nothing."""
    assert make().find_created("job-42", None) is None  # type: ignore[arg-type]


# --- robustness -------------------------------------------------------------------------------

KEYS = st.sampled_from(
    [
        "request_id",
        "status",
        "images",
        "image",
        "video",
        "audio",
        "url",
        "content_type",
        "detail",
        "error",
        "error_type",
        "loc",
        "msg",
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
    | st.sampled_from(["COMPLETED", "IN_QUEUE", IMG1]),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(KEYS, children, max_size=6),
    max_leaves=30,
)


@settings(deadline=None, max_examples=300)
@given(
    status=st.sampled_from([200, 202, 400, 404, 422, 429, 500, 504]) | st.integers(100, 599),
    payload=JSON,
    raw=st.booleans(),
    junk=st.binary(max_size=30),
)
def test_parse_functions_only_raise_library_errors(status, payload, raw, junk):
    """Arbitrary JSON (or bytes) fed to every parse function escapes only as a ReconcileError."""
    body = junk if raw else json.dumps(payload).encode()
    headers = {
        "x-fal-request-id": "r",
        "Retry-After": "x",
        "X-Fal-Error-Type": "runner_server_error",
    }
    for parse in (fal.parse_create, fal.parse_status, fal.parse_result):
        try:
            parse(status, body, headers)
        except ReconcileError:
            pass
    fal.extract_media(payload)
