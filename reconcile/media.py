"""Safe fetch of provider outputs: the SSRF guard in front of every result URL.

A result URL comes from a provider's answer (or an unsigned KIE callback), so it is untrusted:
only http/https, and every hop's host must resolve to public addresses only — unless the host is
allow-listed (a local simulator, a MinIO). Redirects are followed by hand so each hop is
re-checked; the body is streamed under a byte bound and the whole fetch under a time bound.

Known limit: the address check resolves the host, then ``requests`` resolves it again to
connect, so a hostile DNS server could still answer differently the second time (DNS
rebinding). The check closes plain SSRF and redirects to internal hosts; pair it with egress
rules on the workers for the rest.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import urljoin, urlsplit

import requests
import urllib3

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
CHUNK = 64 * 1024


@dataclass(frozen=True)
class FetchedMedia:
    data: bytes
    content_type: str | None  # media type only, parameters dropped ("image/png")
    final_url: str  # after redirects


def is_public_address(ip: IPAddress) -> bool:
    """True only for a globally routable unicast address that is not a metadata endpoint."""
    if isinstance(ip, ipaddress.IPv6Address):
        # An IPv4 address hidden in IPv6 (::ffff:a.b.c.d, NAT64) is judged as that IPv4.
        if ip.ipv4_mapped is not None:
            return is_public_address(ip.ipv4_mapped)
        if ip in _NAT64:
            return is_public_address(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
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
    return host.strip().strip("[]").lower().rstrip(".")


def check_url(url: str, allowed_hosts: Iterable[str], resolver: Resolver) -> None:
    """Raise :class:`UnsafeMediaURL` unless ``url`` may be fetched (one hop, no I/O but DNS)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise UnsafeMediaURL(f"malformed media URL {url[:200]!r}: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in ALLOWED_SCHEMES:
        raise UnsafeMediaURL(
            f"media URL scheme {scheme or '(none)'!r} is not http/https: {url[:200]}"
        )
    host = _normalise_host(parts.hostname or "")
    if not host:
        raise UnsafeMediaURL(f"media URL has no host: {url[:200]}")
    port = port or (443 if scheme == "https" else 80)
    allowed = {_normalise_host(h) for h in allowed_hosts}
    if host in allowed or f"{host}:{port}" in allowed:
        return  # an operator vouched for this host (a simulator, MinIO): no address check

    try:
        addresses = [ipaddress.ip_address(host)]  # an IP literal needs no resolving
    except ValueError:
        addresses = _resolve(host, port, resolver)
    for ip in addresses:
        if not is_public_address(ip):
            raise UnsafeMediaURL(
                f"media host {host!r} resolves to non-public address {ip}; "
                "add it to MEDIA_ALLOWED_HOSTS if that is intended"
            )


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


def safe_fetch(
    url: str,
    *,
    allowed_hosts: Iterable[str] = (),
    max_bytes: int,
    timeout: float,
    session: requests.Session | None = None,
    headers: Mapping[str, str] | None = None,
    resolver: Resolver = socket.getaddrinfo,
    max_redirects: int = 5,
) -> FetchedMedia:
    """Fetch ``url`` under the SSRF guard, a ``max_bytes`` bound and a ``timeout`` (seconds) bound.

    Raises UnsafeMediaURL, MediaTooLarge, MediaExpired (403/404/410) or MediaFetchFailed
    (anything else; retryable).
    """
    allowed = tuple(allowed_hosts)
    deadline = time.monotonic() + timeout
    own_session = session is None
    http = session or requests.Session()
    origin = urlsplit(url).hostname
    try:
        for _hop in range(max_redirects + 1):
            check_url(url, allowed, resolver)
            # Caller headers (auth) go only to the original host, never to a redirect target.
            hop_headers = dict(headers or {}) if urlsplit(url).hostname == origin else {}
            response = _get(http, url, hop_headers, deadline)
            with response:
                if response.status_code in REDIRECT_STATUSES:
                    location = response.headers.get("Location")
                    if not location:
                        raise MediaFetchFailed(f"redirect {response.status_code} without Location")
                    url = urljoin(url, location)
                    continue
                return _read(response, url, max_bytes, deadline)
        raise MediaFetchFailed(f"more than {max_redirects} redirects fetching media")
    finally:
        if own_session:
            http.close()


def _remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise MediaFetchFailed("media fetch exceeded its time bound")
    return left


def _get(http: requests.Session, url: str, headers: dict[str, str], deadline: float) -> Any:
    try:
        return http.get(
            url,
            headers=headers,
            stream=True,
            allow_redirects=False,  # each hop is re-checked by check_url
            timeout=_remaining(deadline),
        )
    except requests.RequestException as exc:
        raise MediaFetchFailed(f"fetching media failed: {type(exc).__name__}: {exc}") from exc


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
        raise MediaFetchFailed(f"reading media failed: {type(exc).__name__}: {exc}") from exc
    content_type = response.headers.get("Content-Type")
    media_type = content_type.split(";", 1)[0].strip().lower() if content_type else None
    return FetchedMedia(data=b"".join(chunks), content_type=media_type or None, final_url=url)


def _chunks(response: requests.Response) -> Iterator[bytes]:
    """The body as it arrives.

    ``read1`` returns after at most one socket read, so the deadline is checked between reads
    and a trickling server overshoots the time bound by at most one read timeout (itself no
    longer than the time that was left). ``iter_content`` would block until a whole chunk.
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
    "check_url",
    "guess_extension",
    "is_public_address",
    "safe_fetch",
]
