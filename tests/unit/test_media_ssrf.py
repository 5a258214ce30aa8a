"""Issue 12 (SSRF and bounds): the SSRF guard and the connection agree, and the whole exchange is bounded.

Nothing here reaches beyond loopback: servers bind 127.0.0.1, names that must resolve to a
private or metadata address go through a fake resolver, and wherever a "public" address would be
connected to, the connect function is replaced so the refusal happens before any packet.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
import responses
import urllib3
from hypothesis import HealthCheck, given, settings, strategies as st

from reconcile.errors import MediaFetchFailed, UnsafeMediaURL
from reconcile.media import fetch as media
from reconcile.media.fetch import is_public_address, safe_fetch
from tests.unit.test_media import PUBLIC, PUBLIC_IP


def read_head(conn: socket.socket) -> bytes:
    """A request's head, read up to its blank line (what arrived, if the peer closed first)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


class RawServer:
    """A loopback HTTP server answering every connection with ``script`` (a list of
    ``(bytes, delay_after)``); it keeps each request and counts connections, so a test can say
    "never reached". ``backlog``/``accept_max``: a listen backlog, and a number of connections
    after which it accepts no more (a full accept queue: a later connect hangs, as to a silent
    address). A subclass answers otherwise by overriding :meth:`_exchange`."""

    def __init__(self, script: list[tuple[bytes, float]] | None = None, *, backlog: int = 16,
                 accept_max: int | None = None) -> None:
        self.script = script or [(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n"
                                  b"Connection: close\r\n\r\ninside", 0.0)]
        self.requests: list[Any] = []
        self.connections = 0
        self.accept_max = accept_max
        self.lock = threading.Lock()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(backlog)
        self.sock.settimeout(0.1)  # before the thread starts: a quick close() cannot race it
        self.port = self.sock.getsockname()[1]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            if self.accept_max is not None and self.connections >= self.accept_max:
                self.stop.wait(0.05)
                continue
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            with self.lock:
                self.connections += 1
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            try:
                self._exchange(conn)
            except OSError:
                return

    def _exchange(self, conn: socket.socket) -> None:
        """One request, answered with the script; the connection is then closed."""
        head = read_head(conn)
        if b"\r\n\r\n" in head:
            self.requests.append(head)
            self.send(conn, self.script)

    def send(self, conn: socket.socket, pieces: list[tuple[bytes, float]]) -> bool:
        """Send ``pieces``, each followed by its delay; False: the server is stopping."""
        for piece, delay in pieces:
            conn.sendall(piece)
            if self.stop.wait(delay):
                return False
        return True

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)  # the accept loop ends within its 0.1-s timeout
        self.sock.close()


@pytest.fixture
def server() -> Iterator[RawServer]:
    s = RawServer()
    yield s
    s.close()


def redirecting(status: int, location: str) -> RawServer:
    return RawServer([(f"HTTP/1.1 {status} Moved\r\nLocation: {location}\r\n"
                       "Content-Length: 0\r\nConnection: close\r\n\r\n".encode(), 0.0)])


def fetch(url: str, **kwargs: Any) -> Any:
    kwargs.setdefault("resolver", PUBLIC)
    kwargs.setdefault("max_bytes", 1000)
    kwargs.setdefault("timeout", 5.0)
    return safe_fetch(url, **kwargs)


# -- the backslash bypass ----------------------------------------------------------------------


def test_backslash_url_is_refused_before_connecting(server: RawServer) -> None:
    """``http://127.0.0.1:P\\@cdn.example.com/`` looks public to urlsplit but connects to
    127.0.0.1:P: it is refused, and the internal server never sees a request."""
    with pytest.raises(UnsafeMediaURL):
        fetch(f"http://127.0.0.1:{server.port}\\@cdn.example.com/latest/meta-data")
    assert server.requests == []


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_backslash_redirect_is_refused(server: RawServer, status: int) -> None:
    """An allow-listed hop redirecting to the backslash form is stopped at the redirect."""
    hop = redirecting(status, f"http://127.0.0.1:{server.port}\\@cdn.example.com/x")
    try:
        with pytest.raises(UnsafeMediaURL):
            fetch(f"http://127.0.0.1:{hop.port}/a", allowed_hosts=[f"127.0.0.1:{hop.port}"])
        assert len(hop.requests) == 1
        assert server.requests == []
    finally:
        hop.close()


def test_host_port_allow_list_entry_does_not_open_other_ports(server: RawServer) -> None:
    """``127.0.0.1:P`` vouches for port P only: neither the backslash form nor another port
    reaches the other service, and a bare host means its default port, not every port."""
    other = RawServer()
    try:
        allowed = [f"127.0.0.1:{other.port}"]
        with pytest.raises(UnsafeMediaURL):
            fetch(f"http://127.0.0.1:{server.port}\\@127.0.0.1:{other.port}/", allowed_hosts=allowed)
        with pytest.raises(UnsafeMediaURL):
            fetch(f"http://127.0.0.1:{server.port}/", allowed_hosts=allowed)
        with pytest.raises(UnsafeMediaURL):
            fetch(f"http://127.0.0.1:{server.port}/", allowed_hosts=["127.0.0.1"])
        assert server.requests == []
        assert fetch(f"http://127.0.0.1:{server.port}/", allowed_hosts=["127.0.0.1:*"]).data \
            == b"inside"
    finally:
        other.close()


def test_connection_uses_the_checked_address_not_a_second_lookup(
        server: RawServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """DNS rebinding: the check sees a public address; a second lookup would answer loopback.
    The connection goes to the address that was checked (here a stand-in that refuses), never
    resolves again, and the loopback service is never reached."""
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, port, *a, **k: [
        (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", server.port))])
    connected: list[tuple[str, int]] = []

    def refuse(address: tuple[str, int], *args: Any, **kwargs: Any) -> socket.socket:
        connected.append(address)
        raise ConnectionRefusedError("stand-in for the public address")

    monkeypatch.setattr(media, "_connect", refuse, raising=False)
    monkeypatch.setattr(urllib3.util.connection, "create_connection", refuse)
    with pytest.raises(MediaFetchFailed):
        fetch(f"http://cdn.example.com:{server.port}/x")
    assert connected == [(PUBLIC_IP, server.port)]
    assert server.requests == []


@pytest.mark.parametrize(("address", "public"), [
    ("2002:0a00:0001::1", False),  # 6to4 of 10.0.0.1
    ("2002:7f00:0001::1", False),  # 6to4 of 127.0.0.1
    ("2002:a9fe:a9fe::1", False),  # 6to4 of 169.254.169.254
    ("fec0::1", False),  # site-local
    ("fec0:ffff::1", False),
    ("2606:4700::1111", True),
])
def test_6to4_and_site_local_addresses(address: str, public: bool) -> None:
    """6to4 addresses embedding a private IPv4, and fec0::/10, are not public."""
    assert is_public_address(ipaddress.ip_address(address)) is public


@pytest.mark.parametrize("location", [
    "http://cdn.example.com/b",  # same host, another scheme
    "https://cdn.example.com:8443/b",  # same host, another port
])
@responses.activate
def test_auth_headers_do_not_follow_to_another_port_or_scheme(location: str) -> None:
    """Provider auth goes to the origin's scheme, host and port only."""
    responses.get("https://cdn.example.com/a", status=302, headers={"Location": location})
    responses.get(location, body=b"ok")
    fetch("https://cdn.example.com/a", headers={"Authorization": "Bearer secret"})
    assert responses.calls[0].request.headers["Authorization"] == "Bearer secret"
    assert "Authorization" not in responses.calls[1].request.headers


# -- the whole exchange is bounded --------------------------------------------------------------


@pytest.mark.parametrize("trickle", [
    # headers sent one line at a time, each well inside the per-read timeout
    [(b"HTTP/1.1 200 OK\r\n", 0.4)] + [(f"X-Slow-{i}: y\r\n".encode(), 0.4) for i in range(12)]
    + [(b"Content-Length: 0\r\n\r\n", 0.0)],
    # the status line one byte at a time
    [(bytes([c]), 0.4) for c in b"HTTP/1.1 200 OK\r\n"] + [(b"Content-Length: 0\r\n\r\n", 0.0)],
], ids=["headers", "status-line"])
def test_trickled_status_line_or_headers_cannot_outlive_the_bound(
        trickle: list[tuple[bytes, float]]) -> None:
    """MEDIA_TIMEOUT bounds the whole exchange, not each read: the server would finish (and
    the old fetch would return its empty body) only after ~5 s; a 1 s bound ends it as a
    time-bound failure."""
    slow = RawServer(trickle)
    try:
        with pytest.raises(MediaFetchFailed, match="time bound"):
            fetch(f"http://127.0.0.1:{slow.port}/x", allowed_hosts=[f"127.0.0.1:{slow.port}"],
                  timeout=1.0)
    finally:
        slow.close()


# -- the parser-agreement property ---------------------------------------------------------------

_URL_CHARS = st.sampled_from(list("abc.:/@\\?#[]%-_~!$&'()*+,;=09 \t\n") + ["1", "ä", "\x00"])


@st.composite
def url_strings(draw: st.DrawFn) -> str:
    scheme = draw(st.sampled_from(["http://", "https://", "HTTP://", "http:/", "http:\\\\", ""]))
    parts = draw(st.lists(st.one_of(
        st.sampled_from(["127.0.0.1", "cdn.example.com", "10.0.0.1", "[::1]", "evil.example",
                         ":80", ":8080", ":0", "@", "\\", "/", "?", "#", "%2e%2e", "..",
                         "user:pw@", "[", "]", "%5C", "%40"]),
        st.text(_URL_CHARS, max_size=6)), max_size=8))
    return scheme + "".join(parts)


def _any_public(host: str, port: int, **_: Any) -> list[tuple[Any, ...]]:
    return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (PUBLIC_IP, port))]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(url_strings())
def test_guard_and_connection_agree_on_host_and_port(url: str) -> None:
    """For any URL string the guard approves, the host and port it approved are what urllib3
    and urllib.parse read from the URL that is sent, and the one connection made goes to the
    checked address of that host and port."""
    try:
        target = media.check_url(url, (), _any_public)
    except (UnsafeMediaURL, MediaFetchFailed):
        return
    connecting = urllib3.util.parse_url(target.url)
    standard = urlsplit(target.url)
    default = media.DEFAULT_PORTS[target.scheme]
    assert (media._normalise_host(connecting.host or ""), connecting.port or default) \
        == (target.host, target.port)
    assert (media._normalise_host(standard.hostname or ""), standard.port or default) \
        == (target.host, target.port)

    connected: list[tuple[str, int]] = []

    def refuse(address: tuple[str, int], *args: Any, **kwargs: Any) -> socket.socket:
        connected.append(address)
        raise ConnectionRefusedError("never connects in a test")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(media, "_connect", refuse)
        mp.setattr(socket, "getaddrinfo", lambda *a, **k: pytest.fail("resolved twice"))
        with pytest.raises(MediaFetchFailed):
            safe_fetch(url, max_bytes=10, timeout=5.0, resolver=_any_public)
    assert connected == [(target.address, target.port)]


def test_property_covers_the_backslash_form() -> None:
    """The example that broke the old guard is refused by the parser check itself."""
    with pytest.raises(UnsafeMediaURL):
        media.check_url("http://127.0.0.1:1\\@cdn.example.com/", (), _any_public)
