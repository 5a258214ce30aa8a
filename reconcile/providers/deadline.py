"""Internal: the library's own mechanics, not an import path for platforms (may move).

A hard total deadline for one HTTP exchange (name resolution + connect to every address tried +
request + status line + headers + body): the sync calls (README, Design notes: Sync calls and
their deadline; issue 11 hole 7), and every exchange of
:class:`~reconcile.providers.http.HttpClient` (polls, the sweep's and the batch's reads, webhook
confirming reads, creates), the fal JWKS fetch (issue 25 finding 4) and the media fetch's name
resolution (:func:`resolve`).

Per-read timeouts give a call no worst case: a server that trickles a byte before each read
timeout keeps it alive for ever. Inside :func:`bounded`, every socket the session's connections
use is tracked, and a watchdog shuts them at the deadline; the blocked read then fails and the
exchange raises :class:`DeadlineExceeded` (a ``requests.Timeout``, so the clients' timeout path
classifies it ``UPSTREAM_TIMEOUT``). Only sessions prepared with :func:`prepare` are tracked.
Deadlines nest: a socket opened under an inner :func:`bounded` is watched by every enclosing one
(a sync call's deadline around its client's own per-exchange deadline), and the first to pass
shuts it.
"""

from __future__ import annotations

import heapq
import ipaddress
import itertools
import math
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol

import requests
import requests.adapters
import urllib3
import urllib3.connection

from ..errors import ErrorCode, SyncCallFailed


class DeadlineExceeded(requests.Timeout):
    """The exchange was still running at its total deadline."""


class _Watch:
    """The sockets of one bounded exchange, shut together when the deadline passes."""

    def __init__(self, seconds: float, parent: _Watch | None = None) -> None:
        self.lock = threading.Lock()
        self.parent = parent  # an enclosing deadline: it watches our sockets too
        self.at = time.monotonic() + max(0.0, seconds)
        self.expired = False
        self.ended = False  # the exchange is over: a late timer shuts nothing
        self.sockets: list[Any] = []  # shut at the deadline
        self.owned: list[socket.socket] = []  # our dups: closed when the outermost watch ends

    def passed(self) -> bool:
        """This deadline, or an enclosing one, has passed."""
        return self.expired or (self.parent is not None and self.parent.passed())

    def remaining(self) -> float:
        """Seconds left before this deadline or an enclosing one (0 once either passed)."""
        left = self.at - time.monotonic()
        if self.parent is not None:
            left = min(left, self.parent.remaining())
        return 0.0 if self.passed() else max(0.0, left)

    def add(self, sock: Any, *, owned: bool = False) -> None:
        with self.lock:
            self.sockets.append(sock)
            if owned and self.parent is None:  # the outermost watch closes the dups
                self.owned.append(sock)
            expired = self.expired
        if expired:  # joined after the deadline: never used
            _shut(sock)
        if self.parent is not None:
            self.parent.add(sock, owned=owned)

    def discard(self, *socks: Any) -> None:
        """A connection went back to the pool: the next exchange (maybe another thread's)
        owns it now, so this watch (nor an enclosing one) must never shut it."""
        with self.lock:
            self.sockets = [s for s in self.sockets if all(s is not d for d in socks)]
        if self.parent is not None:
            self.parent.discard(*socks)

    def end(self) -> None:
        with self.lock:
            self.ended = True

    def expire(self) -> None:
        # under the lock: the watchdog may fire just as the exchange ends, so a late expire
        # must not shut a socket that ``discard``/``end`` handed on meanwhile
        with self.lock:
            if self.ended:
                return
            self.expired = True
            for sock in self.sockets:
                _shut(sock)


def _shut(sock: Any) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


class _Watchdog:
    """ONE daemon thread per process that expires every watch at its deadline (a heap of
    deadlines; a thread per exchange would be started and stopped for every poll). Started
    lazily, and again in a forked child (a prefork worker does not inherit the parent's thread).

    The thread sleeps until the earliest deadline in the heap and is woken early only by a
    deadline earlier than the one it sleeps for. An exchange that ended in time leaves its watch
    in the heap; ended watches at the head are dropped unexpired, by the next exchange's
    :meth:`schedule` or by the thread when it wakes. So exchanges that end in time, all with the
    same timeout, wake the thread about once per timeout, not once per exchange (a wake per
    exchange was a context switch and most of a status read's deadline cost)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.heap: list[tuple[float, int, _Watch]] = []
        self.order = itertools.count()
        self.pid: int | None = None
        self.waking_at = math.inf  # when the thread wakes by itself (inf: it waits for notify)

    # ended watches dropped per schedule, and per turn of the thread between two takes of the
    # lock: a long run of them (behind a long live exchange) is dropped a slice at a time, so no
    # exchange's schedule, nor a deadline due meanwhile, waits for all of it
    DROP_SLICE = 64
    # the longest the thread sleeps at once: an infinite or huge total (a read timeout of
    # ``inf``) would overflow the condition's wait and end the thread
    MAX_SLEEP = 3600.0

    def schedule(self, seconds: float, watch: _Watch) -> None:
        at = time.monotonic() + max(0.0, seconds)
        with self.cond:
            if self.pid != os.getpid():
                self.pid, self.heap, self.waking_at = os.getpid(), [], math.inf
                threading.Thread(target=self._run, name="reconcile-deadline", daemon=True).start()
            self._drop_ended(self.DROP_SLICE)
            heapq.heappush(self.heap, (at, next(self.order), watch))
            if at < self.waking_at:  # otherwise the thread wakes in time and sees it then
                self.waking_at = at
                self.cond.notify()

    def _drop_ended(self, limit: int) -> bool:
        """Drop up to ``limit`` ended watches at the head of the heap (under the condition's
        lock). True: it stopped at the limit with an ended watch still at the head."""
        heap = self.heap
        for _ in range(limit):
            if not heap or not heap[0][2].ended:
                return False
            heapq.heappop(heap)
        return bool(heap) and heap[0][2].ended

    def _run(self) -> None:
        while True:
            watch = None
            with self.cond:
                if not self._drop_ended(self.DROP_SLICE):  # else: the next slice, lock let go
                    now = time.monotonic()
                    if self.heap and self.heap[0][0] <= now:
                        watch = heapq.heappop(self.heap)[2]
                    else:
                        self.waking_at = self.heap[0][0] if self.heap else math.inf
                        self.cond.wait(min(self.waking_at - now, self.MAX_SLEEP)
                                       if self.heap else None)
            if watch is not None:
                watch.expire()  # a no-op for an exchange that ended just in time


_WATCHDOG = _Watchdog()
# a child forked while another thread held the condition's lock must not inherit it locked
os.register_at_fork(after_in_child=lambda: _Watchdog.__init__(_WATCHDOG))


class _Current(threading.local):
    watch: _Watch | None = None


_CURRENT = _Current()


def resolve(host: str, port: int, seconds: float, *,
            resolver: Any = None) -> list[tuple[Any, ...]]:
    """``getaddrinfo`` bounded to ``seconds``: the watchdog shuts sockets, and a name being
    resolved has none yet, so a slow DNS answer would outlive any deadline. It runs in a
    daemon thread that is abandoned at the bound (``TimeoutError``); an address literal is
    answered at once, without a thread."""
    lookup = resolver or socket.getaddrinfo
    try:
        ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        pass
    else:
        return list(lookup(host.strip("[]"), port, type=socket.SOCK_STREAM))
    answer: dict[str, Any] = {}

    def run() -> None:
        try:
            answer["infos"] = list(lookup(host, port, type=socket.SOCK_STREAM))
        except BaseException as exc:  # handed to the caller's thread
            answer["error"] = exc

    thread = threading.Thread(target=run, name="reconcile-resolve", daemon=True)
    thread.start()
    thread.join(max(0.0, seconds))
    if "error" in answer:
        raise answer["error"]
    if "infos" not in answer:
        raise TimeoutError(f"resolving {host} outlived the total deadline ({seconds:.3g} s left)")
    infos: list[tuple[Any, ...]] = answer["infos"]
    return infos


if TYPE_CHECKING:
    _ConnectionBase = urllib3.connection.HTTPConnection
else:
    _ConnectionBase = object


class KeptAlive(_ConnectionBase):
    """Connection mixin: a pooled connection's socket joins the watch of the exchange that
    reuses it (its pool, :class:`Pooled`, takes it out again when the connection goes back)."""

    def request(self, *args: Any, **kwargs: Any) -> Any:
        sock = getattr(self, "sock", None)
        if _CURRENT.watch is not None and sock is not None:  # a kept-alive connection
            _CURRENT.watch.add(sock)
        return super().request(*args, **kwargs)


class _Tracked(KeptAlive):
    """Connection mixin: a new socket, or a pooled connection's socket, joins the watch.

    Under a deadline the connect is bounded too: the name is resolved within what is left
    (:func:`resolve`), and each address the name resolves to is tried with the connect timeout
    cut to what is left, so neither a slow DNS answer nor many silent addresses outlive it."""

    def _new_conn(self) -> socket.socket:
        watch = _CURRENT.watch
        sock = super()._new_conn() if watch is None else self._bounded_conn(watch)
        track(sock, self)
        return sock

    def _bounded_conn(self, watch: _Watch) -> socket.socket:
        host, timeout = self._dns_host, self.timeout
        try:
            infos = resolve(host, self.port, watch.remaining())
        except socket.gaierror as exc:
            raise urllib3.exceptions.NameResolutionError(self.host, self, exc) from exc
        except TimeoutError as exc:
            raise urllib3.exceptions.ConnectTimeoutError(self, str(exc)) from exc
        failure: Exception | None = None
        try:
            for info in infos:
                left = watch.remaining()
                if left <= 0:
                    break
                self._dns_host = info[4][0]
                self.timeout = cut_to(timeout, left)
                try:
                    return super()._new_conn()
                except (urllib3.exceptions.ConnectTimeoutError,
                        urllib3.exceptions.NewConnectionError) as exc:
                    failure = exc
        finally:
            self._dns_host, self.timeout = host, timeout
        raise failure or urllib3.exceptions.ConnectTimeoutError(
            self, f"Connection to {host} timed out (total deadline)")


class _HTTPConnection(_Tracked, urllib3.connection.HTTPConnection):
    pass


class _HTTPSConnection(_Tracked, urllib3.connection.HTTPSConnection):
    pass


class Pooled:
    """Pool mixin: a connection put back (in the releasing exchange's thread) leaves its watch."""

    def _put_conn(self, conn: Any) -> None:
        if _CURRENT.watch is not None and conn is not None:
            _CURRENT.watch.discard(getattr(conn, "sock", None), getattr(conn, "_watch_dup", None))
        super()._put_conn(conn)  # type: ignore[misc]


class _HTTPPool(Pooled, urllib3.HTTPConnectionPool):
    ConnectionCls = _HTTPConnection


class _HTTPSPool(Pooled, urllib3.HTTPSConnectionPool):
    ConnectionCls = _HTTPSConnection


class _Adapter(requests.adapters.HTTPAdapter):
    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {"http": _HTTPPool, "https": _HTTPSPool}


def cut_to(timeout: Any, left: float) -> Any:
    """A connect timeout cut to the ``left`` seconds of the current deadline (urllib3's
    timeout may be a sentinel for "the default": then ``left`` itself)."""
    return left if not isinstance(timeout, int | float) else min(timeout, left)


def time_left() -> float | None:
    """Seconds left before the current :func:`bounded` deadline or an enclosing one (0 once
    either passed); None outside :func:`bounded`. The watchdog shuts only connected sockets, so
    a transport of its own cuts its connect to this (the media fetch's pinned one)."""
    watch = _CURRENT.watch
    return None if watch is None else watch.remaining()


def track(sock: socket.socket, conn: Any) -> None:
    """Put a socket just connected (by :class:`_Tracked`, or by a transport of its own: the
    media fetch's pinned one) under the current :func:`bounded` deadline: a dup of it is shut
    at the deadline and closed when the outermost deadline ends. ``conn``: the connection that
    owns the socket; the dup is kept on it, so that a pool of :class:`Pooled` takes it out of
    the watch when the connection goes back (kept alive). Nothing happens outside
    :func:`bounded`."""
    if _CURRENT.watch is not None:
        conn._watch_dup = sock.dup()  # a dup shuts the same socket, TLS-wrapped or not
        _CURRENT.watch.add(conn._watch_dup, owned=True)


def sync_seconds(settings: Any) -> float:
    """The sync call deadline of ``settings`` in (scaled) seconds."""
    from datetime import timedelta

    return float(settings.scaled(timedelta(seconds=settings.sync_deadline)).total_seconds())


def prepare(session: requests.Session, url: str) -> requests.Session:
    """Make ``session``'s exchanges with ``url`` tracked: the plain ``HTTPAdapter`` that serves
    it (requests' default, mounted on the scheme, or one the platform mounted with its own pool
    sizes) is replaced in place by the tracking adapter, with the same pool settings. An adapter
    of the caller's own class is left alone and not bounded. Idempotent and cheap once done."""
    adapters = getattr(session, "adapters", None)
    if not isinstance(adapters, dict):  # not a requests.Session (a test double): left alone
        return session
    for prefix, adapter in list(adapters.items()):
        if url.lower().startswith(prefix.lower()):  # requests' own match: longest prefix first
            if type(adapter) is requests.adapters.HTTPAdapter:
                adapters[prefix] = _Adapter(
                    pool_connections=adapter._pool_connections,
                    pool_maxsize=adapter._pool_maxsize,
                    max_retries=adapter.max_retries,
                    pool_block=adapter._pool_block)
            break
    return session


@contextmanager
def bounded(seconds: float) -> Iterator[None]:
    """Run one exchange on a :func:`prepare`-d session under a total deadline of ``seconds``."""
    previous = _CURRENT.watch
    watch = _Watch(seconds, previous)
    _CURRENT.watch = watch
    _WATCHDOG.schedule(seconds, watch)
    try:
        yield
        if watch.passed():  # a cut in the headers can look like a short but complete answer
            raise DeadlineExceeded(f"total deadline of {seconds:g} s exceeded")
    except DeadlineExceeded:
        raise
    except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as exc:
        if watch.passed():
            raise DeadlineExceeded(f"total deadline of {seconds:g} s exceeded") from exc
        raise
    finally:
        watch.end()
        _CURRENT.watch = previous
        for sock in watch.owned:
            sock.close()
        watch.sockets, watch.owned = [], []  # the heap keeps the watch until its deadline


# -- the sync call every sync client sends ------------------------------------------------


class SendsOnce(Protocol):
    """What :func:`send_sync` needs of a client: :meth:`~.http.HttpClient.send_once` (this
    module sits below :mod:`.http`, which bounds every exchange with it)."""

    def send_once(self, method: str, path: str, **kwargs: Any) -> requests.Response: ...


def send_sync(http: SendsOnce, label: str, seconds: float, method: str, path: str,
              **kwargs: Any) -> requests.Response:
    """Send a sync call once within its total deadline (``seconds``, :func:`bounded`); a
    timeout is ``SyncCallFailed(UPSTREAM_TIMEOUT)``, any other transport error a plain
    ``SyncCallFailed``, each message led by ``label``."""
    try:
        with bounded(seconds):
            return http.send_once(method, path, **kwargs)
    except requests.Timeout as exc:
        raise SyncCallFailed(f"{label}: timeout: {exc}", code=ErrorCode.UPSTREAM_TIMEOUT) from exc
    except requests.RequestException as exc:
        raise SyncCallFailed(f"{label}: {exc.__class__.__name__}: {exc}") from exc

