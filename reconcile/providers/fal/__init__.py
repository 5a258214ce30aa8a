"""Internal: the library's own mechanics, not an import path for platforms (may move).

fal.ai: the queue client (:mod:`.client`: submit, status, result, cancel) and fal's webhook
scheme (:mod:`.webhook`: Ed25519 signatures by fal's JWKS). :data:`FAMILY` declares the family:
its kind, settings, scheme, what its results hold by default and its simulator.
"""

from __future__ import annotations

from ..family import H1, MIN, SEC, Kind, ProviderFamily
from ..outputs import MEDIA, Expect, OutputSpec
from .client import (
    MEDIA_KEYS,
    FalQueueClient,
    QueueStatus,
    Submitted,
    app_path,
    extract_media,
    extract_outputs,
    parse_create,
    parse_result,
    parse_status,
    queue_client,
    to_error,
)
from .webhook import SCHEME

FAMILY = ProviderFamily(
    name="fal",
    kinds=(
        # fal's webhook is the ``fal_webhook`` query parameter: README "Webhook fields that are
        # trusted"
        Kind("fal-queue", False, 20 * MIN, 3 * SEC, H1, "fal_webhook query",
             "reconcile.providers.fal:queue_client", binds=("fal_webhook",)),
    ),
    # the queue, the synchronous host, and the signing keys of fal's webhooks
    urls={"fal_base_url": "https://queue.fal.run", "fal_sync_base_url": "https://fal.run",
          "fal_jwks_url": "https://rest.fal.ai/.well-known/jwks.json"},
    secrets={"fal_api_key": ""},
    # fal signs every account's webhooks with one JWKS: only a delivery whose signed
    # X-Fal-Webhook-User-Id is this id can bind to a job (None: fal evidence is operator-only)
    settings={"fal_webhook_user_id": None},
    webhook=SCHEME,
    # a fal result mixes the product with metadata (seed, timings, prompt): only media counts,
    # unless the endpoint declares otherwise. Endpoints whose documented result is text:
    # fal.ai/models/fal-ai/whisper and fal-ai/wizper answer {"text", "chunks"}; fal-ai/any-llm
    # answers {"output", "reasoning", "partial", "error"}; fal-ai/elevenlabs/speech-to-text {"text"}.
    output=MEDIA,
    outputs={
        "fal-ai/whisper": OutputSpec(Expect.TEXT, "text"),
        "fal-ai/wizper": OutputSpec(Expect.TEXT, "text"),
        "fal-ai/any-llm": OutputSpec(Expect.TEXT, "output"),
        "fal-ai/elevenlabs/speech-to-text": OutputSpec(Expect.TEXT, "text"),
    },
    simulator="reconcile.testing.sim_fal",
)

__all__ = [
    "FAMILY",
    "MEDIA_KEYS",
    "FalQueueClient",
    "QueueStatus",
    "Submitted",
    "app_path",
    "extract_media",
    "extract_outputs",
    "parse_create",
    "parse_result",
    "parse_status",
    "queue_client",
    "to_error",
]
