"""Internal: the library's own mechanics, not an import path for platforms (may move).

What the modules below :mod:`reconcile.runtime` read of a :class:`~reconcile.runtime.Runtime`
(:class:`RuntimeView`): the settings, the session factory, the HTTP session, the clock, the event
hooks and the two caches a runtime carries. The runtime imports those modules (the kind
registry, the jobstore's adoption rules, the ledger seam), so they cannot import it back, not
even for an annotation: a webhook scheme's ``secret(rt)``, the event publisher and the legacy
cutoff take a ``RuntimeView`` instead, and every ``Runtime`` is one (structurally: mypy checks
each call that hands one in).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import requests
    from sqlalchemy.orm import Session, sessionmaker

    from ..settings import Settings


class RuntimeView(Protocol):
    """The attributes of a :class:`~reconcile.runtime.Runtime` the lower layers read."""

    @property
    def settings(self) -> Settings: ...

    @property
    def sessions(self) -> sessionmaker[Session]: ...

    @property
    def http(self) -> requests.Session | None: ...

    @property
    def event_hooks(self) -> Sequence[Callable[[dict[str, Any]], None]]: ...

    @property
    def adoption_cache(self) -> dict[str, Any]:
        """Values read once from the database and never changed (the adoption time)."""

    @property
    def _clients(self) -> dict[str, Any]:
        """The runtime's per-process cache of clients (a family's JWKS cache, say)."""

    def now(self) -> datetime: ...
