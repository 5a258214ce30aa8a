"""The provider clients. Platforms import :mod:`reconcile.providers.base` (what every client
returns: ``Created``, ``PollResult``, ``run``, ``resume``) and :mod:`reconcile.providers.outputs`
(``declare_output``). Each provider family is an internal package here, ``<family>/``, holding its
clients and its webhook scheme and declaring ``FAMILY``; :mod:`.family` is the registry every list
of the families derives from (kinds, settings, webhook schemes, output defaults, the simulator).
"""

__all__: list[str] = []
