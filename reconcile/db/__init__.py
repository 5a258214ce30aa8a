"""Schema and engines. Platforms import :mod:`reconcile.db.models` and :mod:`reconcile.db.session`;
:mod:`reconcile.db.migrate` runs the library's migrations (``reconcile db upgrade``).
"""

__all__: list[str] = []
