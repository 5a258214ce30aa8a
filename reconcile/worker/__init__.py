"""Internal: the Celery worker's process mechanics behind the public
``reconcile.tasks``, ``reconcile.celery_app`` and ``reconcile.celery_install`` (layer: celery).

* :mod:`reconcile.worker.broker` — broker limits, capped countdowns, the fix for a worker that
  exits when its Redis connection drops.
* :mod:`reconcile.worker.heartbeat` — each worker process's liveness row, and the reaper of
  the processes whose row lapsed.
"""
