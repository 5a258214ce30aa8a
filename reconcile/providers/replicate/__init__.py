"""Internal: the library's own mechanics, not an import path for platforms (may move).

Replicate predictions and trainings (PROVIDERS.md §2).

Model strings (``CreateRequest.model``):

* ``owner/name:version`` — ``POST /v1/predictions`` with ``{"version": <version>, ...}``;
* ``owner/name`` — an official model: ``POST /v1/models/{owner}/{name}/predictions``;
* ``deployment:owner/name`` — ``POST /v1/deployments/{owner}/{name}/predictions``;
* trainings always need ``owner/name:version`` and ``extra["destination"]`` (``owner/model``).

The job id rides in the ``webhook`` URL's query (``?job_id=…``, already on
``CreateRequest.webhook_url``), never in ``input``: Replicate echoes ``webhook`` back on every
prediction, which is what :meth:`ReplicateClient.find_created` matches on after an uncertain
create. Creates go out once (``send_once``); reads are retried by :class:`HttpClient`.

One module per seam: :mod:`.predictions` (creates and reads), :mod:`.trainings` (the training
create), :mod:`.listing` (the evidence search after an uncertain create), :mod:`._common` (the
records, outputs and :func:`to_error`), :mod:`.client` (the client and the kinds' factories).
Replicate's webhook scheme is :mod:`reconcile.webhooks.replicate`.
"""

from __future__ import annotations

from ._common import (
    REQUEST_ID_HEADERS,
    Prediction,
    Problem,
    Resource,
    extract_outputs,
    planted_job_id,
    to_error,
)
from .client import ReplicateClient, prediction_client, training_client
from .listing import MAX_LIST_PAGES, ListPage, find_created, parse_list
from .predictions import build_create, parse_create, parse_status
from .trainings import training_create

__all__ = [
    "MAX_LIST_PAGES",
    "REQUEST_ID_HEADERS",
    "ListPage",
    "Prediction",
    "Problem",
    "ReplicateClient",
    "Resource",
    "build_create",
    "extract_outputs",
    "find_created",
    "parse_create",
    "parse_list",
    "parse_status",
    "planted_job_id",
    "prediction_client",
    "to_error",
    "training_client",
    "training_create",
]
