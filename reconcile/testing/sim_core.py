"""Internal: the library's own mechanics, not an import path for platforms (may move).

Value objects shared by the provider simulator's modules.

:class:`Script` says how one upstream task behaves (its timeline, how the create answers, media
lifetime, webhooks); :class:`SimSecrets` holds the webhook secrets the simulator signs with;
:class:`Task` is one upstream task; :class:`Request`/:class:`Response` are the tiny HTTP values
the per-provider route modules (``sim_kie`` …) take and return.
"""

from __future__ import annotations

import json
import math
import struct
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qs, urlsplit

from . import sim_registry

STATES = frozenset({"queued", "running", "succeeded", "failed", "canceled", "vanished"})
TERMINAL = frozenset({"succeeded", "failed", "canceled"})
CREATE_MODES = frozenset({
    "accept", "reject_invalid", "reject_auth", "rate_limit", "server_error",
    "drop_after_accept", "garbage_2xx",
})
# a 200 whose body cannot be parsed: truncated JSON with a JSON content type
GARBAGE = b'{"code":200,"msg":"success","data":{"taskId":"'


def check_state(state: str) -> str:
    """``state`` if it is a simulator state (``unknown:<raw>`` included), else ValueError."""
    if state in STATES or (state.startswith("unknown:") and len(state) > len("unknown:")):
        return state
    raise ValueError(f"unknown simulator state {state!r}")


def check_create(mode: str) -> str:
    if mode in CREATE_MODES:
        return mode
    if mode.startswith("kie_200_error:") and mode.split(":", 1)[1].isdigit():
        return mode
    raise ValueError(f"unknown create mode {mode!r}")


@dataclass(frozen=True)
class Script:
    """How one upstream task behaves. Offsets and ``media_ttl`` are timeline seconds (multiplied
    by the simulator's ``time_scale``); ``latency`` and ``retry_after`` are real seconds."""

    # (seconds after create, state); before the first entry a task is "queued"
    timeline: Sequence[tuple[float, str]] = ((0.0, "queued"), (0.5, "running"), (1.0, "succeeded"))
    outputs: int = 1  # number of output media on success
    create: str = "accept"
    rate_limit_times: int | None = None  # with create="rate_limit": 429 this many times, then accept
    retry_after: float = 1.0  # the Retry-After header of a 429
    latency: float = 0.0  # real seconds slept before every response about this task
    media_ttl: float | None = None  # seconds after success until media URLs answer 403
    fail_code: str | None = None  # provider failure code (a per-provider default when None)
    fail_message: str | None = None
    webhook: bool = False  # POST a signed delivery to the callback URL on reaching a terminal state
    kie_msg_key: str = "msg"  # KIE envelope message key: "msg" or "message" (the docs use both)

    def __post_init__(self) -> None:
        timeline = tuple(sorted(((float(t), check_state(s)) for t, s in self.timeline),
                                key=lambda entry: entry[0]))
        object.__setattr__(self, "timeline", timeline)
        check_create(self.create)
        if self.outputs < 0:
            raise ValueError("outputs must be >= 0")
        if self.kie_msg_key not in ("msg", "message"):
            raise ValueError("kie_msg_key must be 'msg' or 'message'")

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["timeline"] = [list(entry) for entry in self.timeline]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Script:
        fields = dict(data)
        if "timeline" in fields:
            fields["timeline"] = [(float(t), str(s)) for t, s in fields["timeline"]]
        return cls(**fields)


@dataclass(frozen=True, init=False)
class SimSecrets:
    """The secrets the simulator signs webhooks with (give the same ones to the verifier).

    Each provider's default is its simulator module's
    (:attr:`~reconcile.testing.sim_registry.SimWebhooks.secret`): nothing here lists the
    families. Override one with ``webhook_secrets={provider: secret}`` or by the setting it
    fills (``SimSecrets(kie_webhook_hmac_key="k1")``); read one with :meth:`webhook_secret` or
    by that setting's name (``secrets.kie_webhook_hmac_key``). ``fal_key_seed``: 32 bytes for a
    fixed fal ED25519 signing key (None: a new key)."""

    webhook_secrets: Mapping[str, str]
    fal_key_seed: bytes | None

    def __init__(self, webhook_secrets: Mapping[str, str] | None = None, *,
                 fal_key_seed: bytes | None = None, **by_setting: str) -> None:
        secrets = dict(webhook_secrets or {})
        for setting, value in by_setting.items():
            secrets[_provider_of_setting(setting)] = value
        object.__setattr__(self, "webhook_secrets", secrets)
        object.__setattr__(self, "fal_key_seed", fal_key_seed)

    def __getattr__(self, name: str) -> str:
        """A registered provider's secret by the setting it fills (``kie_webhook_hmac_key``)."""
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self.webhook_secret(_provider_of_setting(name))
        except TypeError:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}") \
                from None

    @property
    def fal_user_id(self) -> str:
        """fal's account id (the ``fal_webhook_user_id`` setting): its deliveries' signed user."""
        return self.webhook_secret("fal")

    def webhook_secret(self, provider: str) -> str:
        """The value of ``provider``'s registered ``secret_setting`` (fal: the account id)."""
        hooks = sim_registry.webhooks_for(provider)
        if hooks is None or hooks.secret is None:
            raise LookupError(f"no simulator webhook secret is registered for {provider!r}")
        if provider in self.webhook_secrets:
            return self.webhook_secrets[provider]
        return hooks.secret(self) if callable(hooks.secret) else hooks.secret

    def settings_env(self) -> dict[str, str]:
        """Each registered provider's webhook setting, as the library reads it."""
        sim_registry.load_builtin(strict=False)
        return {sim_registry.env_name(hooks.secret_setting): self.webhook_secret(hooks.provider)
                for hooks in sim_registry.registered_webhooks() if hooks.secret_setting}


def _provider_of_setting(setting: str) -> str:
    """The provider whose registered webhooks are verified with ``setting``; TypeError (as for
    an unknown keyword) when none is."""
    sim_registry.load_builtin(strict=False)
    for hooks in sim_registry.registered_webhooks():
        if hooks.secret_setting == setting:
            return hooks.provider
    raise TypeError(f"SimSecrets: no registered provider's webhooks are verified with {setting!r}")


@dataclass
class Task:
    """One upstream task as the simulator holds it (inspect, never mutate, from tests)."""

    task_id: str
    provider: str  # the family (SimWebhooks.provider): a built-in one, or a registered one
    api: str  # kie-market, kie-veo, …, replicate-prediction, elevenlabs-dubbing, fal-queue …
    model: str
    job_id: str | None
    callback_url: str | None
    body: Mapping[str, Any]
    script: Script
    created_at: float  # simulator clock
    created_wall: datetime
    scale: float = 1.0
    forced: tuple[float, str] | None = None  # (clock, state) set by set_state: wins from then on
    webhook_sent: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def state_at(self, now: float) -> tuple[str, float]:
        """(state, clock time it was entered) at clock ``now``."""
        if self.forced is not None and self.forced[0] <= now:
            return self.forced[1], self.forced[0]
        state, since = "queued", self.created_at
        for offset, entry in self.script.timeline:
            at = self.created_at + offset * self.scale
            if at > now:
                break
            state, since = entry, at
        return state, since

    def first_at(self, states: frozenset[str] | set[str], now: float) -> tuple[str, float] | None:
        """The first (state, clock time) among ``states`` reached by ``now``, or None."""
        if self.forced is not None and self.forced[0] <= now:
            before = self._timeline_first(states, self.forced[0])
            if before is not None:
                return before
            return (self.forced[1], self.forced[0]) if self.forced[1] in states else None
        return self._timeline_first(states, now)

    def _timeline_first(self, states: frozenset[str] | set[str], now: float) -> tuple[str, float] | None:
        for offset, entry in self.script.timeline:
            at = self.created_at + offset * self.scale
            if at > now:
                return None
            if entry in states:
                return entry, at
        return None

    def wall(self, clock_time: float) -> datetime:
        return self.created_wall + timedelta(seconds=max(0.0, clock_time - self.created_at))

    def summary(self, now: float) -> dict[str, Any]:
        state, _ = self.state_at(now)
        return {
            "task_id": self.task_id, "provider": self.provider, "api": self.api,
            "model": self.model, "job_id": self.job_id, "callback_url": self.callback_url,
            "state": state, "created_at": iso(self.created_wall),
            "webhook_sent": self.webhook_sent,
        }


@dataclass(frozen=True)
class Request:
    method: str
    path: str  # below the provider prefix, e.g. "/api/v1/jobs/createTask"
    query: Mapping[str, str]
    headers: Mapping[str, str]  # lower-cased names
    body: bytes

    def json(self) -> Any:
        try:
            return json.loads(self.body or b"null")
        except ValueError:
            return None

    def header(self, name: str) -> str:
        return self.headers.get(name.lower(), "")


@dataclass
class Response:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    drop: bool = False  # close the connection without answering
    latency: float = 0.0


def json_response(status: int, payload: Any, headers: Mapping[str, str] | None = None) -> Response:
    body = json.dumps(payload, separators=(",", ":")).encode()
    return Response(status, body, {"Content-Type": "application/json", **(headers or {})})


def retry_after_header(script: Script) -> dict[str, str]:
    return {"Retry-After": str(max(0, math.ceil(script.retry_after)))}


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def millis(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def planted_job_id(value: Any) -> str | None:
    """The job id planted in a callback URL's ``job_id`` query parameter (also accepts a JSON
    object or mapping with ``job_id``, or ``job_id=<id>`` inside free text)."""
    if isinstance(value, Mapping):
        found = value.get("job_id")
        return str(found) if found else None
    if not isinstance(value, str) or not value:
        return None
    text = value.strip()
    if text.startswith("{"):
        try:
            return planted_job_id(json.loads(text))
        except ValueError:
            return None
    query = urlsplit(text).query if "://" in text or "?" in text else text
    for candidate in (query, text):
        found = parse_qs(candidate).get("job_id")
        if found:
            return found[0]
    return None


# --- media ------------------------------------------------------------------------------------

def _png() -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))
    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)  # 1×1, 8-bit RGB
    pixels = zlib.compress(b"\x00\x20\x80\xc0")
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")


def _mp4() -> bytes:
    ftyp = b"ftypisom" + struct.pack(">I", 512) + b"isomiso2avc1mp41"
    mdat = b"mdat" + b"\x00" * 64
    return struct.pack(">I", 4 + len(ftyp)) + ftyp + struct.pack(">I", 4 + len(mdat)) + mdat


def _mp3() -> bytes:
    frame = b"\xff\xfb\x90\x64" + b"\x00" * 413  # one MPEG-1 layer III frame, 128 kbit/s
    return b"ID3\x03\x00\x00\x00\x00\x00\x00" + frame * 3


MEDIA: dict[str, tuple[str, bytes]] = {
    "png": ("image/png", _png()),
    "mp4": ("video/mp4", _mp4()),
    "mp3": ("audio/mpeg", _mp3()),
    "tar": ("application/x-tar", b"sim-weights\x00" * 16),
}

_VIDEO_WORDS = ("video", "veo", "kling", "runway", "luma", "lip", "avatar", "infinitalk", "wan",
                "hailuo", "seedance", "sora")
_AUDIO_WORDS = ("audio", "suno", "music", "speech", "tts", "sound", "voice", "song")


def media_ext(model: str) -> str:
    """The output file type a model name suggests: mp4, mp3 or png."""
    name = model.lower()
    if any(word in name for word in _VIDEO_WORDS):
        return "mp4"
    if any(word in name for word in _AUDIO_WORDS):
        return "mp3"
    return "png"


@dataclass(frozen=True)
class Rejection:
    """A create the script refused: ``kind`` is invalid | auth | rate_limit | server_error |
    kie_200_error (then ``code`` is the envelope code)."""

    kind: str
    script: Script
    code: int | None = None


def raw_status(state: str, mapping: Mapping[str, Any]) -> Any:
    """The provider's status for a simulator state; ``unknown:<raw>`` passes ``raw`` through."""
    if state.startswith("unknown:"):
        return state.split(":", 1)[1]
    if state == "vanished" and state not in mapping:
        # only a create's own answer renders a task that vanishes at once: it was queued
        return mapping["queued"]
    return mapping[state]


def int_or_raw(value: Any) -> Any:
    text = str(value)
    return int(text) if text.lstrip("-").isdigit() else value


def base_urls_for(url: str) -> dict[str, str]:
    """The settings environment that points every client at a simulator running at ``url``:
    each registered route's ``url_settings``, and the media host. A built-in family's URL
    setting no route names (its simulator module did not load) points at ``{url}/<family>``,
    which answers 404: never at the real provider."""
    from ..providers.family import families

    host = urlsplit(url).hostname or "127.0.0.1"
    sim_registry.load_builtin(strict=False)
    env = {sim_registry.env_name(setting): f"{url}/{family.name}"
           for family in families() for setting in family.urls}
    env.update({sim_registry.env_name(setting): f"{url}/{route.prefix}{path}"
                for route in sim_registry.routes() for setting, path in route.url_settings.items()})
    # every port: the simulator picks a free one
    env["RECONCILE_MEDIA_ALLOWED_HOSTS"] = json.dumps([f"{host}:*"])
    return env
