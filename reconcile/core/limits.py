"""Internal: the library's own mechanics, not an import path for platforms (may move).

What the library can take and keep:

* a declared ``Content-Length`` read against a byte cap (:func:`declared_over`): the one rule the
  request-body cap (:class:`reconcile.webhook_ingest.CappedBody`) and the media fetch
  (:mod:`reconcile.media.fetch`) share. Only ASCII digits are a byte count (``str.isdigit`` also
  takes ``²``, which ``int`` refuses), compared by length first (``int`` refuses more than 4300
  digits);
* text a PostgreSQL ``text`` column can hold (:func:`storable_text`): no NUL, no unpaired
  surrogate (psycopg cannot encode one) — a customer's identifiers at submit, a provider's task
  id at create — and :func:`storable`, the one scrub of text that is kept anyway (every stored
  text through ``redact.text``, a verified delivery's fields).
"""

from __future__ import annotations

import re


def declared_over(declared: str, limit: int) -> bool | None:
    """Whether a declared ``Content-Length`` is over ``limit`` bytes; None when it is not a byte
    count at all."""
    digits = declared.strip()
    if not (digits.isascii() and digits.isdigit()):
        return None
    digits = digits.lstrip("0") or "0"
    return len(digits) > len(str(limit)) or int(digits) > limit


# what PostgreSQL's text and jsonb cannot hold: NUL, and an unpaired surrogate (psycopg cannot
# encode one; json.loads joins the valid pairs)
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def storable_text(value: str) -> bool:
    """``value`` fits a PostgreSQL ``text``: no NUL and no unpaired surrogate."""
    return _UNSTORABLE.search(value) is None


def storable(value: str) -> str:
    """``value`` as PostgreSQL can keep it: each NUL and unpaired surrogate as U+FFFD (a stored
    delivery, a stored error: a hostile provider's text never makes a write raise)."""
    return value if storable_text(value) else _UNSTORABLE.sub("\ufffd", value)


__all__ = ["declared_over", "storable", "storable_text"]
