"""Internal: the library's own mechanics, not an import path for platforms (may move).

A provider family is one package with one registration.

Each built-in family is a package ``reconcile/providers/<name>/`` (its clients, its webhook
scheme in ``webhook.py``) whose ``__init__`` declares ``FAMILY = ProviderFamily(...)``: its
kinds, the settings it reads (with their defaults), its webhook scheme, what its results hold by
default, and its simulator module. :func:`families` finds the packages (every subpackage of
:mod:`reconcile.providers` that declares ``FAMILY``, ordered by name) and loads their
declarations, and every list of the families is derived from them: the kinds and
``BUILTIN_PROVIDERS`` (:mod:`reconcile.kinds`), the settings fields
(:meth:`reconcile.settings.Settings.with_families`) and the redacted secrets, the webhook schemes
and their re-exports (:mod:`reconcile.webhooks`), the output defaults
(:mod:`reconcile.providers.outputs`), the simulator's modules, settings environment and secrets
(:mod:`reconcile.testing.sim_registry`) and the chaos run's mix.
``tests/unit/test_provider_family.py`` holds the rules, and
``tests/integration/test_provider_contract.py`` runs the same contract over every family. A
platform's own family is registered at run time instead (:func:`reconcile.kinds.register_kind`).

The family's name is used eight ways; each is declared here or refused at import:

1. the package ``reconcile.providers.<name>`` (found by :func:`families`; its ``FAMILY.name``
   must be the package's name);
2. every kind's name starts ``<name>-`` (``kie-veo``);
3. every kind's :attr:`Kind.provider` is ``<name>``: the value stored in ``jobs.provider``;
4. the webhook path segment, ``…/webhooks/<name>?job_id=…`` (its scheme's ``provider``);
5. the webhook scheme's name, :func:`reconcile.webhooks.get_scheme` (``<name>``);
6. every settings field starts ``<name>_``, so its variables are ``RECONCILE_<NAME>_…`` — and no
   field of the library's own starts so (a family is never named ``media``, ``poll``…);
7. the simulator module (``simulator``, a module name under ``reconcile.testing``), whose route
   answers under ``{simulator}/<name>/…``;
8. the output defaults and built-in declarations of :func:`~reconcile.providers.outputs.declared_output`
   are keyed by ``<name>``.

A name is lower-case letters and digits only: it is a path segment, an environment prefix and a
kind prefix at once.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from types import ModuleType
from typing import TYPE_CHECKING

from ..core import family_settings
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
    - ``kinds``: its provider kinds, in the order :data:`reconcile.kinds.BUILTIN_KINDS` lists them
      (the families in :func:`families` order, each family's kinds in this order);
    - ``urls``: the :class:`~reconcile.settings.Settings` fields that point its clients (or a key
      fetch) at the provider, each with its default (the provider's public URL) — the simulator
      points every one of them at itself;
    - ``secrets``: its credentials and webhook secrets, each with its default (``""`` or None:
      unset): redacted wherever the library logs or stores text;
    - ``settings``: any other field it reads, with its default (fal: the account its webhooks
      are signed for);
    - ``webhook``: its webhook scheme (None: the family sends no webhooks);
    - ``output``: what a result holds when its endpoint declares nothing, and ``outputs`` the
      built-in declarations by endpoint prefix (:mod:`reconcile.providers.outputs`);
    - ``simulator``: the module under ``reconcile.testing`` that registers its simulator route
      and webhooks (None: none; every built-in family has one).
    """

    name: str
    kinds: tuple[Kind, ...]
    urls: Mapping[str, str] = field(default_factory=dict)
    secrets: Mapping[str, str | None] = field(default_factory=dict)
    settings: Mapping[str, str | None] = field(default_factory=dict)
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
        if any(not isinstance(d, str | None) for d in self.setting_defaults.values()):
            raise ValueError(f"provider family {name!r}: a setting's default is a string or "
                             f"None: {dict(self.setting_defaults)}")
        taken = library_fields_named(name)
        if taken:
            raise ValueError(f"provider family {name!r}: RECONCILE_{name.upper()}_… would hold "
                             f"the library's own settings {sorted(taken)}; choose another name")
        if self.simulator is not None and not self.simulator.startswith("reconcile.testing."):
            raise ValueError(f"provider family {name!r}: its simulator module lives under "
                             f"reconcile.testing, not {self.simulator!r}")

    @property
    def setting_fields(self) -> tuple[str, ...]:
        """Every :class:`~reconcile.settings.Settings` field the family reads."""
        return (*self.urls, *self.secrets, *self.settings)

    @property
    def setting_defaults(self) -> dict[str, str | None]:
        """Each of :attr:`setting_fields` with its default."""
        return {**self.urls, **self.secrets, **self.settings}


def library_fields_named(name: str) -> set[str]:
    """The library's own :class:`~reconcile.settings.Settings` fields named ``<name>_…``: a
    family ``name`` would share their environment prefix, so no family takes it."""
    from ..settings import Settings  # not at import: the package facade imports this module

    return {f for f in Settings.model_fields if f.startswith(f"{name}_")}


def _settings() -> list[family_settings.FamilySetting]:
    """Every family's settings, as :class:`~reconcile.settings.Settings` makes them fields."""
    return [family_settings.FamilySetting(name, default, name in f.secrets)
            for f in families() for name, default in f.setting_defaults.items()]


family_settings.register(_settings)


_LOCK = threading.RLock()  # a family that asks for the families while loading fails, never hangs
_LOADED: tuple[ProviderFamily, ...] | None = None


def _discover() -> tuple[ProviderFamily, ...]:
    """Every subpackage of :mod:`reconcile.providers` that declares ``FAMILY``, in the order of
    the packages' names (a package that fails to import raises: a family is never dropped)."""
    found = []
    # this module's package is imported (its parent): its __path__ is where the families live
    for info in sorted(pkgutil.iter_modules(sys.modules[__package__].__path__),
                       key=lambda i: i.name):
        if not info.ispkg:
            continue
        package = importlib.import_module(f"{__package__}.{info.name}")
        if hasattr(package, "FAMILY"):
            found.append(_declared(package, info.name))
    return tuple(found)


def families() -> tuple[ProviderFamily, ...]:
    """The built-in families' declarations: each package ``reconcile/providers/<name>/`` that
    declares ``FAMILY``, ordered by name (the packages are imported on the first call)."""
    global _LOADED
    if _LOADED is None:
        with _LOCK:
            if _LOADED is None:
                _LOADED = _discover()
    return _LOADED


def family(name: str | None) -> ProviderFamily | None:
    """The built-in family ``name``, or None."""
    return next((f for f in families() if f.name == name), None) if name else None


def _declared(package: ModuleType, name: str) -> ProviderFamily:
    declared = getattr(package, "FAMILY", None)
    if not isinstance(declared, ProviderFamily) or declared.name != name:
        raise ImportError(f"{package.__name__} must declare FAMILY = ProviderFamily(name={name!r}, ...)")
    return declared


__all__ = [
    "ClientFactory", "H1", "H24", "Kind", "MIN", "ProviderFamily", "SEC",
    "families", "family", "family_of_name",
]
