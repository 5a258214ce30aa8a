"""Internal: the library's own mechanics, not an import path for platforms (may move).

KIE.ai clients: the market jobs API, Veo, Suno, Flux Kontext, Luma modify, Runway and the
KIE-proxied LLM (PROVIDERS.md §1, DESIGN.md §3–§4).

One shape throughout: pydantic models of the upstream records, PURE parse functions
(:func:`parse_create`, ``parse_record_*``, :func:`parse_chat`) that turn one HTTP answer into our
types or the library's errors, and thin I/O (:class:`KieClient`, :class:`KieLlmClient`).

One module per family of endpoints: :mod:`.market`, :mod:`.flags` (Veo, Flux Kontext, Luma),
:mod:`.suno`, :mod:`.runway`, :mod:`.llm`; what they share (the envelope, :func:`classify`,
:func:`error_for` — the one place an answer becomes an error —, the record read and the HTTP
plumbing) is in :mod:`._common`, the task client and the kinds' factories in :mod:`.client`.
KIE's webhook scheme is :mod:`reconcile.webhooks.kie`.
"""

from __future__ import annotations

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

__all__ = [
    "KONTEXT", "LLM_CHAT_PATH", "LUMA", "MARKET", "PLANT_PARAM", "REQUEST_ID_HEADERS", "RUNWAY",
    "SUNO", "VEO", "Answer", "Envelope", "FlagRecord", "FlagResponse", "Headers", "KieApi",
    "KieClient", "KieLlmClient", "MarketRecord", "RunwayRecord", "RunwayVideo", "SunoRecord",
    "SunoResponse", "SunoTrack", "Verdict", "classify", "decode", "error_for", "kontext_client",
    "llm_client", "luma_client", "market_body", "market_client", "modelless_body", "parse_chat",
    "parse_create", "parse_record_kontext", "parse_record_luma", "parse_record_market",
    "parse_record_runway", "parse_record_suno", "parse_record_veo", "planted_job_id",
    "runway_client", "suno_client", "top_level_body", "veo_client",
]
