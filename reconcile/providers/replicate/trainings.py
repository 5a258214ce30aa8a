"""Replicate trainings: always ``owner/name:version`` and ``extra["destination"]``
(``owner/model``); ``POST /v1/models/{owner}/{name}/versions/{version}/trainings``. Reads, cancels
and listings are the predictions' with ``/v1/trainings``."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from ...errors import InvalidParam
from ..base import CreateRequest


def training_create(request: CreateRequest, base: str, version: str, deployment: bool,
                    body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The path and JSON body of a training create (``body``: input and webhook)."""
    destination = request.extra.get("destination")
    if not version or deployment:
        raise InvalidParam("a replicate training needs owner/name:version", param="model")
    if not isinstance(destination, str) or "/" not in destination:
        raise InvalidParam(
            "a replicate training needs extra['destination'] = 'owner/model'",
            param="destination",
        )
    return f"{base}/versions/{quote(version)}/trainings", {"destination": destination, **body}
