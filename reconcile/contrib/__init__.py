"""Optional integrations with web frameworks (``reconcile.contrib.django``)."""

__all__: list[str] = []
