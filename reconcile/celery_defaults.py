"""Fallback Celery settings when the repo's ``celeryconfig.py`` is not importable."""

import importlib.util
import os

_here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "celeryconfig.py")
if os.path.exists(_here):  # pragma: no cover - source checkout
    _spec = importlib.util.spec_from_file_location("_reconcile_celeryconfig", _here)
    assert _spec and _spec.loader
    _mod = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_mod)
    globals().update({k: v for k, v in vars(_mod).items() if not k.startswith("_")})
else:  # pragma: no cover
    task_acks_late = True
    task_reject_on_worker_lost = True
    worker_prefetch_multiplier = 1
    task_ignore_result = True
