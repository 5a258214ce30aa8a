"""Internal: fetching a provider's outputs safely (layer: gateway).

* :mod:`reconcile.media.fetch` — the streamed, size-capped fetch of one output URL;
* :mod:`reconcile.media.guard` — the address checks every hop passes (no private, loopback,
  link-local or metadata address; pinned resolution);
* :mod:`reconcile.media.types` — media types and file extensions (pure).
"""
