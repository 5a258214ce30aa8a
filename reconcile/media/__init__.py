"""Internal: fetching a provider's outputs safely (layer: gateway).

* :mod:`reconcile.media.fetch` — the streamed, size-capped fetch of one output URL;
* :mod:`reconcile.media.guard` — the address checks every hop passes (no private, loopback,
  link-local or metadata address; pinned resolution);
* :mod:`reconcile.media.types` — media types and file extensions (pure).

The package keeps the names ``reconcile.media`` had as a module (``from reconcile.media import
safe_fetch``); patch them on :mod:`reconcile.media.fetch`, where the callers look them up.
"""

from . import fetch as _fetch
from .fetch import *  # noqa: F403  (the module's names, as ``__all__`` says)

__all__ = list(_fetch.__all__)
