"""A kind's provider family is a field, and every webhook scheme is found through the registry
(issue 17): no behaviour hangs on a kind name's prefix."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from reconcile import Kind, webhooks
from reconcile.errors import WebhookPayloadError
from reconcile.kinds import BUILTIN_KINDS, BUILTIN_PROVIDERS, all_kinds, get_kind, provider_of

NOW = datetime(2031, 5, 6, 7, 8, 9, tzinfo=UTC)


def _kind(name: str, **fields: object) -> Kind:
    return Kind(name, False, timedelta(minutes=1), None, None, None, "unused:unused",
                **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", BUILTIN_KINDS)
def test_a_shipped_kind_keeps_its_family(name: str) -> None:
    kind = get_kind(name)
    assert kind is not None
    assert kind.provider == name.split("-")[0] == provider_of(name)
    assert kind.echo_check is None  # its scheme decides, as before


def test_every_async_kind_has_a_webhook_scheme_for_its_family() -> None:
    for kind in all_kinds():
        if not kind.sync:
            scheme = webhooks.get_scheme(kind.provider)
            assert scheme is not None and scheme.provider == kind.provider, kind.name


def test_the_family_is_a_field_not_a_prefix() -> None:
    assert _kind("studio-render", provider="testfam").provider == "testfam"
    assert _kind("testfam").provider == "testfam"
    assert provider_of(None) is None and provider_of("") is None
    assert provider_of("gone-kind") == "gone"  # rows of a kind no longer registered


# the evidence facts of the first four shipped schemes (a later family pins its own in its tests)
ECHO = {"replicate": True, "kie": True, "elevenlabs": True, "fal": False}


def test_the_shipped_schemes_and_their_evidence_facts() -> None:
    """One shipped scheme per built-in family with async kinds (the families come from the
    kinds, pinned in test_kinds.EXPECTED), found without a list in reconcile.webhooks."""
    async_families = {get_kind(n).provider for n in BUILTIN_KINDS if not get_kind(n).sync}  # type: ignore[union-attr]
    assert set(webhooks.PROVIDERS) == async_families
    assert len(webhooks.PROVIDERS) == len(set(webhooks.PROVIDERS))
    assert set(webhooks.PROVIDERS) <= set(BUILTIN_PROVIDERS)
    echo = {p: webhooks.get_scheme(p).echo_check for p in webhooks.PROVIDERS}  # type: ignore[union-attr]
    assert {p: echo[p] for p in ECHO} == ECHO


def test_verify_dispatches_through_the_registry() -> None:
    seen: list[tuple[object, dict[str, object]]] = []

    def verify(headers, body, query, key, now, **options):  # type: ignore[no-untyped-def]
        seen.append((key, options))
        return webhooks.event("probe", delivery_id="d", task_id="t", planted=None, status="ok",
                              outcome=webhooks.SUCCEEDED, error=None, payload={}, signed_body=True)

    with pytest.raises(WebhookPayloadError, match="no webhook scheme for provider 'probe'"):
        webhooks.verify("probe", {}, b"{}", {}, "k", NOW)
    webhooks.register_webhook_scheme(webhooks.WebhookScheme("probe", verify, lambda rt: "k"))
    try:
        event = webhooks.verify("probe", {}, b"{}", {}, "k", NOW, fal_user_id="ignored")
        assert event.succeeded is True and event.failed is False and event.provider == "probe"
        assert seen == [("k", {})]  # fal's account id reaches fal's scheme only
    finally:
        webhooks.unregister_webhook_scheme("probe")
    assert webhooks.get_scheme("probe") is None


@pytest.mark.parametrize("name", ["", "a/b"])
def test_a_scheme_needs_a_path_safe_name(name: str) -> None:
    with pytest.raises(ValueError, match="path-safe"):
        webhooks.register_webhook_scheme(webhooks.WebhookScheme(name, print, lambda rt: None))
