"""Internal: the library's own mechanics, not an import path for platforms (may move).

What an endpoint's result is expected to hold: :class:`Expect`, :class:`OutputSpec` and the two
plain specs :data:`MEDIA` and :data:`ANY` (README, Design notes: Text and JSON outputs). A family
declaration (:class:`~reconcile.providers.family.ProviderFamily`) defaults to ``MEDIA``, and
:mod:`reconcile.providers.outputs` (the public import path of all four, with the lookup that
reads every family's declarations) sits above the families: these types sit below both.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Expect(StrEnum):
    MEDIA = "media"  # media files (URLs or data: URIs) only
    TEXT = "text"  # a text field (``OutputSpec.key``) — or Replicate's string / token list
    JSON = "json"  # a JSON document: the field ``key``, or the whole result without one
    ANY = "any"  # media if there is any, else whatever non-empty value the result holds


@dataclass(frozen=True)
class OutputSpec:
    expects: Expect
    key: str | None = None  # the result field holding a TEXT/JSON output (fal)


MEDIA = OutputSpec(Expect.MEDIA)
ANY = OutputSpec(Expect.ANY)
