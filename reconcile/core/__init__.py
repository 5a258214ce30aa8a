"""Internal: pure helpers below everything else (layer: core), beside the public core modules
``reconcile.settings``, ``reconcile.states``, ``reconcile.errors`` and ``reconcile.settlement``.

* :mod:`reconcile.core.redact` — what never reaches a customer, a log, a row or a terminal
  (every credential shape: ``redact.text`` / ``redact.value``, the one redaction of every sink;
  internal addresses; terminal controls).
* :mod:`reconcile.core.limits` — a declared ``Content-Length`` against a byte cap; text a
  ``text`` column can hold.
* :mod:`reconcile.core.runtime_view` — ``RuntimeView``, what the layers below the runtime read
  of a ``Runtime`` (they annotate with it; the runtime imports them).
"""
