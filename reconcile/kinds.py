"""The ``provider_kind`` registry (README, Design notes: Thresholds and URL lifetimes).

A kind says whether the call is sync or async, how long before a job of that kind is stale,
how often to poll, how long its result URLs live, where the job id is planted for the provider
to echo back, and how to build its client. A platform registers its own with
:func:`register_kind`.

A kind also names its provider family (:attr:`Kind.provider`): the value stored in
``jobs.provider``, the last path segment of the webhook URL planted in its creates, and the
name of the webhook scheme (:mod:`reconcile.webhooks`) that verifies its deliveries. It
defaults to the kind name's first ``-`` segment (``kie-veo`` → ``kie``), so every shipped kind
keeps its family; a platform kind named otherwise sets it. Nothing else reads the name's prefix.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import requests

    from .providers.base import AsyncProvider, SyncProvider
    from .settings import Settings
    from .webhooks import WebhookScheme

ClientFactory = Callable[["Settings", "requests.Session | None"], Any]

MIN = timedelta(minutes=1)
SEC = timedelta(seconds=1)


@dataclass(frozen=True)
class Kind:
    name: str
    sync: bool
    stale_threshold: timedelta
    poll_interval: timedelta | None
    # None: no URL to fetch (sync) or unbounded (ElevenLabs: while the dubbing exists)
    result_url_lifetime: timedelta | None
    plant: str | None  # where the job id is planted for the provider to echo it back
    client: str  # "module:factory" resolved lazily, or set ``factory``
    factory: ClientFactory | None = field(default=None, compare=False)
    # (after, interval): poll less often as a job ages (KIE: 2–3 s early, 15–30 s later)
    backoff: tuple[tuple[timedelta, timedelta], ...] = ()
    # The provider family: jobs.provider, the webhook path segment and the webhook scheme's
    # name. "" (the default) means the name's first "-" segment.
    provider: str = ""
    # Whether a stored delivery the provider's signature does not bind to a job may be bound by
    # a read of the task echoing the planted job id (KIE, ElevenLabs). None: the provider's
    # webhook scheme decides (:attr:`reconcile.webhooks.WebhookScheme.echo_check`).
    echo_check: bool | None = None
    # The binding fields: the create fields the library writes itself because the provider
    # echoes them back as what ties a delivery or a read to this job (README "Webhook fields
    # that are trusted"). An input setting one is refused at submit (:func:`binding_key`).
    # Every built-in kind declares its row (``()``: it plants nothing); None is a platform kind
    # that declares none.
    binds: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if not self.provider:
            object.__setattr__(self, "provider", family_of_name(self.name))

    def build(self, settings: Settings, session: requests.Session | None = None) -> AsyncProvider | SyncProvider:
        factory = self.factory
        if factory is None:
            module_name, _, attr = self.client.partition(":")
            factory = getattr(importlib.import_module(module_name), attr)
        client: AsyncProvider | SyncProvider = factory(settings, session)
        return client

    def interval_at(self, age: timedelta) -> timedelta:
        """The poll interval for a job that has been running ``age``."""
        for after, interval in self.interval_steps():
            if after is None or age >= after:
                return interval
        raise AssertionError("interval_steps ends with an unconditional step")

    def interval_steps(self) -> tuple[tuple[timedelta | None, timedelta], ...]:
        """``(age, interval)`` in the order they are tried: the first step whose age a job has
        reached applies (the last backoff entry reached wins); ``None``, last, is any age."""
        return (*((after, slower) for after, slower in reversed(self.backoff)),
                (None, self.poll_interval or timedelta(seconds=5)))


def binding_key(kind: Kind, key: str) -> str | None:
    """The binding field of ``kind`` an input key would set, or None.

    Matched as the provider might read it: any letter case, surrounding blanks ignored, and
    ``<field>_base64`` (which the ElevenLabs client sends as a part named ``<field>``)."""
    name = key.strip().casefold()
    name = name.removesuffix("_base64").strip()
    return next((f for f in kind.binds or () if f.casefold() == name), None)


def family_of_name(name: str | None) -> str:
    """The default provider family of a kind name: its first ``-`` segment."""
    return (name or "").split("-", 1)[0]


H24 = timedelta(hours=24)
H1 = timedelta(hours=1)
_KIE_BACKOFF = ((2 * MIN, 15 * SEC),)
# Each kind's binding fields (README "Webhook fields that are trusted"): KIE's record echoes the
# body's callBackUrl; Replicate's prediction echoes ``webhook`` (and its filter); an ElevenLabs
# dubbing echoes ``name``, a speech-to-text webhook ``webhook_metadata`` (``webhook`` turns it
# on); fal's webhook is the ``fal_webhook`` query parameter. Sync kinds plant nothing.
_KIE_BINDS = ("callBackUrl",)
_REPLICATE_BINDS = ("webhook", "webhook_events_filter")
_ELEVENLABS_BINDS = ("name", "webhook_metadata", "webhook")
_FAL_BINDS = ("fal_webhook",)


def _kie(name: str, threshold: int, interval: int, api: str) -> Kind:
    return Kind(
        name=name,
        sync=False,
        stale_threshold=threshold * MIN,
        poll_interval=interval * SEC,
        result_url_lifetime=H24,
        plant="callBackUrl query",
        client=f"reconcile.providers.kie:{api}",
        backoff=_KIE_BACKOFF if interval < 15 else (),
        binds=_KIE_BINDS,
    )


_BUILTIN: tuple[Kind, ...] = (
    _kie("kie-standard", 10, 5, "market_client"),
    _kie("kie-veo", 25, 10, "veo_client"),
    _kie("kie-suno", 30, 10, "suno_client"),
    _kie("kie-kontext", 10, 5, "kontext_client"),
    _kie("kie-luma", 25, 15, "luma_client"),
    _kie("kie-kling3", 25, 10, "market_client"),
    _kie("kie-runway", 25, 10, "runway_client"),
    _kie("kie-lip-sync", 75, 15, "market_client"),
    Kind("kie-llm", True, 5 * MIN, None, None, None, "reconcile.providers.kie:llm_client",
         binds=()),
    Kind("replicate-prediction", False, 20 * MIN, 3 * SEC, H1, "webhook query",
         "reconcile.providers.replicate:prediction_client", binds=_REPLICATE_BINDS),
    Kind("replicate-training", False, 30 * MIN, 15 * SEC, H1, "webhook query",
         "reconcile.providers.replicate:training_client", binds=_REPLICATE_BINDS),
    Kind("elevenlabs-async", False, 15 * MIN, 10 * SEC, None, "STT webhook_metadata",
         "reconcile.providers.elevenlabs:async_client", binds=_ELEVENLABS_BINDS),
    Kind("elevenlabs-sync", True, 5 * MIN, None, None, None,
         "reconcile.providers.elevenlabs:sync_client", binds=()),
    Kind("anthropic-sync", True, 5 * MIN, None, None, None,
         "reconcile.providers.anthropic:sync_client", binds=()),
    Kind("fal-queue", False, 20 * MIN, 3 * SEC, H1, "fal_webhook query",
         "reconcile.providers.fal:queue_client", binds=_FAL_BINDS),
)

_REGISTRY: dict[str, Kind] = {k.name: k for k in _BUILTIN}

BUILTIN_KINDS: tuple[str, ...] = tuple(k.name for k in _BUILTIN)
# The shipped provider families, in the order their first kind appears above. A family is one
# plug-in unit: its client module (each kind's ``client``), its webhook scheme
# (``reconcile/webhooks/<family>.py``, found by :mod:`reconcile.webhooks` itself) and its
# simulator module (``reconcile/testing/sim_<family>.py``, loaded through this tuple). A new
# built-in family is a kind here plus those modules; nothing else lists the families.
BUILTIN_PROVIDERS: tuple[str, ...] = tuple(dict.fromkeys(k.provider for k in _BUILTIN))


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
