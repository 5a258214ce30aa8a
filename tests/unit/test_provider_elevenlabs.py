"""ElevenLabs clients: dubbing and webhook STT (async), the sync endpoints, error mapping.

What every provider family does alike (``run`` reporting the task before the first poll,
transport failures on create, read retries, ReadFailed) is ``tests/integration/
test_provider_contract.py``, once for every family; this file keeps what only this provider does.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator

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
    MediaExpired,
    MediaFetchFailed,
    ReconcileError,
    SyncCallFailed,
)
from reconcile.providers import CreateRequest, PollStatus, elevenlabs
from reconcile.providers.elevenlabs import ElevenLabsAsyncClient, ElevenLabsSyncClient

BASE = "https://api.elevenlabs.test"
CFG = Settings(elevenlabs_base_url=BASE, elevenlabs_api_key="xi-test")


@pytest.fixture
def rsps() -> Iterator[responses.RequestsMock]:
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        yield mock


def make(sleeps: list[float] | None = None) -> ElevenLabsAsyncClient:
    return ElevenLabsAsyncClient(
        CFG, sleep=sleeps.append if sleeps is not None else (lambda s: None)
    )


def make_sync() -> ElevenLabsSyncClient:
    return ElevenLabsSyncClient(CFG, sleep=lambda s: None)


def dub_request(**input: object) -> CreateRequest:
    return CreateRequest(
        model="dubbing",
        job_id="job-7",
        input={"source_url": "https://cdn.test/in.mp4", "target_lang": "es", **input},
    )


def form(call: responses.Call) -> bytes:
    body = call.request.body
    return body if isinstance(body, bytes) else body.encode()


def dubbing(status: str, **extra: object) -> dict:
    return {
        "dubbing_id": "dub1",
        "name": "reconcile-job:job-7",
        "status": status,
        "source_language": "en",
        "target_languages": ["es"],
        "media_metadata": {"content_type": "video/mp4", "duration": 12.0},
        "error": None,
        **extra,
    }


# --- async create -----------------------------------------------------------------------------


def test_dubbing_create_is_multipart_and_names_the_job(rsps):
    """A dubbing is one multipart POST; its name carries the job id; the request id is kept."""
    rsps.post(
        f"{BASE}/v1/dubbing",
        json={"dubbing_id": "dub1", "expected_duration_sec": 30},
        headers={"request-id": "RQ-Exact"},
    )
    created = make().create(dub_request())
    call = rsps.calls[0]
    assert call.request.headers["Content-Type"].startswith("multipart/form-data")
    assert call.request.headers["xi-api-key"] == "xi-test"
    sent = form(call)
    assert b"https://cdn.test/in.mp4" in sent and b"reconcile-job:job-7" in sent
    assert (created.task_id, created.request_id) == ("dub1", "RQ-Exact")


def test_stt_webhook_create_plants_job_in_metadata(rsps):
    """Webhook STT sends webhook=true and the job id in webhook_metadata (task: transcription_id)."""
    rsps.post(
        f"{BASE}/v1/speech-to-text",
        json={"message": "Request accepted", "request_id": "req-1", "transcription_id": "tr-1"},
    )
    created = make().create(
        CreateRequest(
            model="speech-to-text:scribe_v1",
            job_id="job-7",
            input={
                "cloud_storage_url": "https://cdn.test/a.mp3",
                "webhook_metadata": {"user": "u1"},
            },
        )
    )
    sent = form(rsps.calls[0]).decode()
    assert 'name="webhook"\r\n\r\ntrue' in sent
    assert 'name="model_id"\r\n\r\nscribe_v1' in sent
    metadata = sent.split('name="webhook_metadata"\r\n\r\n')[1].split("\r\n")[0]
    assert json.loads(metadata) == {"user": "u1", "job_id": "job-7"}
    assert (created.task_id, created.request_id) == ("tr-1", "req-1")


def test_stt_create_without_transcription_id_uses_request_id(rsps):
    """Without transcription_id the request_id (what the webhook echoes) is the task id."""
    rsps.post(f"{BASE}/v1/speech-to-text", json={"message": "ok", "request_id": "req-9"})
    created = make().create(
        CreateRequest(model="stt:scribe_v1", job_id="j", input={"source_url": "https://x/a"})
    )
    assert created.task_id == "req-9"


def test_unknown_async_model_and_missing_stt_model_are_invalid(rsps):
    """An unknown operation or an STT request without model_id is refused before sending."""
    with pytest.raises(InvalidParam):
        make().create(CreateRequest(model="tts:v", job_id="j", input={}))
    with pytest.raises(InvalidParam):
        make().create(CreateRequest(model="speech-to-text", job_id="j", input={}))
    assert len(rsps.calls) == 0


@pytest.mark.parametrize(
    ("status", "body", "error", "code", "provider_code"),
    [
        (
            400,
            {
                "detail": {
                    "type": "validation_error",
                    "code": "invalid_parameters",
                    "message": "bad",
                    "request_id": "body-rid",
                }
            },
            CreateRejected,
            ErrorCode.UPSTREAM_INVALID_INPUT,
            "invalid_parameters",
        ),
        (
            422,
            {
                "detail": [
                    {"loc": ["body", "target_lang"], "msg": "field required", "type": "missing"}
                ]
            },
            CreateRejected,
            ErrorCode.UPSTREAM_INVALID_INPUT,
            "missing",
        ),
        (
            401,
            {"detail": {"status": "invalid_api_key", "message": "Invalid API key"}},
            CreateRejected,
            ErrorCode.UPSTREAM_SUBMISSION_FAILED,
            "invalid_api_key",
        ),
        (
            402,
            {"detail": {"status": "quota_exceeded", "message": "quota"}},
            CreateRejected,
            ErrorCode.UPSTREAM_SUBMISSION_FAILED,
            "quota_exceeded",
        ),
        (
            429,
            {"detail": {"code": "concurrent_limit_exceeded", "message": "busy"}},
            CreateRateLimited,
            ErrorCode.UPSTREAM_RATE_LIMITED,
            "concurrent_limit_exceeded",
        ),
        (
            500,
            {"detail": {"message": "oops"}},
            CreateUncertain,
            ErrorCode.UPSTREAM_SUBMISSION_UNCERTAIN,
            None,
        ),
        (
            503,
            "upstream connect error",
            CreateUncertain,
            ErrorCode.UPSTREAM_SUBMISSION_UNCERTAIN,
            None,
        ),
        (403, "<html>waf</html>", CreateUncertain, ErrorCode.UPSTREAM_SUBMISSION_UNCERTAIN, None),
        (200, "not json", CreateUncertain, ErrorCode.UPSTREAM_SUBMISSION_UNCERTAIN, None),
        (
            200,
            {"expected_duration_sec": 3},
            CreateUncertain,
            ErrorCode.UPSTREAM_SUBMISSION_UNCERTAIN,
            None,
        ),
    ],
)
def test_create_classification_and_never_retried(rsps, status, body, error, code, provider_code):
    """Each create answer maps to its outcome row after exactly one request."""
    kwargs = {"json": body} if isinstance(body, dict) else {"body": body}
    rsps.post(f"{BASE}/v1/dubbing", status=status, headers={"Retry-After": "4"}, **kwargs)
    with pytest.raises(error) as info:
        make().create(dub_request())
    assert info.value.code is code
    assert info.value.provider_code == provider_code
    assert len(rsps.calls) == 1
    if status == 400:
        assert info.value.request_id == "body-rid"
    if status == 429:
        assert info.value.retry_after == 4.0


# --- async poll -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        ("queued", PollStatus.RUNNING),
        ("preparing", PollStatus.RUNNING),
        ("dubbing", PollStatus.RUNNING),
        ("dubbed", PollStatus.SUCCEEDED),
        ("failed", PollStatus.FAILED),
        ("cloning", PollStatus.UNKNOWN),
    ],
)
def test_dubbing_states(rsps, state, expected):
    """Dubbing statuses map to ours and the planted job id is read back from the name."""
    rsps.get(
        f"{BASE}/v1/dubbing/dub1",
        json=dubbing(state, error="no speech" if state == "failed" else None),
    )
    result = make().poll("dub1", model="dubbing")
    assert (result.status, result.raw_status, result.planted_job_id) == (expected, state, "job-7")
    if state == "failed":
        assert result.error_message == "no speech"


def test_dubbed_yields_one_download_url_per_language(rsps):
    """A finished dubbing has one Output per target language pointing at the download endpoint."""
    rsps.get(f"{BASE}/v1/dubbing/dub1", json=dubbing("dubbed", target_languages=["es", "fr", "de"]))
    result = make().poll("dub1")
    assert [o.url for o in result.outputs] == [
        f"{BASE}/v1/dubbing/dub1/audio/{lang}" for lang in ("es", "fr", "de")
    ]
    assert {o.media_type for o in result.outputs} == {"video/mp4"}


def test_wrapped_dubbing_success_is_read_with_media(rsps):
    """A {data, requestId} wrapper around a dubbed status is success with its outputs."""
    rsps.get(f"{BASE}/v1/dubbing/dub1", json={"data": dubbing("dubbed"), "requestId": "w-1"})
    result = make().poll("dub1")
    assert result.status is PollStatus.SUCCEEDED and len(result.outputs) == 1
    assert result.request_id == "w-1"


def test_dubbing_not_found_and_read_retries(rsps):
    """A 404 is NOT_FOUND; a 502 then 429 is retried before the answer is used."""
    sleeps: list[float] = []
    rsps.get(
        f"{BASE}/v1/dubbing/gone", status=404, json={"detail": {"status": "dubbing_not_found"}}
    )
    rsps.get(f"{BASE}/v1/dubbing/dub1", status=502)
    rsps.get(f"{BASE}/v1/dubbing/dub1", status=429, headers={"Retry-After": "1"})
    rsps.get(f"{BASE}/v1/dubbing/dub1", json=dubbing("dubbing"))
    assert make().poll("gone").status is PollStatus.NOT_FOUND
    assert make(sleeps).poll("dub1").status is PollStatus.RUNNING
    assert len(sleeps) == 2 and sleeps[1] == 1.0


def test_transcript_poll(rsps):
    """An STT task is read from the transcripts endpoint: JSON output when done, 404 NOT_FOUND."""
    transcript = {"language_code": "en", "text": "hello", "words": []}
    rsps.get(f"{BASE}/v1/speech-to-text/transcripts/tr-1", json=transcript)
    rsps.get(f"{BASE}/v1/speech-to-text/transcripts/tr-2", status=404, json={"detail": "not found"})
    done = make().poll("tr-1", model="speech-to-text:scribe_v1")
    assert done.status is PollStatus.SUCCEEDED
    assert json.loads(done.outputs[0].text) == transcript
    assert make().poll("tr-2", model="stt").status is PollStatus.NOT_FOUND


def test_download_425_means_not_ready_then_bytes(rsps):
    """A 425 Too Early on the download is a retryable fetch failure; later it yields the bytes."""
    url = f"{BASE}/v1/dubbing/dub1/audio/es"
    rsps.get(url, status=425, json={"detail": {"status": "dubbing_not_dubbed"}})
    rsps.get(url, body=b"MP4DATA")
    with pytest.raises(MediaFetchFailed, match="425"):
        make().download_audio("dub1", "es")
    assert make().download_audio("dub1", "es") == b"MP4DATA"
    assert rsps.calls[1].request.headers["xi-api-key"] == "xi-test"


def test_download_missing_language_is_expired(rsps):
    """A 404 on a language download is MediaExpired (the lifecycle's expired-media path)."""
    rsps.get(f"{BASE}/v1/dubbing/dub1/audio/xx", status=404)
    with pytest.raises(MediaExpired):
        make().download_audio("dub1", "xx")


def test_media_headers_only_for_own_host():
    """The API key is offered for ElevenLabs download URLs and never for another host."""
    client = make()
    assert client.media_headers() == {"xi-api-key": "xi-test"}
    assert client.media_headers(f"{BASE}/v1/dubbing/d/audio/es") == {"xi-api-key": "xi-test"}
    assert client.media_headers("https://evil.test/x") == {}


def test_no_cancel_no_listing():
    """Dubbing has no cancel endpoint and no listing we can match: False and None."""
    assert make().cancel("dub1") is False
    assert make().find_created("job-7", None) is None  # type: ignore[arg-type]


# --- sync -------------------------------------------------------------------------------------


def test_tts_returns_audio_bytes(rsps):
    """tts:<voice>:<model> posts to the voice with model_id and output_format; returns audio."""
    rsps.post(
        f"{BASE}/v1/text-to-speech/voice1",
        body=b"ID3audio",
        content_type="audio/mpeg",
        headers={"request-id": "tts-rid"},
    )
    result = make_sync().call(
        "tts:voice1:eleven_multilingual_v2", {"text": "hi", "output_format": "mp3_44100_128"}
    )
    call = rsps.calls[0]
    assert json.loads(call.request.body) == {"text": "hi", "model_id": "eleven_multilingual_v2"}
    assert "output_format=mp3_44100_128" in call.request.url
    assert result.outputs[0].data == b"ID3audio"
    assert result.outputs[0].media_type == "audio/mpeg"
    assert result.request_id == "tts-rid"


def test_sound_effects_and_stt_and_alignment(rsps):
    """Sound effects give audio; sync STT and forced alignment give their JSON as text."""
    rsps.post(f"{BASE}/v1/sound-generation", body=b"RIFF", content_type="audio/mpeg")
    rsps.post(f"{BASE}/v1/speech-to-text", json={"text": "hey", "language_code": "en"})
    rsps.post(f"{BASE}/v1/forced-alignment", json={"words": [], "loss": 0.1})
    client = make_sync()
    assert client.call("sound-effects", {"text": "boom"}).outputs[0].data == b"RIFF"
    stt = client.call("stt:scribe_v1", {"source_url": "https://x/a.mp3", "webhook": True})
    assert json.loads(stt.outputs[0].text)["text"] == "hey"
    assert b'name="webhook"' not in form(rsps.calls[1])
    aligned = client.call(
        "forced-alignment", {"text": "hey", "file_base64": base64.b64encode(b"WAV").decode()}
    )
    assert json.loads(aligned.outputs[0].text)["loss"] == 0.1
    assert b'filename="file"' in form(rsps.calls[2]) and b"WAV" in form(rsps.calls[2])


def test_voice_clone_and_design(rsps):
    """Voice clone uploads every file; voice design returns one decoded audio Output per preview."""
    rsps.post(f"{BASE}/v1/voices/add", json={"voice_id": "v9", "requires_verification": False})
    previews = [
        {
            "audio_base_64": base64.b64encode(b"A1").decode(),
            "generated_voice_id": "g1",
            "media_type": "audio/mpeg",
        },
        {"audio_base_64": base64.b64encode(b"A2").decode(), "generated_voice_id": "g2"},
    ]
    rsps.post(f"{BASE}/v1/text-to-voice/design", json={"previews": previews, "text": "t"})
    client = make_sync()
    cloned = client.call("voice-clone", {"name": "me", "files": [b"one", b"two"]})
    assert json.loads(cloned.outputs[0].text)["voice_id"] == "v9"
    assert form(rsps.calls[0]).count(b'form-data; name="files"') == 2
    design = client.call("voice-design", {"voice_description": "deep"})
    assert [o.data for o in design.outputs] == [b"A1", b"A2"]
    assert [p["generated_voice_id"] for p in design.raw["previews"]] == ["g1", "g2"]
    assert "audio_base_64" not in design.raw["previews"][0]


@pytest.mark.parametrize(
    ("status", "body", "code"),
    [
        (
            400,
            {"detail": {"status": "max_character_limit_exceeded", "message": "too long"}},
            ErrorCode.UPSTREAM_INVALID_INPUT,
        ),
        (
            422,
            {"detail": [{"loc": ["body", "text"], "msg": "required", "type": "missing"}]},
            ErrorCode.UPSTREAM_INVALID_INPUT,
        ),
        (
            429,
            {"detail": {"status": "too_many_concurrent_requests", "message": "busy"}},
            ErrorCode.UPSTREAM_RATE_LIMITED,
        ),
        (
            401,
            {"detail": {"status": "invalid_api_key", "message": "no"}},
            ErrorCode.UPSTREAM_SUBMISSION_FAILED,
        ),
        (
            404,
            {"detail": {"status": "voice_not_found", "message": "no"}},
            ErrorCode.UPSTREAM_SUBMISSION_FAILED,
        ),
        (500, {"detail": {"message": "boom"}}, ErrorCode.UPSTREAM_FAILED),
        (200, b"", ErrorCode.UPSTREAM_FAILED),
    ],
)
def test_sync_error_codes_and_no_retry(rsps, status, body, code):
    """A failed sync call raises SyncCallFailed with the outcome table's code after one request."""
    kwargs = {"json": body} if isinstance(body, dict) else {"body": body}
    rsps.post(f"{BASE}/v1/text-to-speech/v1", status=status, **kwargs)
    with pytest.raises(SyncCallFailed) as info:
        make_sync().call("tts:v1", {"text": "x"})
    assert info.value.code is code
    assert len(rsps.calls) == 1


@pytest.mark.parametrize("model", ["tts", "tts:", "music", "voice-clone:x"])
def test_unknown_sync_model_is_invalid(model):
    """Model strings outside the documented convention are InvalidParam."""
    with pytest.raises(InvalidParam):
        elevenlabs.build_sync(model, {})


# --- robustness -------------------------------------------------------------------------------

KEYS = st.sampled_from(
    [
        "dubbing_id",
        "status",
        "name",
        "target_languages",
        "media_metadata",
        "error",
        "detail",
        "request_id",
        "transcription_id",
        "text",
        "transcripts",
        "previews",
        "audio_base_64",
        "message",
        "code",
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
    | st.sampled_from(["dubbed", "failed", "queued", "QUE=", "es"]),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(KEYS, children, max_size=6),
    max_leaves=30,
)


@settings(deadline=None, max_examples=300)
@given(
    status=st.sampled_from([200, 201, 400, 404, 422, 425, 429, 500]) | st.integers(100, 599),
    payload=JSON,
    raw=st.booleans(),
    junk=st.binary(max_size=30),
)
def test_parse_functions_only_raise_library_errors(status, payload, raw, junk):
    """Arbitrary JSON (or bytes) fed to every parse function escapes only as a ReconcileError."""
    body = junk if raw else json.dumps(payload).encode()
    headers = {"request-id": "r", "Retry-After": "x", "content-type": "audio/mpeg"}
    parsers = [
        lambda: elevenlabs.parse_create(status, body, headers, operation="dubbing"),
        lambda: elevenlabs.parse_create(status, body, headers, operation="speech-to-text"),
        lambda: elevenlabs.parse_dubbing(status, body, headers, base_url=BASE),
        lambda: elevenlabs.parse_transcript(status, body, headers),
        lambda: elevenlabs.parse_sync("audio", status, body, headers),
        lambda: elevenlabs.parse_sync("json", status, body, headers),
        lambda: elevenlabs.parse_sync("previews", status, body, headers),
    ]
    for parse in parsers:
        try:
            parse()
        except ReconcileError:
            pass
