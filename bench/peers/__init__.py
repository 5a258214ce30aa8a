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

``python -m bench.peers.run`` drives it (:mod:`.run`: the passes and the files;
:mod:`.measure`: one system's run and its recovery run; :mod:`.limits`: the machine's limits;
:mod:`.report`: the table; :mod:`.web`: the web tier's process; :mod:`.harness`: processes,
the simulator process, CPU per process group, the CPU burners; :mod:`.upstream`: the peers'
client of the simulator). Never imported by the library; the tests import :mod:`.ledger`,
:mod:`.measure` and :mod:`.report` only (DBOS is in the ``bench`` extra, not the ``test`` one).
"""
