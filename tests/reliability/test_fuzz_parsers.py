"""Bad input, part 1: every pure parser of every provider module, and every webhook scheme,
fuzzed with hypothesis (``deadline=None``: this machine is noisy).

The contract under fuzz: a parser returns a well-typed value or raises a library error
(:class:`~reconcile.errors.ReconcileError`) — never ``KeyError``/``TypeError``/pydantic's
``ValidationError``/``RecursionError`` — whatever the status, headers and body. A registry test
makes sure a parser added later is not silently left out of the fuzz.

Nothing here lists the provider families: the modules are found by scanning
``reconcile.providers``, a function with a parser's signature (``(status_code, body, headers)``,
or one value of an answer) and every ``to_error`` made by ``outcome.make_to_error`` are fuzzed
without a line here (the tables below say how to call the others), and every shipped webhook
scheme is signed with its simulator module's registered signer.
"""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from pydantic import BaseModel

import reconcile.providers
from reconcile import webhooks
from reconcile.errors import ReconcileError, WebhookError
from reconcile.kinds import BUILTIN_KINDS, get_kind
from reconcile.providers import (
    Created,
    ListedTask,
    Output,
    PollResult,
    PollStatus,
    SyncResult,
    anthropic,
    base,
    declared_output,
    elevenlabs,
    fal,
    http,
    kie,
    replicate,
)
from reconcile.providers.family import families
from reconcile.testing import sim_registry
from reconcile.testing.simulator import SimSecrets, Simulator

FUZZ = settings(deadline=None, max_examples=120,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# --------------------------------------------------------------------------- strategies

# the shared plumbing every provider parser calls (fuzzed through those parsers), not scanned;
# the webhook schemes' shared checks (fuzzed through every scheme below) and the family registry
SHARED = {"deadline", "outcome", "outputs", "scheme", "family"}
MODULES = {info.name: importlib.import_module(f"reconcile.providers.{info.name}")
           for info in pkgutil.iter_modules(reconcile.providers.__path__)
           if info.name not in SHARED and not info.name.startswith("_")}


def _with_submodules(module: Any) -> list[Any]:
    """A provider module, or a provider package and every module inside it (a family's package,
    split by endpoint family): a parser in any of them is counted. Its webhook scheme
    (``webhook.py``) is not: every scheme is fuzzed below, through ``webhooks.verify``
    (``test_every_public_parser_is_fuzzed`` checks that each family's scheme is there)."""
    found = [module]
    for info in pkgutil.walk_packages(getattr(module, "__path__", []), module.__name__ + "."):
        if not info.name.endswith(".webhook"):
            found.append(importlib.import_module(info.name))
    return found


# the field names the real answers use, so the fuzz reaches past the first "not a dict" check
FIELDS = [
    # KIE
    "code", "msg", "message", "data", "taskId", "state", "param", "resultJson", "resultUrls",
    "failCode", "failMsg", "progress", "createTime", "completeTime", "successFlag", "response",
    "errorCode", "errorMessage", "status", "sunoData", "audioUrl", "resultImageUrl", "videoInfo",
    "videoUrl", "generateParam", "paramJson", "callBackUrl", "choices", "content",
    # Replicate
    "id", "output", "error", "webhook", "created_at", "results", "next", "title", "detail",
    "type", "model", "version", "urls", "metrics", "predict_time",
    # ElevenLabs
    "dubbing_id", "name", "target_languages", "media_metadata", "content_type",
    "transcription_id", "request_id", "text", "transcripts", "previews", "audio_base_64",
    "generated_voice_id", "media_type", "webhook_metadata", "expected_duration_sec",
    # fal
    "images", "image", "video", "audio", "file", "files", "url", "error_type", "queue_position",
    "response_url", "status_url", "cancel_url", "requestId",
    # Anthropic
    "stop_reason", "usage",
]
# and every field a provider module's answer models name (a new family's too)
FIELDS += sorted({
    name for module in MODULES.values() for part in _with_submodules(module)
    for cls in vars(part).values()
    if isinstance(cls, type) and issubclass(cls, BaseModel) and cls.__module__ == part.__name__
    for name in cls.model_fields} - set(FIELDS))
STEERING = [
    "success", "SUCCESS", "fail", "FAILED", "GENERATING", "waiting", "queuing", "succeeded",
    "failed", "canceled", "aborted", "starting", "processing", "dubbed", "dubbing", "queued",
    "IN_QUEUE", "IN_PROGRESS", "COMPLETED", "error", "message", "text", "0", "1", "2", "3",
    "https://cdn.example.com/a.png", "http://169.254.169.254/latest/meta-data",
    "file:///etc/passwd", "https://x/y.mp4", '{"resultUrls":["https://cdn.example.com/a.png"]}',
    '{"callBackUrl":"https://p.example/hooks/kie?job_id=1"}', "2026-12-01T10:05:00Z", "",
    "image/png", "audio/mpeg", "en", "es", "reconcile-job:abc", "\x00", "💥" * 3,
]
scalars = (st.none() | st.booleans() | st.integers(-(2**70), 2**70)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=30)
           | st.sampled_from(STEERING))
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=8), children, max_size=5),
    max_leaves=25,
)
shaped = st.recursive(
    st.sampled_from(STEERING) | scalars,
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.sampled_from(FIELDS), children, max_size=7),
    max_leaves=30,
)


def _encode(value: Any) -> bytes:
    try:
        return json.dumps(value, allow_nan=True).encode()
    except (ValueError, TypeError, OverflowError):
        return b"null"


deep = st.integers(50, 3000).map(lambda n: b"[" * n + b"]" * n)  # recursion bombs
bodies = st.one_of(
    json_values, shaped,
    shaped.map(lambda d: {"code": 200, "msg": "success", "data": d}),
    shaped.map(lambda d: {"data": d, "requestId": "req-1"}),  # README, Design notes: The SDK result wrapper
    json_values.map(_encode), shaped.map(_encode), shaped.map(lambda v: _encode(v).decode()),
    st.binary(max_size=64), st.text(max_size=64), deep, st.none(),
)
byte_bodies = st.one_of(json_values.map(_encode), shaped.map(_encode), st.binary(max_size=64),
                        deep, st.text(max_size=40).map(str.encode), st.just(b""))
statuses = st.sampled_from([200, 201, 202, 204, 301, 400, 401, 402, 403, 404, 409, 410, 422,
                            429, 455, 500, 501, 502, 503, 504, 505, 529]) | st.integers(100, 599)
header_values = st.text(max_size=40) | st.sampled_from(
    ["0", "-1", "1e309", "Wed, 21 Oct 2015 07:28:00 GMT", "nan", "inf", "99999999999999999999"])
headers = st.dictionaries(
    st.sampled_from(["Retry-After", "retry-after", "content-type", "Content-Type", "request-id",
                     "x-request-id", "x-fal-request-id", "X-Request-Id", "x-ratelimit-reset"])
    | st.text(max_size=12), header_values, max_size=5) | st.none()
text_or_none = st.none() | st.text(max_size=40) | st.sampled_from(STEERING)


def _as_body(value: Any) -> str | bytes | None:
    """Parsers typed ``str | bytes | None`` get raw text; others (``Any``) get anything."""
    if value is None or isinstance(value, str | bytes):
        return value
    return _encode(value)


# --------------------------------------------------------------------------- the parser table

Parser = Callable[[int, Any, Any], Any]


def _parsed(value: Any) -> Any:
    """Functions typed over *parsed* JSON get what ``json.loads`` can produce, nothing else."""
    if isinstance(value, bytes | str):
        try:
            return json.loads(value)
        except (ValueError, RecursionError):
            return value if isinstance(value, str) else None
    return value


def _ops(fn: Callable[..., Any], ops: tuple[str, ...]) -> Parser:
    def call(status: int, body: Any, hdrs: Any) -> Any:
        return [fn(op, status, _as_body(body), hdrs) for op in ops]
    return call


def _rec(fn: Callable[..., Any]) -> Parser:
    return lambda status, body, hdrs: fn(body, status, hdrs)


def _sb(fn: Callable[..., Any]) -> Parser:  # (status, str|bytes|None body, headers)
    return lambda status, body, hdrs: fn(status, _as_body(body), hdrs)


def _kie_error_for(status: int, body: Any, hdrs: Any) -> Any:
    answer = kie.decode(status, body, hdrs)
    return [kie.error_for(answer, phase) for phase in ("create", "read", "sync")]


def _el_parse_create(status: int, body: Any, hdrs: Any) -> Any:
    return [elevenlabs.parse_create(status, _as_body(body), hdrs, operation=op)
            for op in ("dubbing", "speech-to-text")]


def _el_sync(status: int, body: Any, hdrs: Any) -> Any:
    out = []
    for kind in ("audio", "json", "previews"):
        try:
            out.append(elevenlabs.parse_sync(kind, status, _as_body(body), hdrs))  # type: ignore[arg-type]
        except ReconcileError:
            pass
    return out


def _fal_status(status: int, body: Any, hdrs: Any) -> Any:
    return fal.parse_status(status, _as_body(body), hdrs)  # None = COMPLETED


PARSERS: dict[str, Parser] = {
    "kie.decode": lambda s, b, h: kie.decode(s, b, h),
    "kie.error_for": _kie_error_for,
    "kie.parse_create": lambda s, b, h: kie.parse_create(s, b, h),
    "kie.parse_chat": lambda s, b, h: kie.parse_chat(s, b, h),
    "kie.parse_record_market": _rec(kie.parse_record_market),
    "kie.parse_record_veo": _rec(kie.parse_record_veo),
    "kie.parse_record_kontext": _rec(kie.parse_record_kontext),
    "kie.parse_record_luma": _rec(kie.parse_record_luma),
    "kie.parse_record_suno": _rec(kie.parse_record_suno),
    "kie.parse_record_runway": _rec(kie.parse_record_runway),
    "kie.planted_job_id": lambda s, b, h: kie.planted_job_id(b),
    "replicate.parse_create": _sb(replicate.parse_create),
    "replicate.parse_status": _sb(replicate.parse_status),
    "replicate.parse_list": _sb(replicate.parse_list),
    "replicate.to_error": _ops(replicate.to_error, ("create", "read", "sync")),
    "replicate.extract_outputs": lambda s, b, h: replicate.extract_outputs(_parsed(b)),
    "replicate.planted_job_id": lambda s, b, h: replicate.planted_job_id(b),
    "elevenlabs.parse_create": _el_parse_create,
    "elevenlabs.parse_dubbing": lambda s, b, h: elevenlabs.parse_dubbing(
        s, _as_body(b), h, task_id="dub-1"),
    "elevenlabs.parse_transcript": _sb(elevenlabs.parse_transcript),
    "elevenlabs.parse_sync": _el_sync,
    "elevenlabs.to_error": _ops(elevenlabs.to_error, ("create", "read", "sync")),
    "fal.parse_create": _sb(fal.parse_create),
    "fal.parse_status": _fal_status,
    "fal.parse_result": _sb(fal.parse_result),
    "fal.to_error": _ops(fal.to_error, ("create", "read", "sync")),
    "fal.extract_media": lambda s, b, h: fal.extract_media(_parsed(b)),
    "fal.extract_outputs": lambda s, b, h: fal.extract_outputs(
        _parsed(b), declared_output("fal", "fal-ai/whisper" if s % 2 else "fal-ai/any-llm")),
    "anthropic.parse_message": lambda s, b, h: anthropic.parse_message(s, b, h),
    "anthropic.error_for": lambda s, b, h: anthropic.error_for(s, b, h),
    "base.unwrap_sdk": lambda s, b, h: base.unwrap_sdk(b),
    "http.parse_retry_after": lambda s, b, h: http.parse_retry_after(
        b if isinstance(b, str) else None),
    "http.body_json": lambda s, b, h: http.body_json(_as_body(b)),
    "http.body_text": lambda s, b, h: http.body_text(_as_body(b)),
    "http.header_value": lambda s, b, h: [
        http.header_value(h, name) for name in ("retry-after", "Content-Type", "x-request-id")],
}

# module functions that parse nothing upstream-shaped (builders, clients, URL helpers, I/O)
NOT_PARSERS = {
    "anthropic.code_for", "anthropic.sync_client", "base.run", "base.resume",
    "elevenlabs.form_parts", "elevenlabs.async_operation", "elevenlabs.build_create",
    "elevenlabs.audio_url", "elevenlabs.build_sync", "elevenlabs.async_client",
    "elevenlabs.sync_client", "fal.app_path", "fal.queue_client", "http.json_or_none",
    "http.header", "http.load_bounded", "http.provider_http", "http.send_create",
    "http.cancel_once",
    # plumbing / builders in the provider subpackages (their parsing is the fuzzed parse_* above)
    "elevenlabs.http_client", "kie.http_client", "kie.state_decider", "replicate.find_created",
    "replicate.training_create", "kie.classify", "kie.market_body", "kie.top_level_body", "kie.modelless_body",
    "kie.market_client", "kie.veo_client", "kie.suno_client", "kie.kontext_client",
    "kie.luma_client", "kie.runway_client", "kie.llm_client", "replicate.build_create",
    "replicate.prediction_client", "replicate.training_client",
}
def _public_functions() -> dict[str, Callable[..., Any]]:
    return {
        f"{mod_name}.{name}": fn
        for mod_name, module in MODULES.items()
        for part in _with_submodules(module)
        for name, fn in vars(part).items()
        if inspect.isfunction(fn) and fn.__module__ == part.__name__ and not name.startswith("_")
    }


# how the fuzz feeds a parameter, by its annotation: a parser's signature is fuzzed untold
_HEADERS = ("Mapping[str, str] | None", "Headers")
_FEEDS: dict[str, Parser] = {
    "int": lambda s, b, h: s,
    "str | bytes | None": lambda s, b, h: _as_body(b),
    "bytes | str | None": lambda s, b, h: _as_body(b),
    "Any": lambda s, b, h: b,
    "str | None": lambda s, b, h: b if isinstance(b, str) else None,
    **{annotation: (lambda s, b, h: h) for annotation in _HEADERS},
}


def _by_signature(fn: Callable[..., Any]) -> Parser | None:
    """A call of ``fn`` fed from (status, body, headers) by its annotations, or None when a
    parameter it needs is of a type the fuzz cannot make (a builder, a client, I/O)."""
    feeds: list[tuple[str, Parser]] = []
    for param in inspect.signature(fn).parameters.values():
        feed = _FEEDS.get(str(param.annotation))
        required = param.default is inspect.Parameter.empty
        if required and (feed is None or param.kind not in (
                param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD)):
            return None
        if required or str(param.annotation) in _HEADERS:
            feeds.append((param.name, feed))  # type: ignore[arg-type]
    if not feeds:
        return None
    return lambda s, b, h: fn(**{name: feed(s, b, h) for name, feed in feeds})


def _factories() -> set[str]:
    """The built-in kinds' client factories (``kie.market_client``…): builders, not parsers."""
    found = set()
    for name in BUILTIN_KINDS:
        module, _, attr = get_kind(name).client.partition(":")  # type: ignore[union-attr]
        found.add(f"{module.removeprefix('reconcile.providers.').split('.')[0]}.{attr}")
    return found


def _untold() -> dict[str, Parser]:
    """What the fuzz runs that no table names: each unlisted public function with a parser's
    signature, and each module's ``to_error`` made by ``outcome.make_to_error``."""
    found: dict[str, Parser] = {}
    skip = set(PARSERS) | NOT_PARSERS | _factories()
    for name, fn in _public_functions().items():
        if name not in skip and (call := _by_signature(fn)) is not None:
            found[name] = call
    for mod_name, module in MODULES.items():
        for name, fn in vars(module).items():
            qualified = f"{mod_name}.{name}"
            if inspect.isfunction(fn) and not name.startswith("_") and qualified not in skip \
                    and fn.__qualname__.startswith("make_to_error."):
                found[qualified] = _ops(fn, ("create", "read", "sync"))
    return found


UNTOLD = _untold()
FUZZED: dict[str, Parser] = {**PARSERS, **UNTOLD}


def test_every_public_parser_is_fuzzed() -> None:
    """A public function added to a provider module is fuzzed (by the table, or by its
    parser's signature), a built-in kind's client factory, or listed as not a parser — so
    nothing that reads upstream bytes escapes the fuzz."""
    unlisted = set(_public_functions()) - set(FUZZED) - NOT_PARSERS - _factories()
    assert not unlisted, f"fuzz these in PARSERS, or list them in NOT_PARSERS: {sorted(unlisted)}"
    gone = {p for p in PARSERS
            if not callable(getattr(MODULES[p.split(".")[0]], p.split(".", 1)[1], None))}
    assert gone == set(), f"PARSERS names functions that no longer exist: {sorted(gone)}"
    assert set(MODULES) >= {"base", "http"} | {n.split(".")[0] for n in _factories()}
    # the webhook modules left out of the scan: each family's scheme is fuzzed below
    assert {f.name for f in families() if f.webhook is not None} == set(SCHEMES)


def _check_value(value: Any) -> None:
    """What a parser returns is well-typed (no half-parsed garbage leaks out)."""
    if isinstance(value, list | tuple) and not isinstance(value, Output):
        for item in value:
            _check_value(item)
        return
    if isinstance(value, PollResult):
        assert isinstance(value.status, PollStatus)
        assert value.progress is None or isinstance(value.progress, int)
        assert all(isinstance(o, Output) for o in value.outputs)
        for o in value.outputs:
            assert o.url is None or isinstance(o.url, str)
        assert value.raw_status is None or isinstance(value.raw_status, str)
        assert value.planted_job_id is None or isinstance(value.planted_job_id, str)
    elif isinstance(value, Created):
        assert isinstance(value.task_id, str) and value.task_id
    elif isinstance(value, SyncResult):
        assert all(isinstance(o, Output) for o in value.outputs)
    elif isinstance(value, ListedTask):
        assert isinstance(value.task_id, str)
    elif isinstance(value, Output):
        assert value.url is None or isinstance(value.url, str)


@pytest.mark.parametrize("name", sorted(FUZZED))
@FUZZ
@given(status=statuses, body=bodies, hdrs=headers)
def test_parser_returns_or_raises_a_library_error(name: str, status: int, body: Any,
                                                  hdrs: Mapping[str, str] | None) -> None:
    """Whatever the status, headers and body: a typed value or a ReconcileError, nothing else."""
    try:
        value = FUZZED[name](status, body, hdrs)
    except ReconcileError as exc:
        assert isinstance(exc.message, str)
        return
    _check_value(value)


# --------------------------------------------------------------------------- webhook schemes

NOW = datetime.now(UTC)
# never started: its secrets and fal key are what the registered signers sign with
SIM = Simulator(secrets=SimSecrets(fal_key_seed=b"\x07" * 32))
SCHEMES = sorted(webhooks.PROVIDERS)  # every shipped scheme, each signed by its simulator module


def _key(provider: str) -> Any:
    """What ``webhooks.verify`` checks ``provider``'s signatures with (LookupError: no
    simulator module registered a signer for it)."""
    return sim_registry.verify_key(provider, SIM)


def _sign(provider: str, body: bytes) -> dict[str, str]:
    """``body`` signed by ``provider``'s registered signer; an unknown provider raises."""
    return sim_registry.sign(provider, SIM, body, int(NOW.timestamp()))


def test_every_shipped_scheme_has_a_simulator_signer() -> None:
    for provider in SCHEMES:
        assert _sign(provider, b"{}"), provider
        _key(provider)
    with pytest.raises(LookupError):
        _sign("no-such-provider", b"{}")


# the headers the signers set (each scheme's own), so the fuzz reaches past "missing header"
SIGNED_HEADERS = sorted({name for p in SCHEMES for name in _sign(p, b"{}")})
webhook_headers = st.dictionaries(
    st.sampled_from([*SIGNED_HEADERS, "Content-Type"]) | st.text(max_size=10),
    st.text(max_size=60) | st.sampled_from([str(int(NOW.timestamp())), "v1,AAAA", "t=1,v0=ab",
                                            "v1," + "A" * 44, "00" * 64]),
    max_size=6)
queries = st.dictionaries(st.sampled_from(["job_id", "x", ""]) | st.text(max_size=6),
                          st.text(max_size=40) | st.uuids().map(str), max_size=3)


@pytest.mark.parametrize("provider", SCHEMES)
@FUZZ
@given(hdrs=webhook_headers, body=byte_bodies, query=queries)
def test_webhook_verify_refuses_garbage_with_a_webhook_error(
        provider: str, hdrs: dict[str, str], body: bytes, query: dict[str, str]) -> None:
    """Unsigned garbage: a WebhookError (→ 4xx), never another exception."""
    try:
        event = webhooks.verify(provider, hdrs, body, query, _key(provider), NOW)
    except WebhookError:
        return
    assert event.provider == provider  # pragma: no cover - a forged signature would be a bug


@pytest.mark.parametrize("provider", SCHEMES)
@FUZZ
@given(body=byte_bodies, query=queries)
def test_webhook_verify_signed_odd_bodies(provider: str, body: bytes, query: dict[str, str]) -> None:
    """A correctly signed body of any shape: a typed event or a WebhookError."""
    try:
        event = webhooks.verify(provider, _sign(provider, body), body, query, _key(provider), NOW)
    except WebhookError:
        return
    assert isinstance(event.delivery_id, str) and event.delivery_id
    assert event.task_id is None or isinstance(event.task_id, str)
    assert event.planted_job_id is None or isinstance(event.planted_job_id, str)
    assert event.signed_body is (provider != "kie")


@FUZZ
@given(document=json_values | shaped)
def test_parse_jwks_never_crashes(document: Any) -> None:
    try:
        keys = webhooks.parse_jwks(document)
    except WebhookError:
        return
    assert isinstance(keys, tuple)


@FUZZ
@given(provider=st.text(max_size=12), hdrs=webhook_headers, body=byte_bodies)
def test_webhook_verify_unknown_provider(provider: str, hdrs: dict[str, str], body: bytes) -> None:
    if webhooks.get_scheme(provider) is not None:
        return
    with pytest.raises(WebhookError):
        webhooks.verify(provider, hdrs, body, {}, "k", NOW)
