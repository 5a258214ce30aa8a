"""Internal: the library's own mechanics, not an import path for platforms (may move).

The library's queues and its task routes by queue layout (:func:`routes`,
``RECONCILE_QUEUE_LAYOUT``), and the ``worker_init`` receiver that has a worker of the layout
before the split consume the split queues too (:func:`consume_split_queues`). Public through
:mod:`reconcile.celery_install`; :mod:`reconcile.celery_settings` reads the routes from here, below
the module that merges those settings into an app.
"""

from __future__ import annotations

import logging
from typing import Any

from ..settings import Settings

log = logging.getLogger("reconcile.install")

QUEUE = "reconcile"  # settlements, the sweep's fan-out; every task in the single layout
SWEEP_QUEUE = "reconcile.sweep"
CREATE_QUEUE = "reconcile.create"
POLL_QUEUE = "reconcile.poll"
QUEUES = (POLL_QUEUE, CREATE_QUEUE, QUEUE, SWEEP_QUEUE)  # every queue the library may publish to
SWEEP_TASK = "reconcile.sweep"


def routes(layout: str = "split") -> dict[str, dict[str, str]]:
    """The library's task routes for a queue layout (``RECONCILE_QUEUE_LAYOUT``): ``split`` puts
    creates, polls (the chain's ``reconcile.poll`` and the batch poller's ``reconcile.poll_due``)
    and the sweep (with retention) on queues of their own, so a burst of creates cannot delay
    the reads of the jobs in flight; ``single`` keeps everything but the sweep on
    ``reconcile``. Either way the rest (settlements, the sweep's per-job fan-out) goes to
    ``reconcile``."""
    ours = {SWEEP_TASK: {"queue": SWEEP_QUEUE}, "reconcile.prune": {"queue": SWEEP_QUEUE}}
    if layout == "split":
        ours.update({"reconcile.create": {"queue": CREATE_QUEUE},
                     "reconcile.poll": {"queue": POLL_QUEUE},
                     "reconcile.poll_due": {"queue": POLL_QUEUE}})
    return {**ours, "reconcile.*": {"queue": QUEUE}}


def consume_split_queues(sender: Any = None, **_: object) -> None:
    """``worker_init`` (the worker's ``-Q`` selection is in place, its consumer not started): a
    worker that consumes ``reconcile`` but neither ``reconcile.create`` nor ``reconcile.poll`` —
    started with the layout from before the split (``-Q reconcile,reconcile.sweep``), or with
    no ``-Q`` — consumes those two as well, so its creates and polls never wait for a worker
    that is not there. Consuming several queues, a worker takes from them in turn: a burst of
    creates still leaves every other message to the polls. A worker that names either queue
    chose its layout and is left as it is."""
    app = getattr(sender, "app", None)
    if app is None or Settings().queue_layout != "split":
        return
    queues = app.amqp.queues
    consumed = set(queues.consume_from or queues)
    if QUEUE not in consumed or {CREATE_QUEUE, POLL_QUEUE} & consumed:
        return
    for name in (POLL_QUEUE, CREATE_QUEUE):
        queues.select_add(name)
    log.warning("reconcile_queue_layout worker consumes %s and %s too (it names reconcile but "
                "not them: the layout before creates and polls had queues of their own; see "
                "README, Worker layout)", POLL_QUEUE, CREATE_QUEUE)
