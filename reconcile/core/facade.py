"""Internal: the lazy re-exports of a public facade (``reconcile``, ``reconcile.providers``).

A facade names what a platform imports and where it lives, without importing it: importing
``reconcile.errors`` must not load the database layer, the Celery tasks and the providers just
because Python runs ``reconcile/__init__.py`` first. :func:`lazy` returns the module's
``__getattr__`` and ``__dir__`` (PEP 562); the first access imports the home module and caches
the value in the facade's namespace.
"""

from __future__ import annotations

import importlib
import sys
import types
import warnings
from collections.abc import Callable, Mapping
from typing import Any


def lazy(package: str, namespace: dict[str, Any], homes: Mapping[str, str],
         ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``homes`` maps each re-exported name to its home module, relative to ``package``
    (``"settings"``), or to ``""`` for a submodule of the package re-exported under its own
    name (``api``)."""

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        if home == "":
            value = importlib.import_module(f"{package}.{name}")
        else:
            value = getattr(importlib.import_module(f"{package}.{home}"), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(homes))

    return __getattr__, __dir__


# The names that moved to a facade, by their old module: each keeps working from there for one
# release (0.2) and warns a caller outside the library, naming the new home. The library's own
# modules import from the old homes, which stay the definitions.
MOVED: dict[str, dict[str, str]] = {
    "reconcile.settings": {"Settings": "reconcile"},
    "reconcile.runtime": dict.fromkeys(
        ("CompletionHook", "EventHook", "PricingHook", "Runtime", "Validator", "WatermarkHook"),
        "reconcile"),
    "reconcile.kinds": dict.fromkeys(("Kind", "register_kind"), "reconcile"),
    "reconcile.sync": dict.fromkeys(("SyncCall", "run_sync", "sync_call"), "reconcile"),
    "reconcile.orchestrator": dict.fromkeys(("NodeTimeout", "wait_for_job"), "reconcile"),
    "reconcile.ledger": {"Ledger": "reconcile"},
    "reconcile.db.session": {"normalise_url": "reconcile.migrations"},
    "reconcile.providers.base": dict.fromkeys(
        ("AsyncProvider", "CreateRequest", "Created", "ListedTask", "OnTaskCreated", "Output",
         "PollResult", "PollStatus", "SyncProvider", "SyncResult", "resume", "run"),
        "reconcile.providers"),
    "reconcile.providers.outputs": dict.fromkeys(
        ("Expect", "OutputSpec", "data_uri_output", "declare_output", "declared_output",
         "document_output", "text_output"), "reconcile.providers"),
}


def _internal(caller: str) -> bool:
    return caller == "reconcile" or caller.startswith("reconcile.")


class _MovedNames(types.ModuleType):
    """A module some of whose names moved: reading one of them from outside the library warns."""

    def __getattribute__(self, name: str) -> Any:
        moved = MOVED.get(types.ModuleType.__getattribute__(self, "__name__"), {})
        if name in moved and not _internal(sys._getframe(1).f_globals.get("__name__", "")):
            module = types.ModuleType.__getattribute__(self, "__name__")
            warnings.warn(f"{module}.{name} is internal from reconcile 0.2: import {name} from "
                          f"{moved[name]} (the old path goes in 0.3)", DeprecationWarning,
                          stacklevel=2)
        return types.ModuleType.__getattribute__(self, name)


def names_moved(module: str) -> None:
    """Called at the end of each module in :data:`MOVED`."""
    sys.modules[module].__class__ = _MovedNames
