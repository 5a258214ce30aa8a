"""Internal: the library's own mechanics, not an import path for platforms (may move).

Replicate predictions and trainings (replicate.com/docs, replicate-javascript ``index.d.ts``).

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
Replicate's webhook scheme is :mod:`.webhook`; :data:`FAMILY` declares the family (its kinds,
settings, scheme, output default and simulator).
"""

from __future__ import annotations

from ..family import H1, MIN, SEC, Kind, ProviderFamily
from ..outputs import ANY
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
from .webhook import SCHEME

# a prediction echoes ``webhook`` (and its filter): README "Webhook fields that are trusted"
_BINDS = ("webhook", "webhook_events_filter")

FAMILY = ProviderFamily(
    name="replicate",
    kinds=(
        Kind("replicate-prediction", False, 20 * MIN, 3 * SEC, H1, "webhook query",
             "reconcile.providers.replicate:prediction_client", binds=_BINDS),
        Kind("replicate-training", False, 30 * MIN, 15 * SEC, H1, "webhook query",
             "reconcile.providers.replicate:training_client", binds=_BINDS),
    ),
    urls={"replicate_base_url": "https://api.replicate.com"},
    # the whsec_… webhook signing secret (None: deliveries are refused)
    secrets={"replicate_api_key": "", "replicate_webhook_secret": None},
    webhook=SCHEME,
    # a prediction's ``output`` field *is* the product: whatever it holds counts
    output=ANY,
    simulator="reconcile.testing.sim_replicate",
)

__all__ = [
    "FAMILY",
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
