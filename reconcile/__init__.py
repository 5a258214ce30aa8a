"""reconcile: crash-safe, money-safe external AI provider calls for Celery workers.

This package is the public API's front door: what a platform imports is named in ``__all__``
below, and the modules it lists (``api``, ``credits``, ``errors``, ``operator``, ``tasks``,
``webhooks``) are public with their own ``__all__``. The other public modules are the
integration points a platform names in its configuration (the Celery app and settings, the
console, the Django integration, the migrations, the simulator); ``docs/reference/api.md``
lists them all. Every other module is internal (its docstring says so) and may change without
notice.

The names are loaded on first use (``reconcile.Settings`` imports ``reconcile.settings`` then),
so that ``import reconcile.errors`` stays light. The one module imported here besides is the
provider families' registry (:mod:`reconcile.providers.family`, which loads no family until
asked): it tells :class:`~reconcile.settings.Settings`, below it, which fields the families
declare (:mod:`reconcile.core.family_settings`), before any ``Settings()`` can be built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .core.facade import lazy as _lazy
from .core.redact import install_log_redaction as _install_log_redaction
from .providers import family as _families  # noqa: F401 - registers the families' settings

if TYPE_CHECKING:
    from . import api, credits, errors, operator, tasks, webhooks
    from .kinds import Kind, register_kind
    from .ledger import Ledger
    from .orchestrator import NodeTimeout, wait_for_job
    from .runtime import CompletionHook, EventHook, PricingHook, Runtime, Validator, WatermarkHook
    from .settings import Settings
    from .sync import SyncCall, run_sync, sync_call

__all__ = [
    "CompletionHook", "EventHook", "Kind", "Ledger", "NodeTimeout", "PricingHook", "Runtime", "Settings",
    "SyncCall", "Validator", "WatermarkHook", "__version__", "api", "credits", "errors",
    "install", "operator", "register_kind", "run_sync", "sync_call", "tasks", "wait_for_job",
    "webhooks",
]

__version__ = "0.1.0"

# each re-exported name and its home module ("" for a public submodule of this package)
_HOMES = {
    "api": "", "credits": "", "errors": "", "operator": "", "tasks": "", "webhooks": "",
    "Settings": "settings",
    "Runtime": "runtime", "CompletionHook": "runtime", "EventHook": "runtime",
    "PricingHook": "runtime", "Validator": "runtime", "WatermarkHook": "runtime",
    "Kind": "kinds", "register_kind": "kinds", "Ledger": "ledger",
    "SyncCall": "sync", "run_sync": "sync", "sync_call": "sync",
    "NodeTimeout": "orchestrator", "wait_for_job": "orchestrator",
}
__getattr__, __dir__ = _lazy(__name__, globals(), _HOMES)

_install_log_redaction()  # no credential reaches a log, whoever logs it (redact.text)


def install(app, *, beat=True):  # type: ignore[no-untyped-def]
    """Install the library into the platform's Celery ``app``: its tasks, the settings it
    needs (never overriding the app's own; a warning where they differ), its queues' routes,
    the sweep's beat entry and the per-process engine hook. See :mod:`reconcile.celery_install`.
    """
    from .celery_install import install as _install

    return _install(app, beat=beat)
