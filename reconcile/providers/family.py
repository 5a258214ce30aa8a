"""Internal: the library's own mechanics, not an import path for platforms (may move).

A provider family is one package with one registration.

Each built-in family is a package ``reconcile/providers/<name>/`` (its clients, its webhook
scheme in ``webhook.py``) whose ``__init__`` declares ``FAMILY = ProviderFamily(...)``: its
kinds, the :class:`~reconcile.settings.Settings` fields it reads, its webhook scheme, what its
results hold by default, and its simulator module. :data:`BUILTIN_FAMILIES` names the packages,
in order; :func:`families` loads their declarations, and every list of the families is derived
from them: the kinds (:mod:`reconcile.kinds`), the webhook schemes and their re-exports
(:mod:`reconcile.webhooks`), the output defaults (:mod:`reconcile.providers.outputs`), the
simulator's modules, settings and secrets (:mod:`reconcile.testing.sim_registry`) and the chaos
run's mix. ``tests/unit/test_provider_family.py`` checks the settings against
:class:`~reconcile.settings.Settings`, and ``tests/integration/test_provider_contract.py`` runs
the same contract over every family.

The family's name is used eight ways; each is declared here or refused at import:

1. the package ``reconcile.providers.<name>`` (listed in :data:`BUILTIN_FAMILIES`; its
   ``FAMILY.name`` must be the package's name);
2. every kind's name starts ``<name>-`` (``kie-veo``);
3. every kind's :attr:`Kind.provider` is ``<name>``: the value stored in ``jobs.provider``;
4. the webhook path segment, ``…/webhooks/<name>?job_id=…`` (its scheme's ``provider``);
5. the webhook scheme's name, :func:`reconcile.webhooks.get_scheme` (``<name>``);
6. every settings field starts ``<name>_``, so its variables are ``RECONCILE_<NAME>_…``;
7. the simulator module (``simulator``, a module name under ``reconcile.testing``), whose route
   answers under ``{simulator}/<name>/…``;
8. the output defaults and built-in declarations of :func:`~reconcile.providers.outputs.declared_output`
   are keyed by ``<name>``.

A name is lower-case letters and digits only: it is a path segment, an environment prefix and a
kind prefix at once.
"""

from __future__ import annotations

import importlib
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING

from .kind import ClientFactory, Kind, family_of_name
from .output_spec import MEDIA, OutputSpec

if TYPE_CHECKING:
    from .scheme import WebhookScheme

MIN = timedelta(minutes=1)
SEC = timedelta(seconds=1)
H1 = timedelta(hours=1)
H24 = timedelta(hours=24)


_NAME = re.compile(r"[a-z][a-z0-9]*")


@dataclass(frozen=True)
class ProviderFamily:
    """One provider family's declaration (``FAMILY`` in its package's ``__init__``).

    - ``name``: the family (the eight uses above);
    - ``kinds``: its provider kinds, in the order :data:`reconcile.kinds.BUILTIN_KINDS` lists them;
    - ``urls``: the :class:`~reconcile.settings.Settings` fields that point its clients (or a key
      fetch) at the provider — the simulator points every one of them at itself;
    - ``secrets``: its credentials and webhook secrets: redacted wherever the library logs or
      stores text (``Settings`` marks each ``Secret``; a test checks the two agree);
    - ``settings``: any other field it reads (fal: the account its webhooks are signed for);
    - ``webhook``: its webhook scheme (None: the family sends no webhooks);
    - ``output``: what a result holds when its endpoint declares nothing, and ``outputs`` the
      built-in declarations by endpoint prefix (:mod:`reconcile.providers.outputs`);
    - ``simulator``: the module under ``reconcile.testing`` that registers its simulator route
      and webhooks (None: none; every built-in family has one).
    """

    name: str
    kinds: tuple[Kind, ...]
    urls: tuple[str, ...] = ()
    secrets: tuple[str, ...] = ()
    settings: tuple[str, ...] = ()
    webhook: WebhookScheme | None = None
    output: OutputSpec = MEDIA
    outputs: Mapping[str, OutputSpec] = field(default_factory=dict)
    simulator: str | None = None

    def __post_init__(self) -> None:
        name = self.name
        if not _NAME.fullmatch(name):
            raise ValueError(f"a provider family's name is lower-case letters and digits, "
                             f"not {name!r}")
        if not self.kinds:
            raise ValueError(f"provider family {name!r} declares no kind")
        for kind in self.kinds:
            if not kind.name.startswith(f"{name}-") or kind.provider != name:
                raise ValueError(f"kind {kind.name!r} (provider {kind.provider!r}) is not named "
                                 f"{name}-… for provider {name!r}")
        if self.webhook is not None and self.webhook.provider != name:
            raise ValueError(f"provider family {name!r} declares the webhook scheme "
                             f"{self.webhook.provider!r}")
        foreign = [s for s in self.setting_fields if not s.startswith(f"{name}_")]
        if foreign or len(set(self.setting_fields)) != len(self.setting_fields):
            raise ValueError(f"provider family {name!r}: settings are named {name}_… and listed "
                             f"once: {sorted(foreign) or sorted(self.setting_fields)}")
        if self.simulator is not None and not self.simulator.startswith("reconcile.testing."):
            raise ValueError(f"provider family {name!r}: its simulator module lives under "
                             f"reconcile.testing, not {self.simulator!r}")

    @property
    def setting_fields(self) -> tuple[str, ...]:
        """Every :class:`~reconcile.settings.Settings` field the family reads."""
        return (*self.urls, *self.secrets, *self.settings)


# The built-in families, in order: a package each, reconcile/providers/<name>/.
BUILTIN_FAMILIES: tuple[str, ...] = ("kie", "replicate", "elevenlabs", "anthropic", "fal")

_LOCK = threading.RLock()  # a family that asks for the families while loading fails, never hangs
_LOADED: tuple[ProviderFamily, ...] | None = None


def families() -> tuple[ProviderFamily, ...]:
    """The built-in families' declarations, in :data:`BUILTIN_FAMILIES` order (each package is
    imported on the first call)."""
    global _LOADED
    if _LOADED is None:
        with _LOCK:
            if _LOADED is None:
                _LOADED = tuple(_load(name) for name in BUILTIN_FAMILIES)
    return _LOADED


def family(name: str | None) -> ProviderFamily | None:
    """The built-in family ``name``, or None."""
    return next((f for f in families() if f.name == name), None) if name else None


def _load(name: str) -> ProviderFamily:
    package = f"{__package__}.{name}"
    declared = getattr(importlib.import_module(package), "FAMILY", None)
    if not isinstance(declared, ProviderFamily) or declared.name != name:
        raise ImportError(f"{package} must declare FAMILY = ProviderFamily(name={name!r}, ...)")
    return declared


__all__ = [
    "BUILTIN_FAMILIES", "ClientFactory", "H1", "H24", "Kind", "MIN", "ProviderFamily", "SEC",
    "families", "family", "family_of_name",
]
