"""Internal: the library's own mechanics, not an import path for platforms (may move).

A declared ``Content-Length`` read against a byte cap: the one rule the request-body cap
(:class:`reconcile.webhook_ingest.CappedBody`) and the media fetch (:mod:`reconcile.media.fetch`)
share. Only ASCII digits are a byte count (``str.isdigit`` also takes ``²``, which ``int``
refuses), and the count is compared by its length first (``int`` refuses more than 4300 digits).
"""

from __future__ import annotations


def declared_over(declared: str, limit: int) -> bool | None:
    """Whether a declared ``Content-Length`` is over ``limit`` bytes; None when it is not a byte
    count at all."""
    digits = declared.strip()
    if not (digits.isascii() and digits.isdigit()):
        return None
    digits = digits.lstrip("0") or "0"
    return len(digits) > len(str(limit)) or int(digits) > limit


__all__ = ["declared_over"]
