"""Internal: the library's own mechanics, not an import path for platforms (may move).

KIE.ai clients: the market jobs API, Veo, Suno, Flux Kontext, Luma modify, Runway and the
KIE-proxied LLM (docs.kie.ai; README, Design notes: The outcome table).

One shape throughout: pydantic models of the upstream records, PURE parse functions
(:func:`parse_create`, ``parse_record_*``, :func:`parse_chat`) that turn one HTTP answer into our
types or the library's errors, and thin I/O (:class:`KieClient`, :class:`KieLlmClient`).

One module per family of endpoints: :mod:`.market`, :mod:`.flags` (Veo, Flux Kontext, Luma),
:mod:`.suno`, :mod:`.runway`, :mod:`.llm`; what they share (the envelope, :func:`classify`,
:func:`error_for` — the one place an answer becomes an error —, the record read and the HTTP
plumbing) is in :mod:`._common`, the task client and the kinds' factories in :mod:`.client`.
KIE's webhook scheme is :mod:`.webhook`; :data:`FAMILY` declares the family (its kinds, settings,
scheme and simulator).
"""

from __future__ import annotations

from ..family import H24, MIN, SEC, Kind, ProviderFamily
from ._common import (
    PLANT_PARAM,
    REQUEST_ID_HEADERS,
    Answer,
    Envelope,
    Headers,
    KieApi,
    Verdict,
    classify,
    decode,
    error_for,
    parse_create,
    planted_job_id,
    top_level_body,
)
from .client import (
    KieClient,
    kontext_client,
    luma_client,
    market_client,
    runway_client,
    suno_client,
    veo_client,
)
from .flags import (
    KONTEXT,
    LUMA,
    VEO,
    FlagRecord,
    FlagResponse,
    modelless_body,
    parse_record_kontext,
    parse_record_luma,
    parse_record_veo,
)
from .llm import LLM_CHAT_PATH, KieLlmClient, llm_client, parse_chat
from .market import MARKET, MarketRecord, market_body, parse_record_market
from .runway import RUNWAY, RunwayRecord, RunwayVideo, parse_record_runway
from .suno import SUNO, SunoRecord, SunoResponse, SunoTrack, parse_record_suno
from .webhook import SCHEME

_BACKOFF = ((2 * MIN, 15 * SEC),)
# KIE's record echoes the body's callBackUrl (README "Webhook fields that are trusted")
_BINDS = ("callBackUrl",)


def _kind(name: str, threshold: int, interval: int, api: str) -> Kind:
    return Kind(
        name=name,
        sync=False,
        stale_threshold=threshold * MIN,
        poll_interval=interval * SEC,
        result_url_lifetime=H24,
        plant="callBackUrl query",
        client=f"reconcile.providers.kie:{api}",
        backoff=_BACKOFF if interval < 15 else (),
        binds=_BINDS,
    )


FAMILY = ProviderFamily(
    name="kie",
    kinds=(
        _kind("kie-standard", 10, 5, "market_client"),
        _kind("kie-veo", 25, 10, "veo_client"),
        _kind("kie-suno", 30, 10, "suno_client"),
        _kind("kie-kontext", 10, 5, "kontext_client"),
        _kind("kie-luma", 25, 15, "luma_client"),
        _kind("kie-kling3", 25, 10, "market_client"),
        _kind("kie-runway", 25, 10, "runway_client"),
        _kind("kie-lip-sync", 75, 15, "market_client"),
        Kind("kie-llm", True, 5 * MIN, None, None, None, "reconcile.providers.kie:llm_client",
             binds=()),
    ),
    urls={"kie_base_url": "https://api.kie.ai"},
    # the webhook HMAC key (None: deliveries are refused)
    secrets={"kie_api_key": "", "kie_webhook_hmac_key": None},
    webhook=SCHEME,
    simulator="reconcile.testing.sim_kie",
)

__all__ = [
    "FAMILY", "KONTEXT", "LLM_CHAT_PATH", "LUMA", "MARKET", "PLANT_PARAM", "REQUEST_ID_HEADERS", "RUNWAY",
    "SUNO", "VEO", "Answer", "Envelope", "FlagRecord", "FlagResponse", "Headers", "KieApi",
    "KieClient", "KieLlmClient", "MarketRecord", "RunwayRecord", "RunwayVideo", "SunoRecord",
    "SunoResponse", "SunoTrack", "Verdict", "classify", "decode", "error_for", "kontext_client",
    "llm_client", "luma_client", "market_body", "market_client", "modelless_body", "parse_chat",
    "parse_create", "parse_record_kontext", "parse_record_luma", "parse_record_market",
    "parse_record_runway", "parse_record_suno", "parse_record_veo", "planted_job_id",
    "runway_client", "suno_client", "top_level_body", "veo_client",
]
