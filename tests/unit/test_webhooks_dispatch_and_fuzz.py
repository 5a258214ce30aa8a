"""Webhook verification as a whole: ``verify`` dispatches by provider and refuses an unknown
one, the payload digest, the declared schemes are the registered ones; and fuzzing every scheme:
arbitrary deliveries raise only WebhookError, correctly signed odd bodies parse or raise
WebhookPayloadError.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from reconcile.errors import WebhookError, WebhookPayloadError
from reconcile.webhooks import WebhookEvent, payload_digest, verify
from tests.unit._webhook_signing import (
    EL_SECRET,
    KEY_A,
    KIE_KEY,
    KIE_MARKET,
    NOW,
    REPLICATE_SECRET,
    TS,
    el_headers,
    fal_headers,
    json_body,
    jwk,
    kie_headers,
    replicate_headers,
)

# -- dispatch and digest -------------------------------------------------------------------


def test_dispatch_routes_by_provider_and_refuses_unknown_ones() -> None:
    """verify() picks the scheme by name; an unknown provider is a payload error."""
    body = json_body(KIE_MARKET)
    assert verify("kie", kie_headers("task_abc"), body, {}, KIE_KEY, NOW).provider == "kie"
    with pytest.raises(WebhookPayloadError):
        verify("nosuchfamily", {}, body, {}, "k", NOW)


def test_payload_digest_is_sha256_hex() -> None:
    """The digest is the body's sha256 in hex."""
    assert payload_digest(b"abc") == hashlib.sha256(b"abc").hexdigest()


# -- fuzzing: only WebhookError escapes ----------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)
NAMES = [
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
    "X-Webhook-Timestamp",
    "X-Webhook-Signature",
    "ElevenLabs-Signature",
    "X-Fal-Webhook-Request-Id",
    "X-Fal-Webhook-User-Id",
    "X-Fal-Webhook-Timestamp",
    "X-Fal-Webhook-Signature",
]
header_values = st.one_of(
    st.text(max_size=40),
    st.integers(min_value=TS - 400, max_value=TS + 400).map(str),
    st.just(f"t={TS},v0=00"),
    st.just("v1,AAAA"),
)
arbitrary_headers = st.dictionaries(st.sampled_from(NAMES) | st.text(max_size=10), header_values)
bodies = st.binary(max_size=200) | json_values.map(lambda v: json.dumps(v).encode())
shaped_bodies = st.fixed_dictionaries(
    {},
    optional={
        "id": json_values,
        "status": json_values,
        "error": json_values,
        "type": json_values,
        "request_id": json_values,
        "code": json_values,
        "data": st.fixed_dictionaries(
            {},
            optional={
                "taskId": json_values,
                "task_id": json_values,
                "state": json_values,
                "successFlag": json_values,
                "callbackType": json_values,
                "transcription": json_values,
                "webhook_metadata": json_values,
                "request_id": json_values,
                "error": json_values,
            },
        ),
    },
).map(lambda d: json.dumps(d).encode())
KEYS: dict[str, Any] = {
    "replicate": REPLICATE_SECRET,
    "kie": KIE_KEY,
    "elevenlabs": EL_SECRET,
    "fal": {"keys": [jwk(KEY_A)]},
}


def _only_webhook_errors(provider: str, headers: dict[str, str], body: bytes) -> None:
    try:
        event = verify(provider, headers, body, {"job_id": "j"}, KEYS[provider], NOW)
    except WebhookError:
        return
    assert isinstance(event, WebhookEvent) and event.provider == provider


@pytest.mark.parametrize("provider", sorted(KEYS))
@settings(deadline=None, max_examples=150)
@given(headers=arbitrary_headers, body=bodies | shaped_bodies)
def test_fuzz_arbitrary_deliveries_raise_only_webhook_errors(
    provider: str, headers: dict[str, str], body: bytes
) -> None:
    """Garbage headers and bodies are refused with a WebhookError, never a crash."""
    _only_webhook_errors(provider, headers, body)


SIGNERS = {
    "replicate": replicate_headers,
    "kie": lambda body: kie_headers(_kie_task_id(body)),
    "elevenlabs": el_headers,
    "fal": lambda body: fal_headers(body, KEY_A),
}


def _kie_task_id(body: bytes) -> str:
    try:
        data = json.loads(body).get("data") or {}
        value = data.get("taskId") or data.get("task_id")
    except (ValueError, AttributeError):
        return ""
    return value if isinstance(value, str) else ""


@pytest.mark.parametrize("provider", sorted(KEYS))
@settings(deadline=None, max_examples=150)
@given(body=bodies | shaped_bodies)
def test_fuzz_correctly_signed_odd_bodies_parse_or_raise_payload_errors(
    provider: str, body: bytes
) -> None:
    """A genuinely signed but oddly shaped body parses or is a WebhookPayloadError."""
    try:
        event = verify(provider, SIGNERS[provider](body), body, {}, KEYS[provider], NOW)
    except WebhookPayloadError:
        return
    assert event.signed_body is (provider != "kie")


def test_a_declared_scheme_is_registered_and_a_foreign_one_is_refused() -> None:
    """atk2: PROVIDERS is "what the families declared", and each one is served. (Before the
    declarations, the package scanned its own modules for ``SCHEME``: a module defining one but
    never registering it — dropped there by mistake, a new family's forgotten foot line — made
    PROVIDERS name a provider whose deliveries every route refused as unknown, a silent drop of
    that provider's webhooks, and the scan refused to load such a package.) Now a family's
    scheme is registered from its declaration, and a declaration naming another provider's
    scheme is refused where it is written."""
    from datetime import timedelta as _timedelta

    import reconcile.webhooks as package
    from reconcile.providers.family import Kind, ProviderFamily, families
    from reconcile.webhooks import WebhookScheme

    declared = {f.name: f.webhook for f in families() if f.webhook is not None}
    assert set(package.PROVIDERS) == set(declared) and declared
    for name, scheme in declared.items():
        assert package.get_scheme(name) is scheme
    stray = WebhookScheme("atk2stray", verify=lambda *a, **k: None, secret=lambda rt: "x")
    kind = Kind("atk2-render", False, _timedelta(minutes=1), None, None, None, "unused:unused")
    with pytest.raises(ValueError, match="atk2stray"):
        ProviderFamily("atk2", kinds=(kind,), webhook=stray)
    assert package.get_scheme("atk2stray") is None and package.get_scheme("atk2") is None
