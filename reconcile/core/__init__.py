"""Internal: pure helpers below everything else (layer: core), beside the public core modules
``reconcile.settings``, ``reconcile.states``, ``reconcile.errors`` and ``reconcile.settlement``.

* :mod:`reconcile.core.redact` — what never reaches a customer or a log (signed query strings,
  tokens, internal addresses).
"""
