"""The library's parsers on shapes the library's authors did not write (issue 15).

Every fixture is written from a provider's documented example or its official SDK's response
model, and names that source in a comment. Where the example was adapted (an id shortened, a
status varied), the comment says so.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator

import pytest
import responses

from reconcile import Settings
from reconcile.errors import ErrorCode, ReadFailed, SyncCallFailed
from reconcile.providers import (
    Expect,
    OutputSpec,
    PollStatus,
    anthropic,
    declare_output,
    declared_output,
    elevenlabs,
    fal,
    replicate,
)

# --- Replicate ---------------------------------------------------------------------------------

# replicate.com/docs/reference/http#predictions.get — the documented example object (a
# hello-world prediction whose output is a string), verbatim apart from the ``stream`` URL.
PREDICTION = {
    "id": "gm3qorzdhgbfurvjtvhg6dckhu",
    "model": "replicate/hello-world",
    "version": "5c7d5dc6dd8bf75c1acaa8565735e7986bc5b66206b55cca93cb72c9bf15ccaa",
    "input": {"text": "Alice"},
    "logs": "",
    "output": "hello Alice",
    "data_removed": False,
    "error": None,
    "status": "succeeded",
    "created_at": "2023-09-08T16:19:34.765994Z",
    "started_at": "2023-09-08T16:19:34.779176Z",
    "completed_at": "2023-09-08T16:19:34.791859Z",
    "metrics": {"predict_time": 0.012683},
    "urls": {
        "web": "https://replicate.com/p/gm3qorzdhgbfurvjtvhg6dckhu",
        "get": "https://api.replicate.com/v1/predictions/gm3qorzdhgbfurvjtvhg6dckhu",
        "cancel": "https://api.replicate.com/v1/predictions/gm3qorzdhgbfurvjtvhg6dckhu/cancel",
    },
}

# replicate.com/docs/reference/http#trainings.get — the documented training object (status
# succeeded, output {version, weights}); logs shortened.
TRAINING = {
    "completed_at": "2023-09-08T16:41:19.826523Z",
    "created_at": "2023-09-08T16:32:57.018467Z",
    "error": None,
    "id": "zz4ibbonubfz7carwiefibzgga",
    "input": {"input_images": "https://example.com/my-input-images.zip", "max_train_steps": 1000},
    "logs": "Fetching input images...\nTraining...",
    "metrics": {"predict_time": 502.713876},
    "output": {
        "version": "example/my-model:6a4d9a0c",
        "weights": "https://replicate.delivery/pbxt/XXXX/weights.tar",
    },
    "started_at": "2023-09-08T16:32:57.112647Z",
    "status": "succeeded",
    "urls": {
        "get": "https://api.replicate.com/v1/trainings/zz4ibbonubfz7carwiefibzgga",
        "cancel": "https://api.replicate.com/v1/trainings/zz4ibbonubfz7carwiefibzgga/cancel",
    },
    "model": "stability-ai/sdxl",
    "version": "da77bc59ee60423279fd632efb4795ab731d9e3ca9705ef3341091fb989b7eaf",
}


def test_replicate_documented_prediction_keeps_its_text_output() -> None:
    """The docs' hello-world prediction: SUCCEEDED with its string output kept as text, and no
    planted job id — the documented object has no ``webhook`` field to read one from."""
    result = replicate.parse_status(200, json.dumps(PREDICTION))
    assert result.status is PollStatus.SUCCEEDED
    assert [(o.text, o.media_type) for o in result.outputs] == [("hello Alice", "text/plain")]
    assert result.planted_job_id is None
    assert "webhook" not in PREDICTION


def test_replicate_documented_training_has_its_weights() -> None:
    """The docs' training: the weights URL is the output; metrics and logs ride in raw."""
    result = replicate.parse_status(200, json.dumps(TRAINING))
    assert result.status is PollStatus.SUCCEEDED
    assert [o.url for o in result.outputs] == ["https://replicate.delivery/pbxt/XXXX/weights.tar"]
    assert result.raw and result.raw["metrics"] == {"predict_time": 502.713876}


def test_replicate_declared_media_model_with_text_only_is_empty() -> None:
    """A model declared MEDIA that answers only text has no declared output (EMPTY_RESULT)."""
    spec = OutputSpec(Expect.MEDIA)
    assert replicate.parse_status(200, json.dumps(PREDICTION), spec=spec).outputs == ()


def test_replicate_data_uri_output_is_media_in_hand() -> None:
    """A ``data:`` URI output is decoded into bytes rather than read as text."""
    uri = "data:image/png;base64," + base64.b64encode(b"\x89PNG").decode()
    result = replicate.parse_status(200, json.dumps({**PREDICTION, "output": [uri]}))
    assert [(o.data, o.media_type) for o in result.outputs] == [(b"\x89PNG", "image/png")]


# --- fal ---------------------------------------------------------------------------------------

# fal_client.client._BaseRequestHandle._parse_status reads COMPLETED as
# Completed(logs, metrics, error=data.get("error"), error_type=data.get("error_type"));
# the error types are fal.ai/docs/documentation/model-apis/request-errors.
FAL_COMPLETED_WITH_ERROR = {
    "status": "COMPLETED",
    "logs": None,
    "metrics": {},
    "error": "Runner disconnected unexpectedly",
    "error_type": "runner_disconnected",
    "request_id": "764cabcf-b745-4b3e-ae38-1200304cf45b",
}


@pytest.mark.parametrize("error_type", ["runner_disconnected", "request_timeout"])
def test_fal_completed_with_error_type_is_failed(error_type: str) -> None:
    """COMPLETED carrying error/error_type is the failure itself, with fal's error."""
    body = {**FAL_COMPLETED_WITH_ERROR, "error_type": error_type}
    result = fal.parse_status(200, json.dumps(body))
    assert result is not None and result.status is PollStatus.FAILED
    assert (result.error_code, result.error_message) == (error_type, body["error"])


@pytest.fixture
def rsps() -> Iterator[responses.RequestsMock]:
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        yield mock


FAL = "https://queue.fal.test"


def _fal() -> fal.FalQueueClient:
    return fal.FalQueueClient(Settings(fal_base_url=FAL, fal_api_key="k"), sleep=lambda s: None)


def test_fal_completed_with_error_is_not_read_again(rsps: responses.RequestsMock) -> None:
    """The issue's case: the status says COMPLETED + runner_disconnected and the result read
    would answer a bare 502. The job fails with fal's error instead of timing out."""
    base = f"{FAL}/fal-ai/flux/requests/rid-1"
    rsps.get(f"{base}/status", json=FAL_COMPLETED_WITH_ERROR)
    rsps.get(base, status=502, body="Bad Gateway")
    result = _fal().poll("rid-1", model="fal-ai/flux/dev")
    assert result.status is PollStatus.FAILED and result.error_code == "runner_disconnected"


def test_fal_submit_urls_that_differ_from_the_built_ones_are_logged(
        rsps: responses.RequestsMock, caplog: pytest.LogCaptureFixture) -> None:
    """fal says to use the returned URLs; the poll can only build them (the job row keeps the
    task id and model), so a submit answer whose URLs differ is logged at once."""
    from reconcile.providers import CreateRequest

    other = f"{FAL}/fal-ai/flux-v2/requests/rid-3"
    rsps.post(f"{FAL}/fal-ai/flux/dev", json={
        "request_id": "rid-3", "response_url": other, "status_url": f"{other}/status",
        "cancel_url": f"{other}/cancel"})
    with caplog.at_level("WARNING", logger="reconcile.providers.fal"):
        created = _fal().create(CreateRequest(model="fal-ai/flux/dev", input={"prompt": "x"},
                                              job_id="job-3"))
    assert created.task_id == "rid-3"
    assert [r.getMessage().split()[0] for r in caplog.records] == ["fal_urls_differ"] * 3


@pytest.mark.parametrize(("model", "app"), [
    ("workflows/fal-ai/my-flow", "workflows/fal-ai/my-flow"),
    ("comfy/acme/upscale/v2", "comfy/acme/upscale"),
    ("fal-ai/flux/dev", "fal-ai/flux"),
])
def test_fal_namespaced_endpoints_keep_three_segments(model: str, app: str) -> None:
    """``workflows`` and ``comfy`` are namespaces (fal_client's APP_NAMESPACES / AppId)."""
    assert fal.app_path(model) == app


def test_fal_namespaced_poll_uses_the_namespaced_urls(rsps: responses.RequestsMock) -> None:
    """A workflow's status and result are read under ``workflows/owner/app/requests/…``."""
    base = f"{FAL}/workflows/fal-ai/my-flow/requests/rid-2"
    rsps.get(f"{base}/status", json={"status": "COMPLETED", "logs": None, "metrics": {}})
    rsps.get(base, json={"images": [{"url": "https://v3.fal.media/x.png",
                                     "content_type": "image/png"}]})
    result = _fal().poll("rid-2", model="workflows/fal-ai/my-flow")
    assert result.status is PollStatus.SUCCEEDED and len(result.outputs) == 1


# fal.ai/models/fal-ai/whisper/api — the documented output: {"text", "chunks": [{timestamp, text}]}
WHISPER = {"text": "Hello, world.", "chunks": [{"timestamp": [0.0, 1.5], "text": "Hello, world."}]}


def test_fal_text_endpoint_output_is_kept() -> None:
    """fal-ai/whisper is declared TEXT: its ``text`` is the output, not an empty result."""
    spec = declared_output("fal", "fal-ai/whisper")
    result = fal.parse_result(200, json.dumps(WHISPER), spec=spec)
    assert [(o.text, o.media_type) for o in result.outputs] == [("Hello, world.", "text/plain")]


def test_fal_declared_text_missing_is_empty() -> None:
    """The declared field missing (or empty) is still UPSTREAM_EMPTY_RESULT's empty outputs."""
    spec = declared_output("fal", "fal-ai/whisper")
    assert fal.parse_result(200, json.dumps({"text": "", "chunks": []}), spec=spec).outputs == ()


def test_fal_media_endpoint_with_no_images_is_empty() -> None:
    """``{"images": [], "seed": 1}`` from a media endpoint is empty (README, Design notes: Text and JSON outputs)."""
    spec = declared_output("fal", "fal-ai/flux/dev")
    assert spec.expects is Expect.MEDIA
    assert fal.parse_result(200, json.dumps({"images": [], "seed": 1}), spec=spec).outputs == ()


def test_fal_data_uri_media_is_decoded() -> None:
    """``sync_mode`` answers the file as a data URI: decoded bytes, not "no media"."""
    uri = "data:image/png;base64," + base64.b64encode(b"\x89PNG-bytes").decode()
    body = {"images": [{"url": uri, "content_type": "image/png"}], "seed": 7}
    result = fal.parse_result(200, json.dumps(body))
    assert [(o.data, o.media_type) for o in result.outputs] == [(b"\x89PNG-bytes", "image/png")]


def test_a_platform_declares_a_json_endpoint() -> None:
    """A platform's own endpoint declared JSON keeps the whole document as one output."""
    declare_output("fal", "acme/captioner", OutputSpec(Expect.JSON))
    spec = declared_output("fal", "acme/captioner/v2")
    result = fal.parse_result(200, json.dumps({"caption": "a cat", "score": 0.9}), spec=spec)
    assert [json.loads(o.text or "") for o in result.outputs] == [{"caption": "a cat", "score": 0.9}]


# --- Anthropic ---------------------------------------------------------------------------------

# docs.anthropic.com/en/api/errors — HTTP 529 overloaded_error, the documented body shape
# {"type": "error", "error": {"type", "message"}, "request_id"}.
OVERLOADED = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"},
              "request_id": "req_011CSHoEeqs5C35K2UUqR7Fy"}


def test_anthropic_overloaded_529_fails_with_its_type() -> None:
    """529 overloaded_error fails the sync call with the provider's type and request id."""
    with pytest.raises(SyncCallFailed) as caught:
        anthropic.parse_message(529, json.dumps(OVERLOADED), {"request-id": OVERLOADED["request_id"]})
    assert caught.value.provider_code == "overloaded_error"
    assert caught.value.request_id == OVERLOADED["request_id"]
    assert caught.value.code == ErrorCode.UPSTREAM_FAILED  # 5xx-class: the request may retry


# --- ElevenLabs --------------------------------------------------------------------------------

# elevenlabs SDK: DubbingMetadataResponse (types/dubbing_metadata_response.py) — dubbing_id, name,
# status, source_language, target_languages, editable, created_at, media_metadata, error.
DUBBING = {
    "dubbing_id": "21m00Tcm4TlvDq8ikWAM",
    "name": "reconcile-job:job-77",
    "status": "dubbed",
    "source_language": "en",
    "target_languages": ["es", "fr"],
    "editable": False,
    "created_at": "2025-05-01T10:00:00Z",
    "media_metadata": {"content_type": "video/mp4", "duration": 12.5},
    "error": None,
}

# elevenlabs SDK: SpeechToTextChunkResponseModel (types/speech_to_text_chunk_response_model.py) —
# language_code, language_probability, text, words[{text, start, end, type, speaker_id}],
# transcription_id.
TRANSCRIPT = {
    "language_code": "en",
    "language_probability": 0.98,
    "text": "Hello world!",
    "words": [{"text": "Hello", "start": 0.0, "end": 0.5, "type": "word", "speaker_id": "s_0"},
              {"text": " ", "start": 0.5, "end": 0.5, "type": "spacing", "speaker_id": "s_0"},
              {"text": "world!", "start": 0.5, "end": 1.2, "type": "word", "speaker_id": "s_0"}],
    "transcription_id": "tr_9f2c",
}


def test_elevenlabs_dubbing_object_gives_one_download_per_language() -> None:
    """A dubbed project: one audio URL per target language, the planted job id from its name."""
    result = elevenlabs.parse_dubbing(200, json.dumps(DUBBING), base_url="https://api.el.test")
    assert result.status is PollStatus.SUCCEEDED
    assert [o.url for o in result.outputs] == [
        "https://api.el.test/v1/dubbing/21m00Tcm4TlvDq8ikWAM/audio/es",
        "https://api.el.test/v1/dubbing/21m00Tcm4TlvDq8ikWAM/audio/fr"]
    assert result.planted_job_id == "job-77"


def test_elevenlabs_transcript_object_is_one_json_output() -> None:
    """The transcript is kept whole, as one JSON output."""
    result = elevenlabs.parse_transcript(200, json.dumps(TRANSCRIPT))
    assert result.status is PollStatus.SUCCEEDED
    assert [json.loads(o.text or "") for o in result.outputs] == [TRANSCRIPT]


def test_elevenlabs_failed_dubbing_reports_its_error() -> None:
    """A failed dubbing is FAILED with its error string."""
    failed = {**DUBBING, "status": "failed", "error": "Audio too short"}
    result = elevenlabs.parse_dubbing(200, json.dumps(failed))
    assert (result.status, result.error_message) == (PollStatus.FAILED, "Audio too short")


def test_parsers_refuse_what_they_cannot_read() -> None:
    """A 5xx during a read is a retryable read failure for every provider here."""
    for parse in (replicate.parse_status, elevenlabs.parse_dubbing):
        with pytest.raises(ReadFailed):
            parse(503, "Service Unavailable")
