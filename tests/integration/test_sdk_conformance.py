"""The providers' official SDKs drive the shipped simulator over loopback HTTP (issue 15).

The library's own clients agree with the simulator because the same authors wrote both; these
tests use references they did not write: ``replicate``, ``anthropic``, ``fal_client`` and
``elevenlabs``, pointed at the simulator through their base-URL options or environment
variables only, with dummy keys. A failing SDK call here is a simulator bug.

Every endpoint the library's clients call is driven here (create, status/get, result, cancel,
list where the provider has them), plus the errors (401, 422, 429 with Retry-After, 5xx) and the
webhook signatures checked with the SDKs' own helpers. No test may reach outside loopback: a
guard refuses any other connection, and every test ends with ``sim.unrouted == []`` (no SDK
request fell through to the simulator's route-miss 404).
"""

from __future__ import annotations

import datetime as dt
import importlib
import ipaddress
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from reconcile.testing import sim_elevenlabs, sim_replicate
from reconcile.testing.sim_core import MEDIA
from reconcile.testing.simulator import Script, Simulator

INSTANT = ((0.0, "queued"), (0.0, "succeeded"))
FOREVER = ((0.0, "queued"), (0.0, "running"))
HOOK = "https://platform.example/hooks/webhooks/{p}?job_id={j}"


def _loopback(address: Any) -> bool:
    host = address[0] if isinstance(address, tuple) else address
    if isinstance(host, str) and host in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it would resolve elsewhere — refused


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """Refuse (and record) every connection that is not to a loopback address."""
    refused: list[Any] = []
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex

    def guard(address: Any) -> None:
        if not _loopback(address):
            refused.append(address)
            raise OSError(f"outside connection refused in SDK tests: {address!r}")

    def connect(self: socket.socket, address: Any) -> None:
        if self.family in (socket.AF_INET, socket.AF_INET6):
            guard(address)
        return real_connect(self, address)

    def connect_ex(self: socket.socket, address: Any) -> int:
        if self.family in (socket.AF_INET, socket.AF_INET6):
            guard(address)
        return real_connect_ex(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy",
                 "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    yield refused
    assert refused == [], f"an SDK tried to leave loopback: {refused}"


@pytest.fixture
def sim() -> Iterator[Simulator]:
    with Simulator() as simulator:
        yield simulator
        assert simulator.unrouted == [], f"SDK requests no simulator route serves: {simulator.unrouted}"


def _only_loopback(url: str) -> str:
    host = httpx.URL(url).host
    assert ipaddress.ip_address(host).is_loopback, url
    return url


# --- Replicate -----------------------------------------------------------------------------------

replicate = importlib.import_module("replicate")


class _Seen:
    """An httpx response hook: every response the SDK received."""

    def __init__(self) -> None:
        self.responses: list[httpx.Response] = []

    def __call__(self, response: httpx.Response) -> None:
        self.responses.append(response)


def _replicate(sim: Simulator, seen: _Seen | None = None) -> Any:
    hooks = {"response": [seen]} if seen is not None else {}
    return replicate.Client(api_token="r8_dummy_token_for_tests",
                            base_url=_only_loopback(f"{sim.url}/replicate"), event_hooks=hooks)


def test_replicate_prediction_create_get_cancel_list(sim: Simulator) -> None:
    """predictions.create (by version, with webhook), get, cancel and list."""
    client = _replicate(sim)
    sim.script_default(Script(timeline=FOREVER))
    webhook = HOOK.format(p="replicate", j="job-r1")
    created = client.predictions.create(version="owner/model:v1", input={"prompt": "x"},
                                        webhook=webhook, webhook_events_filter=["completed"])
    assert created.status in ("starting", "processing") and created.id
    assert client.predictions.get(created.id).status == "processing"
    canceled = client.predictions.cancel(created.id)
    assert canceled.status == "canceled"
    page = client.predictions.list()
    assert created.id in [p.id for p in page.results]
    assert sim.creates("job-r1", "replicate") == 1


def test_replicate_official_model_and_deployment_creates(sim: Simulator) -> None:
    """models.predictions.create and deployments.predictions.create hit their own paths."""
    client = _replicate(sim)
    by_model = client.models.predictions.create(model="owner/official", input={"prompt": "x"})
    by_deployment = client.deployments.predictions.create("acme/app", input={"prompt": "x"})
    assert client.predictions.get(by_model.id).id == by_model.id
    assert client.predictions.get(by_deployment.id).id == by_deployment.id


def test_replicate_run_by_version_waits_and_reads_the_files(sim: Simulator) -> None:
    """replicate.run("owner/name:version") reads the version, waits (Prefer: wait), and gets
    the outputs (the SDK wraps only https URLs in FileOutput; the loopback http URLs stay
    strings, and they serve the media)."""
    sim.script_default(Script(timeline=((0.0, "queued"), (0.2, "succeeded")), outputs=2))
    outputs = _replicate(sim).run("owner/model:v1", input={"prompt": "x"})
    assert len(outputs) == 2
    assert httpx.get(_only_loopback(str(outputs[0]))).content == MEDIA["png"][1]


def test_replicate_trainings_create_get_cancel_list(sim: Simulator) -> None:
    """trainings.create (model + version + destination), get, cancel, list."""
    client = _replicate(sim)
    sim.script_default(Script(timeline=FOREVER))
    training = client.trainings.create(model="owner/model", version="v1", input={"steps": 1},
                                       destination="owner/trained")
    assert client.trainings.get(training.id).status == "processing"
    assert client.trainings.cancel(training.id).status == "canceled"
    assert training.id in [t.id for t in client.trainings.list().results]


@pytest.mark.parametrize(("mode", "status"), [("reject_auth", 401), ("reject_invalid", 422),
                                              ("rate_limit", 429), ("server_error", 500)])
def test_replicate_errors_are_the_sdks_errors(sim: Simulator, mode: str, status: int) -> None:
    """401/422/429/500 reach the SDK as ReplicateError with that status; the 429 carries
    Retry-After (and the "resets in ~Ns" hint the library also reads)."""
    seen = _Seen()
    client = _replicate(sim, seen)
    sim.script_default(Script(create=mode, retry_after=3))
    with pytest.raises(replicate.exceptions.ReplicateError) as caught:
        client.predictions.create(version="owner/model:v1", input={"prompt": "x"})
    assert caught.value.status == status
    if status == 429:
        assert seen.responses[-1].headers["Retry-After"] == "3"
        assert "resets in" in (caught.value.detail or "")


def test_replicate_webhook_verifies_with_the_sdk_and_standardwebhooks(sim: Simulator) -> None:
    """The simulator's completed delivery passes replicate.webhooks.validate (with the secret
    from webhooks.default.secret()) and standardwebhooks' Webhook.verify."""
    from standardwebhooks.webhooks import Webhook

    client = _replicate(sim)
    sim.script_default(Script(timeline=INSTANT))
    created = client.predictions.create(version="owner/model:v1", input={"prompt": "x"},
                                        webhook=HOOK.format(p="replicate", j="job-w"))
    task, state, since = sim.lookup(created.id)  # type: ignore[misc]
    delivery = sim_replicate.callback(sim, task, state, since)
    assert delivery is not None
    secret = client.webhooks.default.secret()
    # validate() returns None for a good signature and raises otherwise
    client.webhooks.validate(headers=delivery.headers, body=delivery.body.decode(), secret=secret)
    with pytest.raises(replicate.webhook.InvalidSignatureError):
        client.webhooks.validate(headers=delivery.headers, secret=secret,
                                 body=delivery.body.decode().replace("succeeded", "failed"))
    payload = Webhook(secret.key).verify(delivery.body, dict(delivery.headers))
    assert payload["id"] == created.id and payload["status"] == "succeeded"


# --- Anthropic -----------------------------------------------------------------------------------

anthropic = importlib.import_module("anthropic")
MESSAGE = {"model": "claude-sonnet-4-6",  # not in the SDK's DEPRECATED_MODELS
           "max_tokens": 64,
           "messages": [{"role": "user", "content": "hi"}]}


def _anthropic(sim: Simulator) -> Any:
    return anthropic.Anthropic(api_key="sk-ant-dummy", base_url=_only_loopback(f"{sim.url}/anthropic"),
                               max_retries=0)


def test_anthropic_messages_create(sim: Simulator) -> None:
    """messages.create with the SDK's own auth (2.x: Authorization: Bearer) gets a Message."""
    message = _anthropic(sim).messages.create(**MESSAGE)
    assert message.content[0].text == "Simulated reply."
    assert message.stop_reason == "end_turn" and message._request_id.startswith("req_")


def test_anthropic_streaming_gets_events(sim: Simulator) -> None:
    """stream=True answers server-sent events the SDK assembles into the same message."""
    client = _anthropic(sim)
    with client.messages.stream(**MESSAGE) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "Simulated reply." and final.stop_reason == "end_turn"
    kinds = [event.type for event in client.messages.create(**MESSAGE, stream=True)]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_delta" in kinds


@pytest.mark.parametrize(("mode", "error"), [
    ("reject_auth", "AuthenticationError"), ("reject_invalid", "BadRequestError"),
    ("rate_limit", "RateLimitError"), ("server_error", "InternalServerError")])
def test_anthropic_errors_are_the_sdks_errors(sim: Simulator, mode: str, error: str) -> None:
    """401/400/429/500 become the SDK's typed errors with the request id; 429 has Retry-After."""
    sim.script_default(Script(create=mode, retry_after=2))
    with pytest.raises(getattr(anthropic, error)) as caught:
        _anthropic(sim).messages.create(**MESSAGE)
    assert caught.value.request_id and caught.value.request_id.startswith("req_")
    if mode == "rate_limit":
        assert caught.value.response.headers["retry-after"] == "2"


def test_anthropic_retries_a_429_after_retry_after(sim: Simulator) -> None:
    """With retries on, the SDK waits out the 429 and the second attempt succeeds."""
    sim.script_default(Script(create="rate_limit", rate_limit_times=1, retry_after=0))
    client = anthropic.Anthropic(api_key="sk-ant-dummy", base_url=f"{sim.url}/anthropic",
                                 max_retries=1)
    assert client.messages.create(**MESSAGE).content[0].text == "Simulated reply."
    assert sim.attempts(provider="anthropic") == 2


# --- fal -----------------------------------------------------------------------------------------


def _self_signed(tmp: Path) -> tuple[str, str]:
    """A throwaway certificate for 127.0.0.1 (fal_client's URLs are always https)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "reconcile-sim")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp / "sim.pem", tmp / "sim.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_path), str(key_path)


@pytest.fixture
def fal_client(sim: Simulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """fal_client pointed at the simulator through its env vars (FAL_RUN_HOST,
    FAL_QUEUE_RUN_HOST, FAL_KEY) and a trusted loopback certificate (SSL_CERT_FILE)."""
    cert, key = _self_signed(tmp_path)
    host = _only_loopback(sim.serve_tls(cert, key)).removeprefix("https://")
    monkeypatch.setenv("FAL_RUN_HOST", f"{host}/fal-sync")
    monkeypatch.setenv("FAL_QUEUE_RUN_HOST", f"{host}/fal")
    monkeypatch.setenv("FAL_KEY", "dummy-key-id:dummy-key-secret")
    monkeypatch.setenv("SSL_CERT_FILE", cert)
    auth = importlib.reload(importlib.import_module("fal_client.auth"))
    client_module = importlib.reload(importlib.import_module("fal_client.client"))
    assert client_module.QUEUE_URL_FORMAT == f"https://{host}/fal/" and auth.FAL_RUN_HOST
    yield client_module
    monkeypatch.undo()
    importlib.reload(importlib.import_module("fal_client.auth"))
    importlib.reload(importlib.import_module("fal_client.client"))


def test_fal_submit_status_result_cancel(sim: Simulator, fal_client: Any) -> None:
    """submit (with a webhook), status with logs (the SDK sends logs=true), result and cancel,
    through the handle (the returned URLs) and by request id (URLs the SDK builds)."""
    client = fal_client.SyncClient(key="dummy-key-id:dummy-key-secret")
    sim.script_model("fal-ai/flux/dev", Script(timeline=((0.0, "queued"), (0.0, "running"),
                                                         (0.3, "succeeded")), outputs=2))
    handle = client.submit("fal-ai/flux/dev", {"prompt": "x"},
                           webhook_url=HOOK.format(p="fal", j="job-f1"))
    assert sim.creates("job-f1", "fal") == 1
    status = handle.status(with_logs=True)
    assert isinstance(status, fal_client.InProgress) and status.logs
    result = handle.get()  # iterates status until COMPLETED, then reads the result
    assert [i["content_type"] for i in result["images"]] == ["image/png", "image/png"]
    completed = client.status("fal-ai/flux/dev", handle.request_id, with_logs=True)
    assert isinstance(completed, fal_client.Completed) and completed.error is None
    assert client.result("fal-ai/flux/dev", handle.request_id) == result
    sim.script_model("fal-ai/flux/schnell", Script(timeline=FOREVER))
    running = client.submit("fal-ai/flux/schnell", {"prompt": "y"})
    client.cancel("fal-ai/flux/schnell", running.request_id)
    assert sim.state_of(running.request_id) == "canceled"


def test_fal_workflow_namespace(sim: Simulator, fal_client: Any) -> None:
    """A workflows/… endpoint: the SDK's namespaced URLs are served (status, result)."""
    client = fal_client.SyncClient(key="dummy-key-id:dummy-key-secret")
    sim.script_model("workflows/fal-ai/my-flow", Script(timeline=INSTANT))
    handle = client.submit("workflows/fal-ai/my-flow", {"prompt": "x"})
    status = client.status("workflows/fal-ai/my-flow", handle.request_id)
    assert isinstance(status, fal_client.Completed)
    assert client.result("workflows/fal-ai/my-flow", handle.request_id)["images"]


def test_fal_completed_with_error_type(sim: Simulator, fal_client: Any) -> None:
    """A runner failure: the SDK's Completed carries error/error_type, and the result read
    raises with the same error type."""
    client = fal_client.SyncClient(key="dummy-key-id:dummy-key-secret")
    sim.script_model("fal-ai/flux/dev", Script(timeline=((0.0, "queued"), (0.0, "failed")),
                                               fail_code="runner_disconnected"))
    handle = client.submit("fal-ai/flux/dev", {"prompt": "x"})
    status = handle.status()
    assert isinstance(status, fal_client.Completed)
    assert status.error_type == "runner_disconnected" and status.error
    with pytest.raises(fal_client.FalClientHTTPError) as caught:
        client.result("fal-ai/flux/dev", handle.request_id)
    assert caught.value.error_type == "runner_disconnected" and caught.value.status_code == 503


def test_fal_run_sync(sim: Simulator, fal_client: Any) -> None:
    """run() (the synchronous endpoint) answers the model output directly."""
    client = fal_client.SyncClient(key="dummy-key-id:dummy-key-secret")
    assert client.run("fal-ai/flux/dev", {"prompt": "x"})["images"]


@pytest.mark.parametrize(("mode", "status"), [("reject_auth", 401), ("reject_invalid", 422),
                                              ("server_error", 500)])
def test_fal_errors_are_the_sdks_errors(sim: Simulator, fal_client: Any, mode: str,
                                        status: int) -> None:
    """401/422/500 on submit raise FalClientHTTPError with that status (and fal's error type)."""
    client = fal_client.SyncClient(key="dummy-key-id:dummy-key-secret")
    sim.script_default(Script(create=mode))
    with pytest.raises(fal_client.FalClientHTTPError) as caught:
        client.submit("fal-ai/flux/dev", {"prompt": "x"})
    assert caught.value.status_code == status
    if status == 500:
        assert caught.value.error_type == "internal_error"


def test_fal_retries_a_429(sim: Simulator, fal_client: Any) -> None:
    """fal_client retries 429 itself (RETRY_CODES): one throttled attempt, then accepted; the
    throttled answer carried Retry-After."""
    client = fal_client.SyncClient(key="dummy-key-id:dummy-key-secret")
    sim.script_default(Script(create="rate_limit", rate_limit_times=1, retry_after=1))
    handle = client.submit("fal-ai/flux/dev", {"prompt": "x"})
    assert handle.request_id and sim.attempts(provider="fal") == 2
    # fal_client keeps no 429 it retried; the same request outside the SDK shows the header
    sim.script_default(Script(create="rate_limit", retry_after=1))
    throttled = httpx.post(f"{sim.url}/fal/fal-ai/flux/dev", json={"prompt": "x"},
                           headers={"Authorization": "Key dummy"})
    assert (throttled.status_code, throttled.headers["Retry-After"]) == (429, "1")


# --- ElevenLabs ----------------------------------------------------------------------------------

elevenlabs_sdk = importlib.import_module("elevenlabs")
importlib.import_module("elevenlabs.core")  # .core is lazy: without this, only after another test
NO_RETRY = {"max_retries": 0}


def _elevenlabs(sim: Simulator) -> Any:
    return elevenlabs_sdk.ElevenLabs(api_key="xi-dummy", base_url=_only_loopback(f"{sim.url}/elevenlabs"))


def test_elevenlabs_dubbing_create_get_list_audio(sim: Simulator) -> None:
    """dubbing.create (multipart), get, list and the dubbed audio download."""
    client = _elevenlabs(sim)
    sim.script_default(Script(timeline=((0.0, "queued"), (0.2, "succeeded"))))
    created = client.dubbing.create(file=("a.mp4", b"\x00\x00\x00\x18ftyp", "video/mp4"),
                                    target_lang="es", name="reconcile-job:job-e1")
    assert sim.creates("job-e1", "elevenlabs") == 1
    listed = client.dubbing.list()
    assert created.dubbing_id in [d.dubbing_id for d in listed.dubs]
    sim.set_state(created.dubbing_id, "succeeded")
    assert client.dubbing.get(created.dubbing_id).status == "dubbed"
    audio = b"".join(client.dubbing.audio.get(created.dubbing_id, "es"))
    assert audio == MEDIA["mp3"][1]


def test_elevenlabs_speech_endpoints(sim: Simulator) -> None:
    """text_to_speech.convert, text_to_sound_effects.convert and speech_to_text.convert."""
    client = _elevenlabs(sim)
    assert b"".join(client.text_to_speech.convert("voice1", text="hello")) == MEDIA["mp3"][1]
    assert b"".join(client.text_to_sound_effects.convert(text="rain")) == MEDIA["mp3"][1]
    transcript = client.speech_to_text.convert(model_id="scribe_v1", file=("a.wav", b"RIFF"))
    assert transcript.text == "Simulated transcript."


def test_elevenlabs_webhook_stt_and_transcript(sim: Simulator) -> None:
    """Webhook-mode speech_to_text.convert answers {message, request_id, transcription_id};
    transcripts.get reads it once done; the delivery verifies with webhooks.construct_event."""
    client = _elevenlabs(sim)
    sim.configure(elevenlabs_webhook_url="https://platform.example/hooks/webhooks/elevenlabs")
    sim.script_default(Script(timeline=FOREVER))
    accepted = client.speech_to_text.convert(model_id="scribe_v1", file=("a.wav", b"RIFF"),
                                             webhook=True, webhook_metadata={"job_id": "job-s1"})
    assert accepted.request_id and accepted.transcription_id
    assert sim.creates("job-s1", "elevenlabs") == 1
    sim.set_state(accepted.transcription_id, "succeeded")
    transcript = client.speech_to_text.transcripts.get(accepted.transcription_id)
    assert transcript.transcription_id == accepted.transcription_id
    task, state, since = sim.lookup(accepted.transcription_id)  # type: ignore[misc]
    delivery = sim_elevenlabs.callback(sim, task, state, since)
    assert delivery is not None
    event = client.webhooks.construct_event(
        rawBody=delivery.body.decode(), sig_header=delivery.headers["ElevenLabs-Signature"],
        secret=sim.secrets.elevenlabs_webhook_secret)
    assert event["type"] == "speech_to_text_transcription"
    assert event["data"]["transcription"]["transcription_id"] == accepted.transcription_id
    metadata = event["data"]["webhook_metadata"]  # echoed as sent: an object or its JSON text
    assert (json.loads(metadata) if isinstance(metadata, str) else metadata)["job_id"] == "job-s1"


def test_elevenlabs_voice_endpoints(sim: Simulator) -> None:
    """text_to_voice.design and .create, voices.ivc.create and forced_alignment.create — the
    endpoints the library's sync client calls, which the simulator did not serve before."""
    client = _elevenlabs(sim)
    design = client.text_to_voice.design(voice_description="a calm, warm narrator voice")
    assert len(design.previews) == 3 and design.previews[0].generated_voice_id
    voice = client.text_to_voice.create(voice_name="Calm", voice_description="calm narrator",
                                        generated_voice_id=design.previews[0].generated_voice_id)
    assert voice.voice_id == design.previews[0].generated_voice_id
    clone = client.voices.ivc.create(name="Me", files=[("s.mp3", b"ID3", "audio/mpeg")])
    assert clone.voice_id and clone.requires_verification is False
    aligned = client.forced_alignment.create(file=("a.mp3", b"ID3"), text="hello world")
    assert [w.text for w in aligned.words] == ["hello", "world"] and aligned.characters


@pytest.mark.parametrize(("mode", "status"), [("reject_auth", 401), ("reject_invalid", 422),
                                              ("rate_limit", 429), ("server_error", 500)])
def test_elevenlabs_errors_are_the_sdks_errors(sim: Simulator, mode: str, status: int) -> None:
    """401/422/429/500 on a dubbing create reach the SDK as ApiError with that status; the
    429's headers carry Retry-After."""
    sim.script_default(Script(create=mode, retry_after=4))
    with pytest.raises(elevenlabs_sdk.core.ApiError) as caught:
        _elevenlabs(sim).dubbing.create(file=("a.mp4", b"x", "video/mp4"), target_lang="es",
                                        request_options=NO_RETRY)
    assert caught.value.status_code == status
    if status == 429:
        assert caught.value.headers["retry-after"] == "4"


def test_elevenlabs_dubbing_webhook_verifies_with_the_sdk(sim: Simulator) -> None:
    """A dubbing event from the simulator passes the SDK's construct_event; a tampered one
    does not."""
    client = _elevenlabs(sim)
    sim.configure(elevenlabs_webhook_url="https://platform.example/hooks/webhooks/elevenlabs")
    sim.script_default(Script(timeline=INSTANT))
    created = client.dubbing.create(file=("a.mp4", b"x", "video/mp4"), target_lang="es")
    task, state, since = sim.lookup(created.dubbing_id)  # type: ignore[misc]
    delivery = sim_elevenlabs.callback(sim, task, state, since)
    assert delivery is not None
    secret, header = sim.secrets.elevenlabs_webhook_secret, delivery.headers["ElevenLabs-Signature"]
    event = client.webhooks.construct_event(rawBody=delivery.body.decode(), sig_header=header,
                                            secret=secret)
    assert event["data"]["dubbing_id"] == created.dubbing_id
    with pytest.raises(elevenlabs_sdk.core.ApiError):
        client.webhooks.construct_event(rawBody=delivery.body.decode().replace("dubbed", "failed"),
                                        sig_header=header, secret=secret)
