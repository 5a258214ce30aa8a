"""acme's catalogue: the models a customer may ask for, per provider kind.

acme prices by kind (``settings.PRICES``), so a model acme has not priced is refused at submit
with 400 ``INVALID_PARAM`` before anything is reserved. Without this list a customer could name
any model the provider runs — their own Replicate model or fal app included — which can do
billable work upstream, fail on purpose, and be refunded in full by the library's rules.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from reconcile.errors import InvalidParam

# the models acme offers (an exact match: a Replicate model is pinned to its version)
MODELS: dict[str, frozenset[str]] = {
    "kie-standard": frozenset({"seedream/4.5-edit", "google/nano-banana"}),
    "replicate-prediction": frozenset({"black-forest-labs/flux-schnell"}),
    "fal-queue": frozenset({"fal-ai/flux/dev"}),
    "elevenlabs-async": frozenset({"dubbing"}),
}


def models() -> Mapping[str, frozenset[str]]:
    """:data:`MODELS`, or ``ACME_MODELS`` (``kind=model,kind=model``; staging and tests)."""
    spec = os.environ.get("ACME_MODELS")
    if not spec:
        return MODELS
    table: dict[str, set[str]] = {}
    for entry in spec.split(","):
        kind, _, model = entry.strip().partition("=")
        if kind and model:
            table.setdefault(kind, set()).add(model)
    return {kind: frozenset(names) for kind, names in table.items()}


def allowed_model(provider_kind: str, model: str, input: Mapping[str, Any]) -> None:
    """The submit validator (``reconcile.api.submit(validator=...)``): only catalogue models."""
    if model not in models().get(provider_kind, frozenset()):
        raise InvalidParam("model is not offered for this provider_kind", param="model")
