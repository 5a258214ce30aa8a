"""Internal: the library's own mechanics, not an import path for platforms (may move).

The batch poller's thread pools (:mod:`reconcile.lifecycle.batch`): its status reads,
``POLL_BATCH_THREADS`` at a time (HTTP only: no session, no enqueue, the GIL released on I/O),
and the pool its per-job outcomes run on, each made after fork in the process that uses it. A
claim here is :class:`reconcile.lifecycle.batch.Claim` (typed ``Any``: that module imports
this one).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from .. import lifecycle
from ..errors import ProviderError
from ..providers.base import PollResult
from ..runtime import Runtime

_POOLS: dict[int, tuple[int, ThreadPoolExecutor]] = {}
_POOL_LOCK = threading.Lock()


def _pool(size: int, name: str = "reconcile-poll") -> ThreadPoolExecutor:
    """This process's read pool (made after fork, in the process that uses it)."""
    with _POOL_LOCK:
        key = os.getpid() if name == "reconcile-poll" else -os.getpid()
        held = _POOLS.get(key)
        if held is None or held[0] != size:
            if held is not None:
                held[1].shutdown(wait=False)
            held = (size, ThreadPoolExecutor(max_workers=size, thread_name_prefix=name))
            _POOLS[key] = held
        return held[1]


def finalize_pool(threads: int) -> ThreadPoolExecutor:
    """This process's finalize pool (the per-job outcomes of a round; database work and media:
    kept apart from the read pool, whose threads do HTTP only)."""
    return _pool(threads, "reconcile-finalize")


# what this process's finalize pool has queued, as the sum of each outcome's bound (seconds of
# storing at most): a round reserves its own before its grouped hold, so that hold counts what
# other rounds queued first (lifecycle.batch._holds), and releases it when its outcomes are done
_QUEUED: dict[int, timedelta] = {}


def reserve_finalize(bound: timedelta) -> timedelta:
    """Add ``bound`` to what this process's finalize pool has queued; returns what was queued
    before it."""
    with _POOL_LOCK:
        before = _QUEUED.get(os.getpid(), timedelta(0))
        _QUEUED[os.getpid()] = before + bound
        return before


def release_finalize(bound: timedelta) -> None:
    """What :func:`reserve_finalize` added, once the round's outcomes are done."""
    with _POOL_LOCK:
        _QUEUED[os.getpid()] = max(timedelta(0), _QUEUED.get(os.getpid(), timedelta(0)) - bound)


def _read(rt: Runtime, c: Any) -> PollResult | ProviderError | BaseException:
    if c.kind is None or c.kind.sync:
        return ProviderError("no async kind")  # not read; run_claims drops it
    try:
        return lifecycle.read_status(rt, c.job, c.kind)
    except Exception as exc:  # a raising client: no verdict (run_claims counts an attempt)
        return exc


def read_all(rt: Runtime, claims: list[Any]) -> list[Any]:
    """The status reads, ``POLL_BATCH_THREADS`` at a time; in claim order. Threads do HTTP
    only (no session, no enqueue)."""
    threads = min(rt.settings.poll_batch_threads, len(claims))
    if threads <= 1:
        return [_read(rt, c) for c in claims]
    for kind in {c.kind.name: c.kind for c in claims if c.kind is not None and not c.kind.sync
                 }.values():
        _widen_pool(rt.client(kind), rt.settings.poll_batch_threads)
    return list(_pool(rt.settings.poll_batch_threads).map(lambda c: _read(rt, c), claims))


_WIDENED: set[tuple[int, int]] = set()


def _widen_pool(client: Any, size: int) -> None:
    """Keep ``size`` connections per host in the client's ``requests.Session`` (requests
    pools 10): concurrent reads beyond the pool would each open and drop a connection."""
    from requests.adapters import HTTPAdapter

    from ..providers.http import HttpClient

    http = getattr(client, "http", None)
    session = getattr(http, "session", None) if isinstance(http, HttpClient) else None
    if session is None or size <= 10:
        return
    key = (os.getpid(), id(session))
    with _POOL_LOCK:
        if key in _WIDENED:
            return
        for prefix in ("http://", "https://"):
            session.mount(prefix, HTTPAdapter(pool_connections=10, pool_maxsize=size))
        _WIDENED.add(key)
