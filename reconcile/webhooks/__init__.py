"""Webhook signature schemes: verify a delivery and parse it into a :class:`WebhookEvent`.

Verification and parsing only: storing deliveries, deduping them and finishing jobs happen
elsewhere (:mod:`reconcile.webhook_ingest`). Every verifier takes the raw ``headers`` (looked up
case-insensitively), the raw ``body`` bytes, the callback URL's ``query`` (where the library
plants ``job_id``), the secret and an injected ``now``; it returns a :class:`WebhookEvent` or
raises a :class:`~reconcile.errors.WebhookError` subclass — never anything else for bad input.

One module per provider owns its scheme (verify, where its secret comes from, what it signs
that binds a delivery to a job) and registers it in :mod:`.registry`. Every public module of this
package is such a module: importing the package imports each of them (nothing here lists them),
and :data:`PROVIDERS` is what they registered. The shipped ones:

- :mod:`.replicate`: HMAC-SHA256 of ``{webhook-id}.{webhook-timestamp}.{body}`` (Standard
  Webhooks, base64, ``v1,`` entries); ±5 min; body signed.
- :mod:`.kie`: base64 HMAC-SHA256 of ``{taskId}.{X-Webhook-Timestamp}``; ±5 min; body **not**
  signed.
- :mod:`.elevenlabs`: hex HMAC-SHA256 of ``{t}.{body}`` (``ElevenLabs-Signature: t=…,v0=…``);
  ±30 min; body signed.
- :mod:`.fal`: Ed25519 over ``{request_id}\\n{user_id}\\n{timestamp}\\n{sha256_hex(body)}`` by
  any key of fal's JWKS; ±300 s; body signed.

KIE signs only the task id and the timestamp, so its status fields are hints
(``signed_body=False``): re-read the task before acting on it. ``planted_job_id`` comes from
the unsigned callback URL (or ElevenLabs' echoed metadata), so it is a hint too: match the
event's ``task_id`` against the job's stored upstream id before finishing anything.

A platform adds a provider family's webhooks with :func:`register_webhook_scheme` (or
``register_kind(kind, webhook=scheme)``); the shared checks a scheme should refuse bad input
with are here too (:func:`header`, :func:`require_secret`, :func:`fresh_timestamp`,
:func:`json_object`, :func:`hmac_sha256`).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from datetime import datetime
from types import ModuleType
from typing import Any

from ..errors import WebhookPayloadError
from ._common import (
    FAILED,
    MAX_DEPTH,
    RUNNING,
    SUCCEEDED,
    WebhookEvent,
    _event,
    _header,
    _hmac_sha256,
    _json_object,
    _require_secret,
    _required,
    _timestamp,
    payload_digest,
)
from .elevenlabs import DUBBING_NAME_PREFIX, ELEVENLABS_TOLERANCE, verify_elevenlabs
from .fal import (
    FAL_CHECKED_USER,
    FAL_TOLERANCE,
    JWKS_FAILURE_TTL,
    JWKS_MAX_AGE,
    JWKS_MAX_BYTES,
    JWKS_MIN_REFRESH,
    JwksCache,
    parse_jwks,
    verify_fal,
)
from .kie import KIE_TOLERANCE, verify_kie
from .registry import (
    Binding,
    WebhookScheme,
    from_settings,
    get_scheme,
    register_webhook_scheme,
    schemes,
    unregister_webhook_scheme,
)
from .replicate import REPLICATE_TOLERANCE, verify_replicate


def _builtin_scheme_modules() -> tuple[ModuleType, ...]:
    """Every public module of this package that defines a ``SCHEME`` (importing it registers
    it), by module name: a built-in provider family's webhooks need no line here. A module
    whose ``SCHEME`` is not the one registered for its provider (never registered: a stray
    module, a forgotten foot line) fails the import, rather than name a provider whose
    deliveries every route would refuse."""
    found = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if not info.name.startswith("_"):
            module = importlib.import_module(f"{__name__}.{info.name}")
            scheme = getattr(module, "SCHEME", None)
            if isinstance(scheme, WebhookScheme):
                if get_scheme(scheme.provider) != scheme:
                    raise ImportError(f"{module.__name__} defines the webhook scheme "
                                      f"{scheme.provider!r} but did not register it")
                found.append(module)
    return tuple(found)


# The shipped schemes, by module name (a platform's own are in ``schemes()`` too).
PROVIDERS: tuple[str, ...] = tuple(m.SCHEME.provider for m in _builtin_scheme_modules())

# Public names for the shared checks, for a platform's own scheme.
header = _header
required_headers = _required
require_secret = _require_secret
fresh_timestamp = _timestamp
json_object = _json_object
hmac_sha256 = _hmac_sha256
event = _event


def verify(
    provider: str,
    headers: Mapping[str, str],
    body: bytes,
    query: Mapping[str, str],
    key: Any,
    now: datetime,
    **options: Any,
) -> WebhookEvent:
    """Verify a delivery for ``provider``; ``key`` is its secret (fal: a JwksCache or JWKS).

    ``options`` reach the scheme's verifier as keyword arguments. A keyword a scheme takes
    under a name of its own (:attr:`WebhookScheme.keywords`: ``fal_user_id``, fal's
    ``user_id``, our account) reaches that scheme only and is ignored by every other one."""
    scheme = get_scheme(provider)
    if scheme is None:
        raise WebhookPayloadError(f"no webhook scheme for provider {provider!r}")
    foreign = {name for other in schemes() for name in other.keywords}
    renamed = {own: options[name] for name, own in scheme.keywords.items() if name in options}
    passed = {name: value for name, value in options.items() if name not in foreign}
    return scheme.verify(headers, body, query, key, now, **{**renamed, **passed})


__all__ = [
    "DUBBING_NAME_PREFIX",
    "ELEVENLABS_TOLERANCE",
    "FAILED",
    "FAL_CHECKED_USER",
    "FAL_TOLERANCE",
    "JWKS_FAILURE_TTL",
    "JWKS_MAX_AGE",
    "JWKS_MAX_BYTES",
    "JWKS_MIN_REFRESH",
    "KIE_TOLERANCE",
    "MAX_DEPTH",
    "PROVIDERS",
    "REPLICATE_TOLERANCE",
    "RUNNING",
    "SUCCEEDED",
    "Binding",
    "JwksCache",
    "WebhookEvent",
    "WebhookScheme",
    "event",
    "fresh_timestamp",
    "from_settings",
    "get_scheme",
    "header",
    "hmac_sha256",
    "json_object",
    "parse_jwks",
    "payload_digest",
    "register_webhook_scheme",
    "require_secret",
    "required_headers",
    "schemes",
    "unregister_webhook_scheme",
    "verify",
    "verify_elevenlabs",
    "verify_fal",
    "verify_kie",
    "verify_replicate",
]
