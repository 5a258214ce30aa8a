"""Webhook signature schemes: verify a delivery and parse it into a :class:`WebhookEvent`.

Verification and parsing only: storing deliveries, deduping them and finishing jobs happen
elsewhere (:mod:`reconcile.webhook_ingest`). Every verifier takes the raw ``headers`` (looked up
case-insensitively), the raw ``body`` bytes, the callback URL's ``query`` (where the library
plants ``job_id``), the secret and an injected ``now``; it returns a :class:`WebhookEvent` or
raises a :class:`~reconcile.errors.WebhookError` subclass — never anything else for bad input.

Each provider family owns its scheme (verify, where its secret comes from, what it signs that
binds a delivery to a job) in its own package, ``reconcile/providers/<family>/webhook.py``, and
declares it as its ``FAMILY.webhook`` (:mod:`reconcile.providers.family`). Importing this package
registers every built-in family's scheme (nothing here lists them) and re-exports the public
names of each family's webhook module (its ``__all__`` but ``SCHEME``: ``verify_kie``,
``JwksCache`` …); :data:`PROVIDERS` is the families that declare one. Each webhook module says
what its provider signs and for how long (Replicate: Standard Webhooks over the body, ±5 min;
KIE: ``{taskId}.{timestamp}`` only, ±5 min; ElevenLabs: ``{t}.{body}``, ±30 min; fal: Ed25519
by fal's JWKS, ±300 s).

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

import sys
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from ..errors import WebhookPayloadError
from ..providers.family import families
from ..providers.scheme import (
    FAILED,
    MAX_DEPTH,
    RUNNING,
    SUCCEEDED,
    Binding,
    WebhookEvent,
    WebhookScheme,
    event,
    fresh_timestamp,
    from_settings,
    header,
    hmac_sha256,
    json_object,
    payload_digest,
    require_secret,
    required_headers,
)
from .registry import (
    get_scheme,
    register_webhook_scheme,
    schemes,
    unregister_webhook_scheme,
)


def _family_exports() -> dict[str, Any]:
    """Register every built-in family's scheme; the public names of each family's webhook module
    (the module defining its ``verify``: its ``__all__`` but ``SCHEME``), re-exported here."""
    found: dict[str, Any] = {}
    for family in families():
        scheme = family.webhook
        if scheme is None:
            continue
        register_webhook_scheme(scheme)
        module = sys.modules[scheme.verify.__module__]
        for name in getattr(module, "__all__", ()):
            if name != "SCHEME":
                if name in found:
                    raise ImportError(f"{module.__name__} exports {name!r}, which another "
                                      f"family's webhook module exports too")
                found[name] = getattr(module, name)
    return found


_EXPORTS = _family_exports()

# The shipped schemes, by family name (a platform's own are in ``schemes()`` too).
PROVIDERS: tuple[str, ...] = tuple(sorted(f.name for f in families() if f.webhook is not None))


def __getattr__(name: str) -> Any:
    """A built-in family's webhook name (``reconcile.webhooks.verify_kie`` …)."""
    try:
        return _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


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
    "FAILED",
    "MAX_DEPTH",
    "PROVIDERS",
    "RUNNING",
    "SUCCEEDED",
    "Binding",
    "WebhookEvent",
    "WebhookScheme",
    "event",
    "fresh_timestamp",
    "from_settings",
    "get_scheme",
    "header",
    "hmac_sha256",
    "json_object",
    "payload_digest",
    "register_webhook_scheme",
    "require_secret",
    "required_headers",
    "schemes",
    "unregister_webhook_scheme",
    "verify",
    *sorted(_EXPORTS),
]
