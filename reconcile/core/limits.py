"""Internal: the library's own mechanics, not an import path for platforms (may move).

What the library can take and keep:

* a declared ``Content-Length`` read against a byte cap (:func:`declared_over`): the one rule the
  request-body cap (:class:`reconcile.webhook_ingest.CappedBody`) and the media fetch
  (:mod:`reconcile.media.fetch`) share. Only ASCII digits are a byte count (``str.isdigit`` also
  takes ``²``, which ``int`` refuses), compared by length first (``int`` refuses more than 4300
  digits);
* text a PostgreSQL ``text`` column can hold (:func:`storable_text`): no NUL, no unpaired
  surrogate (psycopg cannot encode one) — a customer's identifiers at submit, a provider's task
  id at create.
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


def storable_text(value: str) -> bool:
    """``value`` fits a PostgreSQL ``text``: no NUL and no unpaired surrogate."""
    if "\x00" in value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate
        return False
    return True


__all__ = ["declared_over", "storable_text"]
