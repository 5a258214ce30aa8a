"""Internal: ``manage.py reconcile`` (the Django management command)."""
