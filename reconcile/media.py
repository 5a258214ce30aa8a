"""Safe fetch of provider outputs: the SSRF guard in front of every result URL.

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
  watchdog shuts the socket at the deadline, so a trickling server cannot stretch it.

Egress rules on the workers are still advised (README "Security model").
"""
from __future__ import annotations

import ipaddress
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import urljoin, urlsplit

import requests
import requests.adapters
import urllib3
import urllib3.connection
import urllib3.util.connection

from .errors import MediaExpired, MediaFetchFailed, MediaTooLarge, UnsafeMediaURL

Resolver = Callable[..., list[tuple[Any, ...]]]
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

ALLOWED_SCHEMES = ("http", "https")
REDIRECT_STATUSES = (301, 302, 303, 307, 308)
EXPIRED_STATUSES = (403, 404, 410)  # signed URLs answer 403 once expired, CDNs 404/410
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200")
)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_SITE_LOCAL = ipaddress.ip_network("fec0::/10")
DEFAULT_PORTS = {"http": 80, "https": 443}
# Characters urllib.parse and urllib3 split a URL differently on (urllib3 ends the authority
# at a backslash), plus controls that urllib.parse silently strips (tab, CR, LF): refused
# outright. A plain space is left to the normalisation (quoted in a path, refused in a host).
_LABEL = r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?"
_HOSTNAME = re.compile(rf"(?:{_LABEL}\.)*{_LABEL}")  # after IDNA: letters, digits, -, _
_DISAGREEING = re.compile(r"[\\\x00-\x1f\x7f]")
CHUNK = 64 * 1024


@dataclass(frozen=True)
class FetchedMedia:
    data: bytes
    content_type: str | None  # media type only, parameters dropped ("image/png")
    final_url: str  # after redirects


def is_public_address(ip: IPAddress) -> bool:
    """True only for a globally routable unicast address that is not a metadata endpoint."""
    if isinstance(ip, ipaddress.IPv6Address):
        # An IPv4 address hidden in IPv6 (::ffff:a.b.c.d, NAT64, 6to4) is judged as that IPv4.
        if ip.ipv4_mapped is not None:
            return is_public_address(ip.ipv4_mapped)
        if ip in _NAT64:
            return is_public_address(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
        if ip.sixtofour is not None and not is_public_address(ip.sixtofour):
            return False
        if ip in _SITE_LOCAL:  # deprecated, but still routed inside some networks
            return False
    return not (
        ip in METADATA_ADDRESSES
        or ip.is_private
        or ip.is_loopback
        or ip.is_link_local
        or ip.is_multicast
        or ip.is_reserved
        or ip.is_unspecified
        or not ip.is_global  # also catches shared space (100.64/10) and documentation ranges
    )


def _normalise_host(host: str) -> str:
    host = host.strip().strip("[]").lower()
    return host[:-1] if host.endswith(".") else host


@dataclass(frozen=True)
class Target:
    """One approved hop: the normalised URL, and the address the connection must use."""

    url: str  # as ``requests`` sends it
    scheme: str
    host: str  # normalised name or IP literal
    port: int
    address: str  # the checked IP

    @property
    def origin(self) -> tuple[str, str, int]:
        return self.scheme, self.host, self.port


def parse_media_url(url: str) -> tuple[str, str, str, int]:
    """``(normalised url, scheme, host, port)`` as the connection will read them.

    Raises :class:`UnsafeMediaURL` for a URL the connecting parser and ``urllib.parse`` could
    read differently: the connection and the guard must agree on where it goes.
    """
    if not isinstance(url, str) or _DISAGREEING.search(url):
        raise UnsafeMediaURL(
            "media URL holds a backslash or a control character: "
            f"{str(url)[:200]!r}")
    try:
        prepared = requests.Request("GET", url).prepare().url or ""
        connecting = urllib3.util.parse_url(prepared)
        standard = urlsplit(prepared)
        standard_port = standard.port
    except (requests.RequestException, urllib3.exceptions.HTTPError, ValueError,
            UnicodeError) as exc:
        raise UnsafeMediaURL(f"malformed media URL {url[:200]!r}: {exc}") from None
    scheme = (connecting.scheme or "").lower()
    if scheme not in ALLOWED_SCHEMES or standard.scheme.lower() != scheme:
        raise UnsafeMediaURL(
            f"media URL scheme {scheme or '(none)'!r} is not http/https: {url[:200]}")
    host = _normalise_host(connecting.host or "")
    if not host:
        raise UnsafeMediaURL(f"media URL has no host: {url[:200]}")
    if not _HOSTNAME.fullmatch(host) and not _is_ip(host):
        raise UnsafeMediaURL(f"media URL host is not a plain host name: {url[:200]}")
    if connecting.auth is not None or "@" in standard.netloc:
        raise UnsafeMediaURL(f"media URL carries credentials: {url[:200]}")
    port = connecting.port or DEFAULT_PORTS[scheme]
    if (_normalise_host(standard.hostname or ""), standard_port or DEFAULT_PORTS[scheme]) \
            != (host, port):
        raise UnsafeMediaURL(f"media URL parses to two different hosts: {url[:200]}")
    return prepared, scheme, host, port


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _allow_listed(host: str, port: int, scheme: str, allowed: Iterable[str]) -> bool:
    """``host:port`` is that port, ``host:*`` every port, a bare ``host`` its default port."""
    for raw in allowed:
        entry = raw.strip().lower()
        if entry.startswith("["):  # [v6] or [v6]:port
            name, _, rest = entry[1:].partition("]")
            entry_port = rest[1:] if rest.startswith(":") else ""
        elif entry.count(":") == 1:
            name, _, entry_port = entry.partition(":")
        else:  # a bare name, or a bare IPv6 literal
            name, entry_port = entry, ""
        if _normalise_host(name) != host:
            continue
        if entry_port == "*" or (entry_port == "" and port == DEFAULT_PORTS[scheme]):
            return True
        if entry_port.isdigit() and int(entry_port) == port:
            return True
    return False


def check_url(url: str, allowed_hosts: Iterable[str], resolver: Resolver) -> Target:
    """The approved :class:`Target` for ``url``, or :class:`UnsafeMediaURL` (DNS only, no I/O)."""
    prepared, scheme, host, port = parse_media_url(url)
    vouched = _allow_listed(host, port, scheme, allowed_hosts)
    try:
        addresses = [ipaddress.ip_address(host)]  # an IP literal needs no resolving
    except ValueError:
        addresses = _resolve(host, port, resolver)
    if not vouched:  # an operator vouched for an allow-listed host (a simulator, MinIO)
        for ip in addresses:
            if not is_public_address(ip):
                raise UnsafeMediaURL(
                    f"media host {host!r} resolves to non-public address {ip}; "
                    "add it to MEDIA_ALLOWED_HOSTS if that is intended"
                )
    return Target(prepared, scheme, host, port, str(addresses[0]))


def _resolve(host: str, port: int, resolver: Resolver) -> list[IPAddress]:
    try:
        infos = resolver(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:  # socket.gaierror is an OSError
        raise MediaFetchFailed(f"cannot resolve media host {host!r}: {exc}") from exc
    addresses: list[IPAddress] = []
    for info in infos:
        # sockaddr[0] is the address; IPv6 may carry a "%scope" suffix.
        raw = str(info[4][0]).split("%", 1)[0]
        try:
            addresses.append(ipaddress.ip_address(raw))
        except ValueError:
            raise UnsafeMediaURL(f"media host {host!r} resolved to a non-IP {raw!r}") from None
    if not addresses:
        raise MediaFetchFailed(f"media host {host!r} resolved to no address")
    return addresses


# -- the pinned transport -------------------------------------------------------------------


class _Hop(threading.local):
    """The hop being fetched on this thread: its approved target and the sockets it opened."""

    target: Target | None = None
    sockets: list[socket.socket] | None = None


_HOP = _Hop()
_connect = urllib3.util.connection.create_connection  # module-level: tests watch it


def _pinned_socket(conn: Any) -> socket.socket:
    """Connect to the checked address of the approved hop, or refuse: never resolve again."""
    target = _HOP.target
    if target is None or (_normalise_host(conn.host), conn.port) != (target.host, target.port):
        raise urllib3.exceptions.NewConnectionError(
            conn, "refused: not the host and port the media guard approved")
    try:
        sock = _connect((target.address, target.port), conn.timeout,
                        source_address=conn.source_address, socket_options=conn.socket_options)
    except TimeoutError as exc:
        raise urllib3.exceptions.ConnectTimeoutError(conn, f"connect timed out: {exc}") from exc
    except OSError as exc:
        raise urllib3.exceptions.NewConnectionError(conn, f"connect failed: {exc}") from exc
    if _HOP.sockets is not None:
        _HOP.sockets.append(sock.dup())  # a dup shuts down the same socket, TLS-wrapped or not
    return sock


class _PinnedHTTPConnection(urllib3.connection.HTTPConnection):
    def _new_conn(self) -> socket.socket:
        return _pinned_socket(self)


class _PinnedHTTPSConnection(urllib3.connection.HTTPSConnection):
    def _new_conn(self) -> socket.socket:
        return _pinned_socket(self)


class _PinnedHTTPPool(urllib3.HTTPConnectionPool):
    ConnectionCls = _PinnedHTTPConnection


class _PinnedHTTPSPool(urllib3.HTTPSConnectionPool):
    ConnectionCls = _PinnedHTTPSConnection


class _PinnedAdapter(requests.adapters.HTTPAdapter):
    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {"http": _PinnedHTTPPool,
                                                   "https": _PinnedHTTPSPool}


def _media_session() -> requests.Session:
    session = requests.Session()
    session.trust_env = False  # an environment proxy would connect somewhere else
    for prefix in ("http://", "https://"):
        session.mount(prefix, _PinnedAdapter())
    return session


@contextmanager
def _bounded_hop(target: Target, deadline: float) -> Iterator[None]:
    """Pin the hop to ``target``; at ``deadline`` shut every socket it opened (a watchdog), so
    a status line or headers trickled a byte at a time cannot outlive the bound."""
    sockets: list[socket.socket] = []
    _HOP.target, _HOP.sockets = target, sockets
    watchdog = threading.Timer(max(0.0, deadline - time.monotonic()), _shut, (sockets,))
    watchdog.daemon = True
    watchdog.start()
    try:
        yield
    finally:
        watchdog.cancel()
        _HOP.target, _HOP.sockets = None, None
        for sock in sockets:
            sock.close()


def _shut(sockets: list[socket.socket]) -> None:
    for sock in list(sockets):
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


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
            target = check_url(url, allowed, resolver)
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
            # Connection: close — every hop opens its own (pinned, watched) connection
            headers={"Accept-Encoding": "identity", **headers, "Connection": "close"},
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
    if declared is not None and declared.strip().isdigit() and int(declared) > max_bytes:
        raise MediaTooLarge(
            f"media declares {int(declared)} bytes, over the {max_bytes}-byte bound"
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


_EXTENSIONS = {
    "image/png": "png",
    "image/jpeg": "jpg",
    "image/jpg": "jpg",
    "image/pjpeg": "jpg",
    "image/webp": "webp",
    "video/mp4": "mp4",
    "audio/mpeg": "mp3",
    "audio/mp3": "mp3",
    "audio/wav": "wav",
    "audio/x-wav": "wav",
    "audio/wave": "wav",
    "audio/vnd.wave": "wav",
    "text/plain": "txt",
    "application/json": "json",
}
_SUFFIXES = {"png": "png", "jpg": "jpg", "jpeg": "jpg", "webp": "webp", "mp4": "mp4",
             "mp3": "mp3", "wav": "wav", "txt": "txt", "json": "json"}  # fmt: skip


def media_type_for_extension(ext: str) -> str | None:
    """The canonical media type stored under ``ext`` (None for ``bin`` or unknown)."""
    for media_type, known in _EXTENSIONS.items():
        if known == ext:
            return media_type
    return None


def guess_extension(content_type: str | None, url: str | None = None) -> str:
    """A storage extension from the media type, else the URL's suffix, else ``bin``."""
    if content_type:
        ext = _EXTENSIONS.get(content_type.split(";", 1)[0].strip().lower())
        if ext:
            return ext
    if url:
        suffix = PurePosixPath(urlsplit(url).path).suffix.lstrip(".").lower()
        if suffix in _SUFFIXES:
            return _SUFFIXES[suffix]
    return "bin"


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
