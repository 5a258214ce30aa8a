"""The peers benchmark: one workload, run by ``reconcile`` and by its peers, side by side.

N jobs each create an upstream task in the shipped simulator (``kie-standard``: the task is
done 30 s after its create), poll it every 5 s until it is done, download the output, write the
result and settle the job's credits. Every system gets the same simulator process, the same
PostgreSQL server (a fresh database each, dropped after), the same Redis (a db of its own,
flushed) and two worker processes:

* ``plain-celery`` (:mod:`.plain_celery`): a Celery app, ``self.retry(countdown=5)`` between
  polls, ``acks_late``, and the minimal money-safe ledger of :mod:`.ledger`;
* ``reconcile-chain`` / ``reconcile-batch`` (:mod:`.reconcile_app`): the library, its two poll
  modes (``RECONCILE_POLL_MODE``);
* ``dbos`` (:mod:`.dbos_app`): DBOS Transact, a durable workflow per job, the same ledger.

``python -m bench.peers.run`` drives it (:mod:`.run`); never imported by the library or its
tests (DBOS is only in the ``bench`` extra).
"""
