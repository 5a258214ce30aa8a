"""Internal: the library's own mechanics, not an import path for platforms (may move).

ElevenLabs: dubbing and webhook-mode STT (async), everything else sync (elevenlabs-python).

Async model strings (``CreateRequest.model``, also passed to ``poll``):

* ``dubbing`` (or empty) — ``POST /v1/dubbing`` (multipart) → ``dubbing_id``; poll
  ``GET /v1/dubbing/{id}``. ``name`` is always ``reconcile-job:<job_id>`` so the job id is
  visible upstream (an input setting it is refused at submit).
* ``speech-to-text[:<model_id>]`` / ``stt[:<model_id>]`` — ``POST /v1/speech-to-text`` with
  ``webhook=true`` and ``webhook_metadata={"job_id": …}`` (the planted id the webhook echoes).
  The answer is ``{message, request_id, transcription_id?}``; the task id is
  ``transcription_id``, else ``request_id``. Poll ``GET /v1/speech-to-text/transcripts/{id}``:
  the transcript once done; before that (or when only a ``request_id`` was returned) we assume
  a 404, read as NOT_FOUND — the workspace webhook normally completes these jobs first.

Sync model strings (:class:`ElevenLabsSyncClient.call`):

* ``tts:<voice_id>[:<model_id>]`` — ``POST /v1/text-to-speech/{voice_id}`` → audio bytes;
* ``sound-effects[:<model_id>]`` — ``POST /v1/sound-generation`` → audio bytes;
* ``stt[:<model_id>]`` — ``POST /v1/speech-to-text`` (multipart) → transcript JSON;
* ``voice-clone`` — ``POST /v1/voices/add`` (multipart) → ``{voice_id, …}``;
* ``voice-design[:<model_id>]`` — ``POST /v1/text-to-voice/design`` → one audio Output per preview;
* ``voice-create`` — ``POST /v1/text-to-voice`` (saves a designed voice) → JSON;
* ``forced-alignment`` — ``POST /v1/forced-alignment`` (multipart) → alignment JSON.

``output_format``, ``enable_logging`` and ``optimize_streaming_latency`` in the input go to the
query string. In multipart inputs, ``bytes`` values (or base64 strings under ``<field>_base64``,
so stored JSON inputs can carry files) become file parts; other values become form fields.

:mod:`.async_jobs` holds the async families, :mod:`.sync` the sync calls, :mod:`._common` what
they share (:func:`to_error`, form parts, the HTTP plumbing). The webhook scheme is
:mod:`.webhook`; :data:`FAMILY` declares the family (its kinds, settings, scheme and simulator).
"""

from __future__ import annotations

from ..family import MIN, SEC, Kind, ProviderFamily
from ._common import JOB_NAME_PREFIX, ApiErrorDetail, FormParts, form_parts, to_error
from .async_jobs import (
    AsyncOperation,
    Dubbing,
    DubbingCreated,
    ElevenLabsAsyncClient,
    SttAccepted,
    async_client,
    async_operation,
    audio_url,
    build_create,
    parse_create,
    parse_dubbing,
    parse_transcript,
)
from .sync import (
    ElevenLabsSyncClient,
    Preview,
    ResponseKind,
    SyncCall,
    VoiceDesign,
    build_sync,
    parse_sync,
    sync_client,
)
from .webhook import SCHEME

# a dubbing echoes ``name``, a speech-to-text webhook ``webhook_metadata`` (``webhook`` turns it
# on): README "Webhook fields that are trusted"
_BINDS = ("name", "webhook_metadata", "webhook")

FAMILY = ProviderFamily(
    name="elevenlabs",
    kinds=(
        Kind("elevenlabs-async", False, 15 * MIN, 10 * SEC, None, "STT webhook_metadata",
             "reconcile.providers.elevenlabs:async_client", binds=_BINDS),
        Kind("elevenlabs-sync", True, 5 * MIN, None, None, None,
             "reconcile.providers.elevenlabs:sync_client", binds=()),
    ),
    urls={"elevenlabs_base_url": "https://api.elevenlabs.io"},
    # the workspace webhook secret (None: deliveries are refused)
    secrets={"elevenlabs_api_key": "", "elevenlabs_webhook_secret": None},
    webhook=SCHEME,
    simulator="reconcile.testing.sim_elevenlabs",
)

__all__ = [
    "FAMILY",
    "JOB_NAME_PREFIX",
    "ApiErrorDetail",
    "AsyncOperation",
    "Dubbing",
    "DubbingCreated",
    "ElevenLabsAsyncClient",
    "ElevenLabsSyncClient",
    "FormParts",
    "Preview",
    "ResponseKind",
    "SttAccepted",
    "SyncCall",
    "VoiceDesign",
    "async_client",
    "async_operation",
    "audio_url",
    "build_create",
    "build_sync",
    "form_parts",
    "parse_create",
    "parse_dubbing",
    "parse_sync",
    "parse_transcript",
    "sync_client",
    "to_error",
]
