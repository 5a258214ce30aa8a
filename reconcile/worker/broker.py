"""Internal: the library's own mechanics, not an import path for platforms (may move).

The broker's limits and one kombu defect: what a worker needs to survive its broker.

* :func:`cap_countdown`: no message the library publishes waits longer than
  ``RECONCILE_MAX_COUNTDOWN`` (300 s). A countdown message is held *unacked* from the moment a
  worker fetches it: past the Redis visibility timeout it is redelivered on every restore cycle,
  past RabbitMQ's ``consumer_timeout`` the channel is closed with ``PRECONDITION_FAILED`` and the
  worker exits. Longer waits (a provider's ``Retry-After``) ride on ``create_not_before`` and the
  sweep instead of a message.
* :func:`limit_problems` / :func:`refuse_unsafe_limits`: at worker start, refuse a configuration
  where ``max countdown + prefetch × task_time_limit`` (the longest a delivery can stay unacked)
  reaches the visibility timeout (Redis) or the declared ``consumer_timeout`` (RabbitMQ), or
  where a Celery setting the library depends on has an unsafe value (:func:`setting_problems`:
  whether the app was configured by ``reconcile.install`` or by hand).
* :func:`survive_broker_loss`: the fix for a worker that exits when Redis goes away while it
  holds unacked messages (Celery 5.7.0 + kombu 5.7.0; see the function).
* :func:`reuse_redis_clients`: one Redis client per kombu channel instead of one per publish.
"""

from __future__ import annotations

import logging
from typing import Any

from ..settings import Settings

log = logging.getLogger("reconcile.broker")


def cap_countdown(countdown: float, settings: Settings) -> float:
    """``countdown`` bounded by the configured maximum (seconds, never negative)."""
    return max(0.0, min(float(countdown), float(settings.max_countdown)))


def limit_problems(conf: Any, settings: Settings) -> list[str]:
    """Why this configuration can hold a delivery unacked past the broker's limit ([] = safe)."""
    url = str(conf.broker_url or "")
    time_limit = float(conf.task_time_limit or 0)
    countdown = float(settings.max_countdown)
    # with acks_late a prefetched message is held unacked behind the tasks fetched before it
    prefetch = int(getattr(conf, "worker_prefetch_multiplier", 1))
    held = countdown + time_limit * max(1, prefetch)
    problems: list[str] = setting_problems(conf)
    if not time_limit:
        problems.append("task_time_limit is unset: a task could hold its delivery forever")
    if prefetch < 1:
        problems.append(f"worker_prefetch_multiplier={prefetch} fetches without bound: "
                        f"prefetched deliveries could be held unacked past any limit (set 1)")
    if url.startswith(("redis://", "rediss://")):
        options = conf.broker_transport_options or {}
        visibility = float(options.get("visibility_timeout", 3600))
        if held >= visibility:
            problems.append(
                f"max countdown {countdown:g} s + {_times(prefetch)}task_time_limit "
                f"{time_limit:g} s = {held:g} s reaches the Redis visibility timeout {visibility:g} s: a healthy message would "
                f"be redelivered (raise RECONCILE_BROKER_VISIBILITY_TIMEOUT or lower the others)")
    elif url.startswith(("amqp://", "amqps://", "pyamqp://")):
        consumer_timeout = float(settings.broker_consumer_timeout)
        if held >= consumer_timeout:
            problems.append(
                f"max countdown {countdown:g} s + {_times(prefetch)}task_time_limit "
                f"{time_limit:g} s = {held:g} s reaches RabbitMQ's consumer_timeout {consumer_timeout:g} s "
                f"(RECONCILE_BROKER_CONSUMER_TIMEOUT): the channel would close and the worker exit")
    return problems


def _times(prefetch: int) -> str:
    return f"prefetch {prefetch} × " if prefetch > 1 else ""


def setting_problems(conf: Any) -> list[str]:
    """The Celery settings of :mod:`reconcile.celery_settings` whose change is unsafe, read from
    the effective configuration ([] = safe). ``task_acks_late`` / ``task_reject_on_worker_lost``
    off only delay recovery to the sweep (it re-creates lost work from the database), and a
    prefetch above 1 is covered by the held-delivery rule of :func:`limit_problems`."""
    problems: list[str] = []
    if getattr(conf, "worker_cancel_long_running_tasks_on_connection_loss", False):
        problems.append(
            "worker_cancel_long_running_tasks_on_connection_loss=True: a broker blip would kill "
            "a create after the provider accepted it and leave the job uncertain (set False; "
            "every task is fenced in the database, so the second copy costs nothing)")
    return problems


class UnsafeBrokerLimits(RuntimeError):
    """The worker refuses to start: a delivery could outlive the broker's limit."""


def refuse_unsafe_limits(conf: Any, settings: Settings) -> None:
    problems = limit_problems(conf, settings)
    if problems:
        raise UnsafeBrokerLimits("; ".join(problems))


def survive_broker_loss() -> None:
    """Keep a Celery 5.7.0 worker alive when its Redis broker goes away (idempotent).

    Root cause (Celery 5.7.0 ``Consumer.on_connection_error_after_connected``, kombu 5.7.0): on a
    lost connection the consumer calls ``connection.collect()`` and then, new in 5.7.0,
    ``connection.close()``. ``collect()`` tries to close the default channel (the Redis channel
    fails half-way: its pending BRPOP read raises, so the channel stays open), drops the
    transport and sets ``transport.client = None``, but keeps ``_default_channel``. ``close()``
    then closes that stale channel again; its unacked-restore builds a new Redis pool from
    ``self.connection.client`` — now None — and raises ``AttributeError('NoneType' object has no
    attribute 'hostname')``. ``ignore_errors`` only swallows connection errors, so the worker
    logs "Unrecoverable error" and exits: every busy worker (countdown polls are always unacked)
    dies with its broker. Celery 5.6.3 never called ``close()`` there and survives.

    Fix: ``collect()`` forgets the default channel along with the transport it belongs to, so
    the following ``close()`` has nothing stale to close — what 5.6.3 effectively did. The
    unacked messages of the lost connection are not restored by the worker either way (Redis
    still holds them in ``unacked`` and restores them after the visibility timeout; a wiped
    Redis lost them, and the sweep re-creates the work from the database). Pinning 5.6.3
    instead would lose the 5.7 broker-loss fixes (bounded sockets on teardown, celery#9705).
    """
    from kombu.connection import Connection

    if getattr(Connection.collect, "reconcile_forgets_channel", False):
        return
    original = Connection.collect

    def collect(self: Any, socket_timeout: float | None = None) -> None:
        try:
            original(self, socket_timeout)
        finally:
            self._default_channel = None

    collect.reconcile_forgets_channel = True  # type: ignore[attr-defined]
    Connection.collect = collect  # type: ignore[method-assign]


def reuse_redis_clients() -> None:
    """Publish through one Redis client per kombu channel (idempotent; every app in the process).

    kombu 5.7.0's Redis channel builds a new ``redis.Redis`` for every publish, size check and
    purge (``Channel.conn_or_acquire`` without a client): the same connection pool each time, so
    no new connection, but the client's construction (its response callbacks, about 170 dict
    writes) was an eighth of a submit's CPU and of a chain poll's next-turn publish (cProfile of
    1,000 submits: 1.3 of 10.8 s). The client is kept on the channel and made again only when the
    channel's pool changed (closed and rebuilt); ``redis.Redis`` over a pool is safe to share
    between threads, and the pool resets itself in a forked child.
    """
    from collections.abc import Iterator
    from contextlib import contextmanager

    from kombu.transport import redis as kombu_redis

    if getattr(kombu_redis.Channel.conn_or_acquire, "reconcile_reuses_client", False):
        return

    @contextmanager
    def conn_or_acquire(self: Any, client: Any = None) -> Iterator[Any]:
        if client:
            yield client
            return
        pool = self.pool
        kept = self.__dict__.get("_reconcile_client")
        if kept is None or kept.connection_pool is not pool:
            kept = self._create_client()
            self.__dict__["_reconcile_client"] = kept
        yield kept

    conn_or_acquire.reconcile_reuses_client = True  # type: ignore[attr-defined]
    kombu_redis.Channel.conn_or_acquire = conn_or_acquire  # type: ignore[method-assign]
