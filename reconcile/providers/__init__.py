"""What a provider family is written with: the client protocols and results
(``AsyncProvider``, ``Created``, ``PollResult``, ``run``, ``resume``, …), the output
declarations (``declare_output``), the family declaration (``ProviderFamily``, ``Kind``) and the
webhook scheme (``WebhookScheme``). Each family is an internal package here, ``<family>/``,
holding its clients and its webhook scheme and declaring ``FAMILY``; ``docs/how-to/
add-a-provider-family.md`` walks through one. The names load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.facade import lazy as _lazy

if TYPE_CHECKING:
    from .base import (
        AsyncProvider,
        Created,
        CreateRequest,
        ListedTask,
        OnTaskCreated,
        Output,
        PollResult,
        PollStatus,
        SyncProvider,
        SyncResult,
        resume,
        run,
    )
    from .family import Kind, ProviderFamily
    from .outputs import (
        Expect,
        OutputSpec,
        data_uri_output,
        declare_output,
        declared_output,
        document_output,
        text_output,
    )
    from .scheme import Binding, WebhookEvent, WebhookScheme

_HOMES = {
    **dict.fromkeys(("AsyncProvider", "CreateRequest", "Created", "ListedTask", "OnTaskCreated",
                     "Output", "PollResult", "PollStatus", "SyncProvider", "SyncResult",
                     "resume", "run"), "base"),
    **dict.fromkeys(("Kind", "ProviderFamily"), "family"),
    **dict.fromkeys(("Expect", "OutputSpec", "data_uri_output", "declare_output",
                     "declared_output", "document_output", "text_output"), "outputs"),
    **dict.fromkeys(("Binding", "WebhookEvent", "WebhookScheme"), "scheme"),
}
__all__ = [
    "AsyncProvider", "Binding", "CreateRequest", "Created", "Expect", "Kind", "ListedTask",
    "OnTaskCreated", "Output", "OutputSpec", "PollResult", "PollStatus", "ProviderFamily",
    "SyncProvider", "SyncResult", "WebhookEvent", "WebhookScheme", "data_uri_output",
    "declare_output", "declared_output", "document_output", "resume", "run", "text_output",
]
__getattr__, __dir__ = _lazy(__name__, globals(), _HOMES)
