"""Celery settings for a checkout (``app.config_from_object("celeryconfig")``).

The settings live in the package, :mod:`reconcile.celery_settings`, so an installed wheel has
them too; this module re-exports them.
"""

from reconcile.celery_settings import *  # noqa: F401,F403
