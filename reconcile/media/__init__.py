"""Internal: fetching a provider's outputs safely (layer: gateway).

* :mod:`reconcile.media.fetch` — the streamed, size-capped fetch of one output URL;
* :mod:`reconcile.media.guard` — the address checks every hop passes (no private, loopback,
  link-local or metadata address; pinned resolution);
* :mod:`reconcile.media.types` — media types and file extensions (pure).

The package keeps the names ``reconcile.media`` had as a module (``from reconcile.media import
safe_fetch``); patch them on :mod:`reconcile.media.fetch`, where the callers look them up.
"""

from .fetch import (
    FetchedMedia,
    Target,
    check_url,
    guess_extension,
    is_public_address,
    media_type_for_extension,
    parse_media_url,
    safe_fetch,
)

__all__ = [
    "FetchedMedia",
    "Target",
    "check_url",
    "guess_extension",
    "is_public_address",
    "media_type_for_extension",
    "parse_media_url",
    "safe_fetch",
]
