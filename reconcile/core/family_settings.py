"""Internal: the library's own mechanics, not an import path for platforms (may move).

The settings the provider families declare, where :class:`reconcile.settings.Settings` finds
them without importing the providers (it sits in the core layer, below them).

Each family declares its fields with their defaults (``FAMILY.urls``, ``secrets``, ``settings``:
:mod:`reconcile.providers.family`). That registry, when it is imported, registers here the
function that lists them (:func:`register`), and ``Settings`` reads them (:func:`declared`) when
its first instance is built — so no family package is imported before then.
``reconcile/__init__.py`` imports the registry, and Python runs it before any ``reconcile.*``
module: the registration always precedes the first ``Settings()``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class FamilySetting:
    """One field a provider family declares: ``<family>_…``, its default, and whether it is a
    credential or a webhook secret (redacted wherever the library logs or stores text)."""

    name: str
    default: str | None
    secret: bool


_SOURCE: list[Callable[[], Iterable[FamilySetting]]] = []


def register(source: Callable[[], Iterable[FamilySetting]]) -> None:
    """``source()`` lists every family's fields (called once, by the first ``Settings()``)."""
    _SOURCE[:] = [source]


def declared() -> tuple[FamilySetting, ...]:
    """Every family's fields; RuntimeError when no registry registered its source (the package
    ``reconcile`` was bypassed)."""
    if not _SOURCE:
        raise RuntimeError("the provider families' settings are unknown: reconcile.providers.family "
                           "registers them when imported (reconcile/__init__.py imports it)")
    return tuple(_SOURCE[0]())
