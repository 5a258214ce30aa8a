"""Internal: What an endpoint's result is expected to hold (README, Design notes: Text and JSON
outputs), for fal and Replicate.

The contract's ``UPSTREAM_EMPTY_RESULT`` is "COMPLETED but no media". Endpoints whose product is
text or JSON (speech-to-text, LLMs, captioning) are not empty when they answer ``{"text": …}``:
each endpoint declares the output it expects, and only the *declared* output missing is an empty
result. A text or JSON output becomes an :class:`~reconcile.providers.base.Output` with ``text``,
which the lifecycle stores as an object like any media file, so the snapshot shape is unchanged.

Defaults (one rule; each provider family declares its own, ``FAMILY.output``, with its built-in
endpoint declarations, ``FAMILY.outputs``; a provider that declares none expects ``MEDIA``):

* fal — ``MEDIA``: a fal result mixes the product with metadata (``seed``, ``timings``,
  ``prompt``), so only media objects count unless the endpoint declares otherwise;
  ``{"images": [], "seed": 1}`` stays empty.
* Replicate — ``ANY``: a prediction's ``output`` field *is* the product, so whatever it holds
  (URLs, a string, a token list, JSON) counts; declare ``MEDIA`` for a model whose text-only
  output would be a failure.

A platform declares its own endpoints with :func:`declare_output` (a declaration wins over a
family's built-in one).
"""

from __future__ import annotations

import base64
import binascii
import json
import threading
from typing import Any
from urllib.parse import unquote_to_bytes

from .base import Output
from .output_spec import ANY as ANY, MEDIA as MEDIA, Expect as Expect, OutputSpec as OutputSpec

__all__ = ["Expect", "OutputSpec", "data_uri_output", "declare_output", "declared_output",
           "document_output", "text_output"]


_LOCK = threading.Lock()
# (provider, model prefix) → spec: the platform's own declarations (:func:`declare_output`)
_DECLARED: dict[tuple[str, str], OutputSpec] = {}
# provider → (its default, its built-in declarations), from the families' declarations
_FAMILIES: dict[str, tuple[OutputSpec, dict[str, OutputSpec]]] | None = None


def declare_output(provider: str, model: str, spec: OutputSpec) -> None:
    """Declare what ``model`` (an endpoint id, or a prefix of one) of ``provider`` returns."""
    with _LOCK:
        _DECLARED[(provider, model.strip("/"))] = spec


def _family_outputs() -> dict[str, tuple[OutputSpec, dict[str, OutputSpec]]]:
    """Each built-in family's ``output`` and ``outputs`` (loaded once; the families import this
    module, so never at its import)."""
    global _FAMILIES
    if _FAMILIES is None:
        from .family import families

        _FAMILIES = {f.name: (f.output, {m.strip("/"): spec for m, spec in f.outputs.items()})
                     for f in families()}
    return _FAMILIES


def declared_output(provider: str, model: str | None) -> OutputSpec:
    """The spec of the longest declared prefix of ``model`` (path segments; a Replicate
    ``:version`` is ignored) — the platform's declaration, else the family's built-in one —,
    else the provider's default."""
    name = (model or "").removeprefix("deployment:").partition(":")[0].strip("/")
    segments = name.split("/")
    default, builtin = _family_outputs().get(provider, (MEDIA, {}))
    with _LOCK:
        for end in range(len(segments), 0, -1):
            prefix = "/".join(segments[:end])
            spec = _DECLARED.get((provider, prefix)) or builtin.get(prefix)
            if spec is not None:
                return spec
    return default


def text_output(value: Any) -> Output | None:
    """A non-empty string (or a list of string tokens, joined) as a text output."""
    if isinstance(value, list) and value and all(isinstance(x, str) for x in value):
        value = "".join(value)
    if isinstance(value, str) and value:
        return Output(text=value, media_type="text/plain")
    return None


def document_output(value: Any) -> Output | None:
    """A non-empty JSON value as an ``application/json`` output."""
    if value in (None, "", [], {}):
        return None
    return Output(text=json.dumps(value, ensure_ascii=False), media_type="application/json")


def data_uri_output(value: str) -> Output | None:
    """A ``data:<type>;base64,<payload>`` URI (fal's ``sync_mode``) decoded to bytes in hand.

    Undecodable URIs give None: the caller then finds no media, which is honest.
    """
    header, sep, payload = value.partition(",")
    if not sep or not header.startswith("data:"):
        return None
    params = header[len("data:"):].split(";")
    media_type = params[0] or "text/plain"
    try:
        data = base64.b64decode(payload, validate=True) if "base64" in params[1:] else \
            unquote_to_bytes(payload)
    except (binascii.Error, ValueError):
        return None
    return Output(data=data, media_type=media_type) if data else None


from ..core.facade import names_moved as _names_moved  # noqa: E402

_names_moved(__name__)
