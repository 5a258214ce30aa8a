"""Internal: the library's own mechanics, not an import path for platforms (may move).

A hard total deadline for one HTTP exchange (connect + request + status line + headers +
body), for the sync calls (README, Design notes: Sync calls and their deadline; issue 11 hole 7).

Per-read timeouts give a call no worst case: a server that trickles a byte before each read
timeout keeps it alive for ever. Inside :func:`bounded`, every socket the session's connections
use is tracked, and a watchdog shuts them at the deadline; the blocked read then fails and the
exchange raises :class:`DeadlineExceeded` (a ``requests.Timeout``, so the clients' timeout path
classifies it ``UPSTREAM_TIMEOUT``). Only sessions prepared with :func:`prepare` are tracked.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import requests
import requests.adapters
import urllib3
import urllib3.connection

from ..errors import ErrorCode, SyncCallFailed

if TYPE_CHECKING:
    from .http import HttpClient


class DeadlineExceeded(requests.Timeout):
    """The exchange was still running at its total deadline."""


class _Watch:
    """The sockets of one bounded exchange, shut together when the deadline passes."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.expired = False
        self.ended = False  # the exchange is over: a late timer shuts nothing
        self.sockets: list[Any] = []  # shut at the deadline
        self.owned: list[socket.socket] = []  # our dups: closed when the exchange ends

    def add(self, sock: Any, *, owned: bool = False) -> None:
        with self.lock:
            self.sockets.append(sock)
            if owned:
                self.owned.append(sock)
            expired = self.expired
        if expired:  # joined after the deadline: never used
            _shut(sock)

    def discard(self, *socks: Any) -> None:
        """A connection went back to the pool: the next exchange (maybe another thread's)
        owns it now, so this watch must never shut it."""
        with self.lock:
            self.sockets = [s for s in self.sockets if all(s is not d for d in socks)]

    def end(self) -> None:
        with self.lock:
            self.ended = True

    def expire(self) -> None:
        # under the lock: ``Timer.cancel()`` cannot stop a callback already running, so a late
        # expire must not shut a socket that ``discard``/``end`` handed on meanwhile
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


class _Current(threading.local):
    watch: _Watch | None = None


_CURRENT = _Current()


class _Tracked:
    """Connection mixin: a new socket, or a pooled connection's socket, joins the watch."""

    def _new_conn(self) -> socket.socket:
        sock = super()._new_conn()  # type: ignore[misc]
        if _CURRENT.watch is not None:
            # a dup shuts the same connection, TLS-wrapped or not
            self._watch_dup = sock.dup()
            _CURRENT.watch.add(self._watch_dup, owned=True)
        return sock

    def request(self, *args: Any, **kwargs: Any) -> Any:
        sock = getattr(self, "sock", None)
        if _CURRENT.watch is not None and sock is not None:  # a kept-alive connection
            _CURRENT.watch.add(sock)
        return super().request(*args, **kwargs)  # type: ignore[misc]


class _HTTPConnection(_Tracked, urllib3.connection.HTTPConnection):
    pass


class _HTTPSConnection(_Tracked, urllib3.connection.HTTPSConnection):
    pass


class _Pooled:
    """Pool mixin: a connection put back (in the releasing exchange's thread) leaves its watch."""

    def _put_conn(self, conn: Any) -> None:
        if _CURRENT.watch is not None and conn is not None:
            _CURRENT.watch.discard(getattr(conn, "sock", None), getattr(conn, "_watch_dup", None))
        super()._put_conn(conn)  # type: ignore[misc]


class _HTTPPool(_Pooled, urllib3.HTTPConnectionPool):
    ConnectionCls = _HTTPConnection


class _HTTPSPool(_Pooled, urllib3.HTTPSConnectionPool):
    ConnectionCls = _HTTPSConnection


class _Adapter(requests.adapters.HTTPAdapter):
    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {"http": _HTTPPool, "https": _HTTPSPool}


def sync_seconds(settings: Any) -> float:
    """The sync call deadline of ``settings`` in (scaled) seconds."""
    from datetime import timedelta

    return float(settings.scaled(timedelta(seconds=settings.sync_deadline)).total_seconds())


def prepare(session: requests.Session, base_url: str) -> requests.Session:
    """Mount the tracking adapter for ``base_url`` on ``session`` (unless the caller mounted
    an adapter of its own there, which is then left alone and not bounded)."""
    if type(session.get_adapter(base_url)) is requests.adapters.HTTPAdapter:
        session.mount(base_url.rstrip("/") + "/", _Adapter())
    return session


@contextmanager
def bounded(seconds: float) -> Iterator[None]:
    """Run one exchange on a :func:`prepare`-d session under a total deadline of ``seconds``."""
    watch, previous = _Watch(), _CURRENT.watch
    _CURRENT.watch = watch
    timer = threading.Timer(max(0.0, seconds), watch.expire)
    timer.daemon = True
    timer.start()
    try:
        yield
        if watch.expired:  # a cut in the headers can look like a short but complete answer
            raise DeadlineExceeded(f"total deadline of {seconds:g} s exceeded")
    except DeadlineExceeded:
        raise
    except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as exc:
        if watch.expired:
            raise DeadlineExceeded(f"total deadline of {seconds:g} s exceeded") from exc
        raise
    finally:
        timer.cancel()
        watch.end()
        _CURRENT.watch = previous
        for sock in watch.owned:
            sock.close()


# -- the sync call every sync client sends ------------------------------------------------


def send_sync(http: HttpClient, label: str, seconds: float, method: str, path: str,
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

