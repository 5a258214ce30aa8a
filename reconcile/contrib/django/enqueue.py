"""Internal: how the Django runtime enqueues a job's create and polls: after the platform's
commit, and inline in eager mode.

**After the commit.** ``api.submit`` commits the job and its reservation on the library's own
connection, then asks for the create. Inside the platform's ``transaction.atomic()`` (on the
library's database alias, ``ATOMIC_REQUESTS`` included) that request waits for the platform's
commit (``transaction.on_commit``): a view that submits and then raises never sends a create.
Django keeps no hook for a rollback, but it drops the on-commit callback when the transaction
(or the savepoint around the submit) rolls back; the callback's finalizer then withdraws the
job (``lifecycle.cancel.withdraw``: cancelled, refunded in full, by the same compare-and-set on
``not_started`` the create claim needs), so the sweep never sends it later either. Django also
drops the callbacks after a commit when an earlier one of the platform's raises: on PostgreSQL
the submit notes the platform transaction's id (``txid_current()``, one round trip) and the
finalizer asks the server whether it committed (``txid_status``): a committed job is never
withdrawn, and its create is left to the sweep, as after a failed send. A job whose
transaction stays open longer than the sweep's not-started age (two minutes) may be sent by the
sweep before the commit: keep a transaction that submits short.

**Eager** (``RECONCILE = {"eager": True}``, for tests): the create and every poll run in this
process, one after the other, in the request (after the commit), each poll after its countdown
(``time_scale`` shrinks it), until the job is done; nothing reaches the broker. A step that
raises is logged, as a worker would, and the sweep picks the job up in production.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

from ...runtime import Runtime

log = logging.getLogger("reconcile.django")

# a bound on the steps one eager run takes (a poll chain that never ends is a bug to report)
EAGER_MAX_STEPS = 10_000

_local = threading.local()


def wire(rt: Runtime, alias: str, eager: Callable[[], bool]) -> None:
    """Give ``rt`` the Django integration's enqueues (``rt.enqueue_create`` / ``enqueue_poll``
    as ``tasks.set_runtime`` left them are the Celery sends)."""
    send_create, send_poll = rt.enqueue_create, rt.enqueue_poll

    def enqueue_create(job_id: uuid.UUID, countdown: float = 0.0) -> None:
        if eager():
            step = _eager(lambda: _create_step(rt, job_id), countdown, rt)
        else:
            def step() -> None:
                send_create(job_id, countdown)
        _after_commit(rt, alias, job_id, step)

    def enqueue_poll(job_id: uuid.UUID, generation: int, seq: int, countdown: float,
                     status: str | None = None) -> None:
        if eager():
            _eager(lambda: _poll_step(rt, job_id, generation, seq, status), countdown, rt)()
        elif status is None:
            send_poll(job_id, generation, seq, countdown)
        else:  # the Celery send (tasks.enqueue_poll) carries it in the message's header
            send_poll(job_id, generation, seq, countdown, status=status)

    rt.enqueue_create = enqueue_create
    rt.enqueue_poll = enqueue_poll


# ----------------------------------------------------------------------------- after the commit


def _after_commit(rt: Runtime, alias: str, job_id: uuid.UUID, step: Callable[[], None]) -> None:
    from django.db import connections, transaction

    connection = connections[alias]
    if not connection.in_atomic_block:
        step()
        return
    ran = {"done": False}
    xid = _transaction_id(connection)

    def on_commit() -> None:
        ran["done"] = True
        try:
            step()
        except Exception:  # committed: never an error the client would retry (a second job)
            log.exception("create_enqueue_failed job_id=%s (the sweep re-enqueues it)", job_id)

    # the finalizer holds no reference to the callback: it runs when Django drops the callback,
    # after calling it (commit) or without (a rollback of the transaction or its savepoint)
    weakref.finalize(on_commit, _dropped, rt, job_id, ran, xid)
    transaction.on_commit(on_commit, using=alias)


def _transaction_id(connection: Any) -> int | None:
    """The id of the platform's transaction on PostgreSQL (None elsewhere, or when it is
    already bound to roll back): a dropped callback then tells a commit from a rollback."""
    if connection.vendor != "postgresql" or connection.needs_rollback:
        return None
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT txid_current()")
            row = cursor.fetchone()
    except Exception:  # the transaction is failing already: it cannot commit
        log.warning("submit_transaction_id_unread", exc_info=True)
        return None
    return int(row[0]) if row else None


def _committed(rt: Runtime, xid: int) -> bool:
    from sqlalchemy import text

    try:
        with rt.sessions() as session:
            status = session.execute(text("SELECT txid_status(:xid)"), {"xid": xid}).scalar()
    except Exception:
        log.exception("submit_transaction_status_unread xid=%s", xid)
        return False
    return status == "committed"


def _dropped(rt: Runtime, job_id: uuid.UUID, ran: dict[str, bool], xid: int | None) -> None:
    if ran["done"]:
        return
    if xid is not None and _committed(rt, xid):
        # committed, but Django dropped the callback (an earlier on-commit hook raised): the
        # job is the platform's; the sweep sends its create (the not-started row)
        log.warning("create_enqueue_dropped_after_commit job_id=%s (the sweep enqueues it)",
                    job_id)
        return
    from ...lifecycle.cancel import withdraw

    try:
        withdrawn = withdraw(rt, job_id, "platform_rollback")
    except Exception:  # never raised into Django's rollback; the sweep still sees the row
        log.exception("submit_rollback_withdraw_failed job_id=%s", job_id)
        return
    log.warning("submit_rolled_back job_id=%s withdrawn=%s", job_id, withdrawn)


# ----------------------------------------------------------------------------- eager


def _create_step(rt: Runtime, job_id: uuid.UUID) -> Any:
    from ... import lifecycle

    return lifecycle.create_step(rt, job_id)


def _poll_step(rt: Runtime, job_id: uuid.UUID, generation: int, seq: int,
               status: str | None = None) -> Any:
    from ... import lifecycle

    return lifecycle.poll_step(rt, job_id, generation, seq, status)


def _eager(run: Callable[[], Any], countdown: float, rt: Runtime) -> Callable[[], None]:
    """A step for this thread's eager queue: run now when no eager run is under way, else after
    the steps queued before it (a poll a create schedules runs after the create returns)."""
    from ...worker.broker import cap_countdown

    wait = cap_countdown(countdown, rt.settings)

    def step() -> None:
        queue: deque[tuple[float, Callable[[], Any]]] = _local.__dict__.setdefault("queue", deque())
        queue.append((wait, run))
        if getattr(_local, "running", False):
            return
        _local.running = True
        try:
            for _ in range(EAGER_MAX_STEPS):
                if not queue:
                    return
                delay, work = queue.popleft()
                if delay:
                    time.sleep(delay)
                try:
                    work()
                except Exception:  # as a worker logs a task that raised
                    log.exception("eager_step_failed")
            log.error("eager_run_stopped after %s steps", EAGER_MAX_STEPS)
        finally:
            queue.clear()
            _local.running = False

    return step
