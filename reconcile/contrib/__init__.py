"""Optional integrations with web frameworks (``reconcile.contrib.django``)."""
