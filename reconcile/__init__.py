"""reconcile: crash-safe, money-safe external AI provider calls for Celery workers."""

from .core.redact import install_log_redaction as _install_log_redaction

__all__ = [
    "__version__", "install",
]

__version__ = "0.1.0"

_install_log_redaction()  # no credential reaches a log, whoever logs it (redact.text)


def install(app, *, beat=True):  # type: ignore[no-untyped-def]
    """Install the library into the platform's Celery ``app``: its tasks, the settings it
    needs (never overriding the app's own; a warning where they differ), its queues' routes,
    the sweep's beat entry and the per-process engine hook. See :mod:`reconcile.celery_install`.
    """
    from .celery_install import install as _install

    return _install(app, beat=beat)
