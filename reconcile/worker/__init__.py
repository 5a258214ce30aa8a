"""Internal: the Celery worker's process mechanics behind the public
``reconcile.tasks``, ``reconcile.celery_app`` and ``reconcile.celery_install`` (layer: celery).

* :mod:`reconcile.worker.broker` — broker limits, capped countdowns, the fix for a worker that
  exits when its Redis connection drops.
* :mod:`reconcile.worker.heartbeat` — each worker process's liveness row, and the reaper of
  the processes whose row lapsed.
* :mod:`reconcile.worker.queues` — the library's queues, its task routes by layout, and the
  split queues a worker of the former layout consumes too.
* :mod:`reconcile.worker.installed` — the app every enqueue goes through (the installed one,
  else ``reconcile.celery_app``), sending, and the worker start-up checks ``reconcile.tasks``
  connects. Public through ``reconcile.celery_install``, which sits above the tasks module.
"""
