"""Internal: the library's own mechanics, not an import path for platforms (may move).

The webhook scheme registry: one :class:`WebhookScheme` per provider family.

A scheme is everything the library knows about one provider's webhooks: how a delivery is
verified and parsed, where its secret comes from, and what (if anything) the provider signs that
ties a stored delivery to a job — the facts :mod:`reconcile.jobstore.evidence` and the sweep judge an
``uncertain`` job's evidence by. The shipped schemes register themselves when
:mod:`reconcile.webhooks` is imported (it imports every public module of its package: a
built-in family's scheme is one new module there, ``SCHEME`` registered at its foot); a
platform adds its own with
:func:`register_webhook_scheme` (or ``register_kind(kind, webhook=scheme)``), and
:func:`reconcile.webhook_ingest.handle_webhook` serves it on the path segment ``scheme.provider``
— the same value as the provider kind's :attr:`~reconcile.kinds.Kind.provider`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ._common import WebhookEvent

if TYPE_CHECKING:
    from ..kinds import Kind
    from ..runtime import Runtime
    from ..settings import Settings

# (headers, body, query, key, now, **options) -> WebhookEvent; raises a WebhookError subclass
Verifier = Callable[..., WebhookEvent]


@dataclass(frozen=True)
class Binding:
    """What ties a stored delivery to a job: the signed field, and the read that confirms it.

    ``signed_field``: the field the provider's signature covers that names the job (None: none).
    ``confirming_read``: the read of the task that echoes the planted job id (None: none).
    """

    signed_field: str | None
    confirming_read: str | None


def _no_options(settings: Settings) -> Mapping[str, Any]:
    return {}


def _nothing_signed(payload: Mapping[str, Any], job_id: str | None, settings: Settings) -> None:
    return None


def _any_kind(payload: Mapping[str, Any], kind: Kind) -> bool:
    return True


def _unchanged(payload: dict[str, Any], settings: Settings) -> dict[str, Any]:
    return payload


@dataclass(frozen=True)
class WebhookScheme:
    """One provider family's webhooks.

    - ``verify(headers, body, query, key, now, **options)`` → :class:`WebhookEvent`, or raises a
      :class:`~reconcile.errors.WebhookError` subclass (never anything else for bad input);
    - ``secret(rt)``: the ``key`` ingestion hands to ``verify`` (None/empty: fail closed);
    - ``options(settings)``: extra keyword arguments for ``verify`` (fal: the account id);
    - ``keywords``: keyword arguments of :func:`reconcile.webhooks.verify` this scheme's
      ``verify`` takes under its own name (fal: ``fal_user_id`` → ``user_id``); ``verify``
      hands them to this scheme only and drops them for every other one;
    - ``binding``: the evidence table's row (README "Security model");
    - ``signed_job_id(payload, stored_job_id, settings)``: the job id the signature itself ties a
      stored delivery to, or None;
    - ``same_kind(payload, kind)``: False when the body says it is for another kind of the family;
    - ``stamp(payload, settings)``: what ingestion records with the stored payload.
    """

    provider: str
    verify: Verifier
    secret: Callable[[Runtime], Any]
    binding: Binding = Binding(None, None)
    options: Callable[[Settings], Mapping[str, Any]] = field(default=_no_options, compare=False)
    signed_job_id: Callable[[Mapping[str, Any], str | None, Settings], str | None] = field(
        default=_nothing_signed, compare=False)
    same_kind: Callable[[Mapping[str, Any], Kind], bool] = field(default=_any_kind, compare=False)
    stamp: Callable[[dict[str, Any], Settings], dict[str, Any]] = field(
        default=_unchanged, compare=False)
    keywords: Mapping[str, str] = field(default_factory=dict, compare=False)

    @property
    def echo_check(self) -> bool:
        """A delivery not bound by the signature may be bound by a read echoing the job id."""
        return self.binding.confirming_read is not None


def from_settings(attribute: str) -> Callable[[Runtime], Any]:
    """A ``secret`` that is one attribute of the runtime's settings (an HMAC key, say)."""

    def secret(rt: Runtime) -> Any:
        return getattr(rt.settings, attribute)

    secret.__qualname__ = f"from_settings({attribute!r})"
    return secret


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
