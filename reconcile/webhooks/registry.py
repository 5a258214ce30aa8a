"""Internal: the library's own mechanics, not an import path for platforms (may move).

The webhook scheme registry: one :class:`WebhookScheme` per provider family.

A scheme is everything the library knows about one provider's webhooks: how a delivery is
verified and parsed, where its secret comes from, and what (if anything) the provider signs that
ties a stored delivery to a job — the facts :mod:`reconcile.jobstore.evidence` and the sweep judge an
``uncertain`` job's evidence by. A built-in family's scheme is the ``webhook`` of its declaration
(:class:`~reconcile.providers.family.ProviderFamily`), registered when :mod:`reconcile.webhooks`
is imported; a platform adds its own with :func:`register_webhook_scheme` (or
``register_kind(kind, webhook=scheme)``), and :func:`reconcile.webhook_ingest.handle_webhook`
serves it on the path segment ``scheme.provider`` — the same value as the provider kind's
:attr:`~reconcile.kinds.Kind.provider`.
"""

from __future__ import annotations

from ..providers.scheme import Binding, Verifier, WebhookScheme, from_settings

_SCHEMES: dict[str, WebhookScheme] = {}


def register_webhook_scheme(scheme: WebhookScheme, *, replace: bool = False) -> None:
    """Serve ``scheme`` on the webhook path ``scheme.provider``; refuses to shadow one unless
    ``replace``."""
    if not scheme.provider or "/" in scheme.provider:
        raise ValueError(f"a webhook scheme needs a path-safe provider name, not {scheme.provider!r}")
    current = _SCHEMES.get(scheme.provider)
    if current is not None and current != scheme and not replace:
        raise ValueError(f"webhook scheme {scheme.provider!r} is already registered")
    _SCHEMES[scheme.provider] = scheme


def unregister_webhook_scheme(provider: str) -> None:
    _SCHEMES.pop(provider, None)


def get_scheme(provider: str | None) -> WebhookScheme | None:
    """The scheme served on ``provider``'s path, or None when there is none."""
    return _SCHEMES.get(provider) if provider else None


def schemes() -> tuple[WebhookScheme, ...]:
    return tuple(_SCHEMES.values())


__all__ = [
    "Binding",
    "Verifier",
    "WebhookScheme",
    "from_settings",
    "get_scheme",
    "register_webhook_scheme",
    "schemes",
    "unregister_webhook_scheme",
]
