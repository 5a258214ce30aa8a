"""Internal: the library's own mechanics, not an import path for platforms (may move).

Anthropic's Messages API as a sync kind (:mod:`.client`). :data:`FAMILY` declares the family:
its kind, settings and simulator; it sends no webhooks.
"""

from __future__ import annotations

from ..family import MIN, Kind, ProviderFamily
from .client import (
    DEFAULT_MAX_TOKENS,
    AnthropicClient,
    Message,
    code_for,
    error_for,
    parse_message,
    sync_client,
)

FAMILY = ProviderFamily(
    name="anthropic",
    kinds=(
        Kind("anthropic-sync", True, 5 * MIN, None, None, None,
             "reconcile.providers.anthropic:sync_client", binds=()),
    ),
    urls={"anthropic_base_url": "https://api.anthropic.com"},
    secrets={"anthropic_api_key": ""},
    simulator="reconcile.testing.sim_anthropic",
)

__all__ = ["DEFAULT_MAX_TOKENS", "FAMILY", "AnthropicClient", "Message", "code_for", "error_for",
           "parse_message", "sync_client"]
