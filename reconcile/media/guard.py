"""Internal: the library's own mechanics, not an import path for platforms (may move).

The SSRF guard's checks on a media URL, before any connection: parse it the way the
connection will (and refuse it where ``urllib3`` and ``urllib.parse`` could disagree), only
http/https, no credentials, and every address the host resolves to public — unless the operator
allow-listed it. :func:`check_url` returns the approved :class:`Target` the connection is pinned
to (:mod:`reconcile.media.fetch`)."""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import requests
import urllib3

from ..errors import MediaFetchFailed, UnsafeMediaURL

Resolver = Callable[..., list[tuple[Any, ...]]]
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

ALLOWED_SCHEMES = ("http", "https")
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


__all__ = ["ALLOWED_SCHEMES", "DEFAULT_PORTS", "METADATA_ADDRESSES", "IPAddress", "Resolver",
           "Target", "check_url", "is_public_address", "parse_media_url"]
