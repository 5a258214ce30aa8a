"""Internal: the library's own mechanics, not an import path for platforms (may move).

Safe fetch of provider outputs: the SSRF guard in front of every result URL (the URL and
address checks are :mod:`reconcile.media.guard`, the type helpers :mod:`reconcile.media.types`;
this module re-exports both).

A result URL comes from a provider's answer (or an unsigned KIE callback), so it is untrusted.
What the fetch guarantees, hop by hop (redirects are followed by hand):

* the URL is parsed the way the connection parses it: it is first normalised by ``requests``
  (the code that connects), and refused when ``urllib3`` and ``urllib.parse`` then disagree on
  its host or port, or when it holds a character they are known to read differently (``\\``,
  control characters) — so ``http://127.0.0.1:P\\@cdn.example/`` is refused;
* only http/https; the host must resolve to public addresses only, unless the operator
  allow-listed it (``host:port`` for one port, ``host:*`` for every port, a bare ``host`` for the
  scheme's default port only);
* the connection goes to the very address that was checked: the connection class refuses any
  other (host, port) and never resolves again (DNS rebinding), while the Host header, SNI and
  certificate check keep using the name;
* the caller's headers (provider auth) go only to the original scheme, host and port;
* the whole exchange — connect, status line, headers, body — is bounded by ``timeout``: a
  watchdog shuts the socket at the deadline, so a trickling server cannot stretch it;
* a connection is kept alive for the next fetch on the same thread (a download per completion
  otherwise pays a new TCP, and TLS, handshake): it is reused only for a hop approved to the
  very address and port it is connected to, under that hop's own deadline, and never across a
  fork.

Egress rules on the workers are still advised (README "Security model").
"""
from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self
from urllib.parse import urljoin

import requests
import requests.adapters
import urllib3
import urllib3.connection
import urllib3.util.connection

from ..core.limits import declared_over
from ..errors import MediaExpired, MediaFetchFailed, MediaTooLarge
from ..providers.deadline import (
    DeadlineExceeded,
    KeptAlive,
    Pooled,
    bounded,
    cut_to,
    resolve,
    time_left,
    track,
)
from .guard import (  # noqa: F401  (DEFAULT_PORTS, _normalise_host: read by the tests)
    DEFAULT_PORTS,
    Resolver,
    Target,
    _normalise_host,
    check_url,
    is_public_address,
    parse_media_url,
)
from .types import guess_extension, media_type_for_extension

REDIRECT_STATUSES = (301, 302, 303, 307, 308)
EXPIRED_STATUSES = (403, 404, 410)  # signed URLs answer 403 once expired, CDNs 404/410
CHUNK = 64 * 1024


@dataclass(frozen=True)
class FetchedMedia:
    data: bytes
    content_type: str | None  # media type only, parameters dropped ("image/png")
    final_url: str  # after redirects


# -- the pinned transport -------------------------------------------------------------------


class _Hop(threading.local):
    """The hop being fetched on this thread: its approved target."""

    target: Target | None = None
    reused: bool = False  # the hop's last attempt went out on a kept-alive connection


_HOP = _Hop()
_connect = urllib3.util.connection.create_connection  # module-level: tests watch it


def _pinned_socket(conn: Any) -> socket.socket:
    """Connect to the checked address of the approved hop, or refuse: never resolve again. The
    connection keeps the address it is pinned to (:meth:`_PinnedPool._get_conn` reuses it for
    that address only)."""
    target = _HOP.target
    if target is None or (_normalise_host(conn.host), conn.port) != (target.host, target.port):
        raise urllib3.exceptions.NewConnectionError(
            conn, "refused: not the host and port the media guard approved")
    # the watchdog shuts only a connected socket: the connect itself is cut to the hop's time
    # left (a retry after a kept connection failed comes late in the hop)
    left = time_left()
    if left is not None and left <= 0:
        raise urllib3.exceptions.ConnectTimeoutError(conn, "the hop's time bound has passed")
    timeout = conn.timeout if left is None else cut_to(conn.timeout, left)
    try:
        sock = _connect((target.address, target.port), timeout,
                        source_address=conn.source_address, socket_options=conn.socket_options)
    except TimeoutError as exc:
        raise urllib3.exceptions.ConnectTimeoutError(conn, f"connect timed out: {exc}") from exc
    except OSError as exc:
        raise urllib3.exceptions.NewConnectionError(conn, f"connect failed: {exc}") from exc
    conn._pinned_to = (target.address, target.port)
    track(sock, conn)  # the hop's total deadline shuts it (providers.deadline's watchdog)
    return sock


class _Pinned(KeptAlive):
    """Connection mixin: connects through :func:`_pinned_socket` (and keeps the address it is
    pinned to); ``KeptAlive``: a reused connection's socket joins the reusing hop's deadline."""

    _pinned_to: tuple[str, int] | None = None

    def _new_conn(self) -> socket.socket:
        return _pinned_socket(self)


class _PinnedHTTPConnection(_Pinned, urllib3.connection.HTTPConnection):
    pass


class _PinnedHTTPSConnection(_Pinned, urllib3.connection.HTTPSConnection):
    pass


class _PinnedPool(Pooled):
    """Pool mixin: a kept-alive connection is handed out only to a hop approved to the address
    and port it is connected to; any other is closed first, so the hop connects afresh through
    :func:`_pinned_socket` (a name that now resolves elsewhere, or an address approved under
    another call's allow-list, never rides an old connection). ``Pooled``: a connection put
    back leaves the hop's deadline."""

    def _get_conn(self, timeout: float | None = None) -> Any:
        conn = super()._get_conn(timeout)  # type: ignore[misc]
        target = _HOP.target
        pinned = None if target is None else (target.address, target.port)
        if getattr(conn, "sock", None) is not None and conn._pinned_to != pinned:
            conn.close()
        _HOP.reused = getattr(conn, "sock", None) is not None
        return conn


class _PinnedHTTPPool(_PinnedPool, urllib3.HTTPConnectionPool):
    ConnectionCls = _PinnedHTTPConnection


class _PinnedHTTPSPool(_PinnedPool, urllib3.HTTPSConnectionPool):
    ConnectionCls = _PinnedHTTPSConnection


class _StaleConnectionRetry(urllib3.util.Retry):
    """A kept-alive connection the server closed while idle fails as the request goes out: that
    GET is sent once more, on a new (pinned) connection, within the same deadline. Nothing else
    is ever sent twice: not an attempt on a new connection (a one-time URL the server consumed
    before the connection dropped stays a retryable failure, not a 410 on a second GET), not a
    refused or failed connect, a redirect or a status."""

    def increment(self, method: str | None = None, url: str | None = None, response: Any = None,
                  error: Exception | None = None, _pool: Any = None,
                  _stacktrace: TracebackType | None = None) -> Self:
        spent = self if _HOP.reused else self.new(total=0)  # a new connection's attempt: no more
        return super(_StaleConnectionRetry, spent).increment(method, url, response, error, _pool,
                                                             _stacktrace)


_STALE_CONNECTION_RETRY = _StaleConnectionRetry(total=1, connect=0, read=1, redirect=0,
                                                status=0, other=0, raise_on_redirect=False,
                                                raise_on_status=False)


class _PinnedAdapter(requests.adapters.HTTPAdapter):
    def __init__(self) -> None:
        super().__init__(pool_connections=4, pool_maxsize=1,
                         max_retries=_STALE_CONNECTION_RETRY)

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {"http": _PinnedHTTPPool,
                                                   "https": _PinnedHTTPSPool}


def _new_media_session() -> requests.Session:
    session = requests.Session()
    session.trust_env = False  # an environment proxy would connect somewhere else
    for prefix in ("http://", "https://"):
        session.mount(prefix, _PinnedAdapter())
    return session


class _Sessions(threading.local):
    """This thread's media session (its connections are kept alive between fetches)."""

    session: requests.Session | None = None


_SESSIONS = _Sessions()
# a forked child (a prefork worker) must never share its parent's connections
os.register_at_fork(after_in_child=lambda: setattr(_SESSIONS, "session", None))


@contextmanager
def _media_session() -> Iterator[requests.Session]:
    """This thread's media session for one call: one per thread (a ``requests.Session`` is not
    shared between threads), made at first use, and again in a forked child. Its connections
    outlive the call; its cookies do not, as on a session of the call's own."""
    session = _SESSIONS.session
    if session is None:
        session = _SESSIONS.session = _new_media_session()
    session.cookies.clear()
    try:
        yield session
    finally:
        session.cookies.clear()


@contextmanager
def _bounded_hop(target: Target, deadline_at: float) -> Iterator[None]:
    """Pin the hop to ``target``; at ``deadline_at`` the watchdog of
    :mod:`reconcile.providers.deadline` (the one every outbound exchange uses) shuts every
    socket it opened, so a status line or headers trickled a byte at a time cannot outlive the
    bound."""
    _HOP.target = target
    try:
        with bounded(max(0.0, deadline_at - time.monotonic())):
            yield
    except DeadlineExceeded as exc:
        raise MediaFetchFailed("media fetch exceeded its time bound") from exc
    finally:
        _HOP.target = None


def safe_fetch(
    url: str,
    *,
    allowed_hosts: Iterable[str] = (),
    max_bytes: int,
    timeout: float,
    headers: Mapping[str, str] | None = None,
    resolver: Resolver = socket.getaddrinfo,
    max_redirects: int = 5,
) -> FetchedMedia:
    """Fetch ``url`` under the SSRF guard, a ``max_bytes`` bound and a ``timeout`` (seconds)
    bound on the whole exchange.

    Raises UnsafeMediaURL, MediaTooLarge, MediaExpired (403/404/410) or MediaFetchFailed
    (anything else; retryable).
    """
    allowed = tuple(allowed_hosts)
    deadline = time.monotonic() + timeout
    origin: tuple[str, str, int] | None = None
    with _media_session() as http:
        for _hop in range(max_redirects + 1):
            _remaining(deadline)
            # the name is resolved within the deadline too (the watchdog has no socket to shut)
            target = check_url(url, allowed, lambda host, port, **_: resolve(
                host, port, deadline - time.monotonic(), resolver=resolver))
            origin = origin or target.origin
            # Caller headers (auth) go only to the original scheme, host and port.
            hop_headers = dict(headers or {}) if target.origin == origin else {}
            with _bounded_hop(target, deadline):
                response = _get(http, target.url, hop_headers, deadline)
                with response:
                    if response.status_code in REDIRECT_STATUSES:
                        location = response.headers.get("Location")
                        if not location:
                            raise MediaFetchFailed(
                                f"redirect {response.status_code} without Location")
                        url = urljoin(target.url, location)
                        continue
                    return _read(response, target.url, max_bytes, deadline)
        raise MediaFetchFailed(f"more than {max_redirects} redirects fetching media")


def _remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise MediaFetchFailed("media fetch exceeded its time bound")
    return left


def _get(http: requests.Session, url: str, headers: dict[str, str], deadline: float) -> Any:
    try:
        response = http.get(
            url,
            # kept alive: the connection is reused by this thread's next hop to the very
            # address and port it is pinned to (_PinnedPool), under that hop's deadline
            headers={"Accept-Encoding": "identity", **headers},
            stream=True,
            allow_redirects=False,  # each hop is re-checked by check_url
            timeout=_remaining(deadline),
        )
    except requests.RequestException as exc:
        _remaining(deadline)  # the watchdog fired: say so rather than "connection aborted"
        raise MediaFetchFailed(f"fetching media failed: {type(exc).__name__}: {exc}") from exc
    try:
        # a socket shut by the watchdog mid-headers reads as their end: never trust that answer
        _remaining(deadline)
    except MediaFetchFailed:
        response.close()
        raise
    return response


def _read(response: requests.Response, url: str, max_bytes: int, deadline: float) -> FetchedMedia:
    status = response.status_code
    if status in EXPIRED_STATUSES:
        raise MediaExpired(f"media URL answered {status} (expired or gone): {url[:200]}")
    if not 200 <= status < 300:
        raise MediaFetchFailed(f"media URL answered {status}: {url[:200]}")
    declared = response.headers.get("Content-Length")
    if declared is not None and declared_over(declared, max_bytes):
        raise MediaTooLarge(
            f"media declares {declared.strip()[:40]} bytes, over the {max_bytes}-byte bound"
        )
    chunks: list[bytes] = []
    total = 0
    try:
        for chunk in _chunks(response):
            total += len(chunk)  # decoded bytes: a gzip bomb counts at its inflated size
            if total > max_bytes:  # a lying or absent Content-Length is caught here
                raise MediaTooLarge(f"media body exceeds the {max_bytes}-byte bound")
            chunks.append(chunk)
            _remaining(deadline)
    except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as exc:
        _remaining(deadline)
        raise MediaFetchFailed(f"reading media failed: {type(exc).__name__}: {exc}") from exc
    _remaining(deadline)  # a body cut short by the watchdog is not the whole body
    content_type = response.headers.get("Content-Type")
    media_type = content_type.split(";", 1)[0].strip().lower() if content_type else None
    return FetchedMedia(data=b"".join(chunks), content_type=media_type or None, final_url=url)


def _chunks(response: requests.Response) -> Iterator[bytes]:
    """The body as it arrives.

    ``read1`` returns after at most one socket read, so the deadline is checked between reads
    (and the watchdog shuts the socket at the deadline). ``iter_content`` would block until a
    whole chunk.
    """
    raw = response.raw
    if not hasattr(raw, "read1"):  # a non-urllib3 transport: fall back to requests' iterator
        yield from response.iter_content(CHUNK)
        return
    while chunk := raw.read1(CHUNK, decode_content=True):
        yield chunk


__all__ = [
    "FetchedMedia",
    "Target",
    "check_url",
    "guess_extension",
    "is_public_address",
    "media_type_for_extension",
    "parse_media_url",
    "safe_fetch",
]
