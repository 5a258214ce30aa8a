"""reconcile: crash-safe, money-safe external AI provider calls for Celery workers."""

__version__ = "0.1.0"
