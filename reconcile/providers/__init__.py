"""The provider clients. Platforms import :mod:`reconcile.providers.base` (what every client
returns: ``Created``, ``PollResult``, ``run``, ``resume``) and :mod:`reconcile.providers.outputs`
(``declare_output``); the family modules are internal, reached through a kind's ``client``.
"""

__all__: list[str] = []
