"""Internal: The ``provider_kind`` registry (README, Design notes: Thresholds and URL lifetimes).

A kind says whether the call is sync or async, how long before a job of that kind is stale,
how often to poll, how long its result URLs live, where the job id is planted for the provider
to echo back, and how to build its client. The built-in kinds are declared by their provider
families (``FAMILY.kinds`` in ``reconcile/providers/<family>/``,
:class:`~reconcile.providers.family.ProviderFamily`); a platform registers its own with
:func:`register_kind`.

A kind also names its provider family (:attr:`Kind.provider`): the value stored in
``jobs.provider``, the last path segment of the webhook URL planted in its creates, and the
name of the webhook scheme (:mod:`reconcile.webhooks`) that verifies its deliveries. It
defaults to the kind name's first ``-`` segment (``kie-veo`` → ``kie``), so every shipped kind
keeps its family; a platform kind named otherwise sets it. Nothing else reads the name's prefix.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import TYPE_CHECKING

from .providers.family import ClientFactory, Kind, families, family_of_name

if TYPE_CHECKING:
    from .settings import Settings
    from .webhooks import WebhookScheme


def binding_key(kind: Kind, key: str) -> str | None:
    """The binding field of ``kind`` an input key would set, or None.

    Matched as the provider might read it: any letter case, surrounding blanks ignored, and
    ``<field>_base64`` (which the ElevenLabs client sends as a part named ``<field>``)."""
    name = key.strip().casefold()
    name = name.removesuffix("_base64").strip()
    return next((f for f in kind.binds or () if f.casefold() == name), None)


# Each built-in family declares its kinds (``FAMILY.kinds`` in reconcile/providers/<family>/),
# with their thresholds, intervals, URL lifetimes and binding fields.
_BUILTIN: tuple[Kind, ...] = tuple(kind for family in families() for kind in family.kinds)

_REGISTRY: dict[str, Kind] = {k.name: k for k in _BUILTIN}

BUILTIN_KINDS: tuple[str, ...] = tuple(k.name for k in _BUILTIN)
# The shipped provider families, in :func:`reconcile.providers.family.families` order (their
# packages' names). A family is one package, reconcile/providers/<family>/, with one declaration
# (``FAMILY``); every list of the families derives from those declarations.
BUILTIN_PROVIDERS: tuple[str, ...] = tuple(family.name for family in families())


def register_kind(
    kind: Kind, *, replace: bool = False, webhook: WebhookScheme | None = None
) -> None:
    """Add a platform's own kind. Refuses to shadow an existing one unless ``replace``.

    ``webhook``: the provider family's webhook scheme, registered with it (its ``provider`` must
    be the kind's :attr:`Kind.provider`); a family's later kinds may leave it out.
    """
    if kind.name in _REGISTRY and not replace:
        raise ValueError(f"provider kind {kind.name!r} is already registered")
    if webhook is not None:
        if webhook.provider != kind.provider:
            raise ValueError(f"webhook scheme {webhook.provider!r} is not kind {kind.name!r}'s "
                             f"provider {kind.provider!r}")
        from .webhooks import register_webhook_scheme

        register_webhook_scheme(webhook, replace=replace)
    _REGISTRY[kind.name] = kind


def unregister_kind(name: str) -> None:
    _REGISTRY.pop(name, None)


def get_kind(name: str | None) -> Kind | None:
    """The kind named ``name``, or None when unknown (callers decide what unknown means)."""
    if name is None:
        return None
    return _REGISTRY.get(name)


def all_kinds() -> tuple[Kind, ...]:
    return tuple(_REGISTRY.values())


# README, Design notes: Sync calls and their deadline: a sync call's total deadline leaves this
# much of its kind's threshold unused, so the sweep never fails a call that is still running
DEADLINE_MARGIN = timedelta(seconds=60)


def check_sync_deadline(settings: Settings, kinds: Iterable[Kind] | None = None) -> None:
    """Start-up check: ``SYNC_DEADLINE`` (connect + every read of one sync call) must be at
    most each sync kind's threshold minus 60 s, and longer than ``CONNECT_TIMEOUT``.

    Raises ``ValueError`` naming the setting and the kind.
    """
    deadline = timedelta(seconds=settings.sync_deadline)
    if settings.connect_timeout >= settings.sync_deadline:
        raise ValueError(f"RECONCILE_SYNC_DEADLINE={settings.sync_deadline:g}s must exceed "
                         f"RECONCILE_CONNECT_TIMEOUT={settings.connect_timeout:g}s")
    for kind in kinds if kinds is not None else all_kinds():
        if kind.sync and deadline > kind.stale_threshold - DEADLINE_MARGIN:
            limit = (kind.stale_threshold - DEADLINE_MARGIN).total_seconds()
            raise ValueError(
                f"RECONCILE_SYNC_DEADLINE={settings.sync_deadline:g}s is longer than sync kind "
                f"{kind.name!r} allows: its threshold {kind.stale_threshold.total_seconds():g}s "
                f"minus 60 s = {limit:g}s (the sweep would fail calls still running)")


def provider_of(name: str | None) -> str | None:
    """The provider family of the kind named ``name`` (``jobs.provider``); None for no name.

    Resolved through the registry, so a platform kind's own :attr:`Kind.provider` counts; a name
    no longer registered falls back to its first ``-`` segment (what rows written before carry).
    """
    if not name:
        return None
    kind = _REGISTRY.get(name)
    return kind.provider if kind is not None else family_of_name(name)


__all__ = [
    "BUILTIN_KINDS",
    "BUILTIN_PROVIDERS",
    "ClientFactory",
    "Kind",
    "all_kinds",
    "binding_key",
    "family_of_name",
    "get_kind",
    "provider_of",
    "register_kind",
    "unregister_kind",
]


from .core.facade import names_moved as _names_moved  # noqa: E402

_names_moved(__name__)
