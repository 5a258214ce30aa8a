"""The media fetch keeps its connection alive between fetches on one thread, and a kept
connection never weakens the SSRF guard or the deadline: it is reused only for a hop approved
to the address and port it is connected to, under that hop's own deadline, never by another
thread nor across a fork.

Every server binds 127.0.0.1; a name is resolved by a fake resolver.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from reconcile.errors import MediaExpired, MediaFetchFailed, MediaTooLarge
from reconcile.media import fetch as media
from reconcile.media.fetch import safe_fetch
from tests.unit.test_media_ssrf import RawServer

# request (its number ``n`` over all connections, its ``headers``) → what to send back: pieces
# of bytes with a delay after each, or None (the connection is dropped without an answer)
Answer = Callable[[dict[str, Any]], list[tuple[bytes, float]] | None]


def ok(body: bytes = b"inside", extra: str = "") -> list[tuple[bytes, float]]:
    return [(f"HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nContent-Length: {len(body)}\r\n"
             f"{extra}\r\n".encode() + body, 0.0)]


class KeepAliveServer(RawServer):
    """A loopback HTTP/1.1 server that answers every request on a connection in turn (kept
    alive) with ``answer(request)``, and keeps each request (``n``, ``line``, ``headers``).
    ``close_idle``: it closes each connection after one answer, the way a server closes an idle
    kept-alive connection (without saying so in the answer). ``backlog``/``accept_max``: as
    :class:`RawServer`'s."""

    def __init__(self, answer: Answer | None = None, *, close_idle: bool = False,
                 backlog: int = 16, accept_max: int | None = None) -> None:
        self.answer: Answer = answer or (lambda request: ok())
        self.close_idle = close_idle
        super().__init__(backlog=backlog, accept_max=accept_max)

    def _exchange(self, conn: socket.socket) -> None:
        conn.settimeout(10)
        data = b""
        while not self.stop.is_set():
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                data += chunk
            head, data = data.split(b"\r\n\r\n", 1)
            lines = head.decode("latin-1").split("\r\n")
            headers = {name.strip().lower(): value.strip() for name, _, value in
                       (line.partition(":") for line in lines[1:])}
            with self.lock:
                request = {"n": len(self.requests), "line": lines[0], "headers": headers}
                self.requests.append(request)
            pieces = self.answer(request)
            if pieces is None or not self.send(conn, pieces) or self.close_idle:
                return


@pytest.fixture
def serve() -> Iterator[Callable[..., KeepAliveServer]]:
    servers: list[KeepAliveServer] = []

    def start(*args: Any, **kwargs: Any) -> KeepAliveServer:
        servers.append(KeepAliveServer(*args, **kwargs))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


@pytest.fixture(autouse=True)
def fresh_session() -> Iterator[None]:
    """Each test starts with no kept connection on its thread, and leaves none behind."""
    media._SESSIONS.session = None
    yield
    if media._SESSIONS.session is not None:
        media._SESSIONS.session.close()
    media._SESSIONS.session = None


def fetch(url: str, **kwargs: Any) -> Any:
    kwargs.setdefault("max_bytes", 1000)
    kwargs.setdefault("timeout", 5.0)
    return safe_fetch(url, **kwargs)


def local(port: int) -> dict[str, Any]:
    return {"allowed_hosts": [f"127.0.0.1:{port}"]}


def test_fetches_on_one_thread_share_one_connection(serve: Callable[..., KeepAliveServer],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Three fetches from one host: one connect (the pinned one), one TCP connection at the
    server, three answers."""
    server = serve()
    connects: list[tuple[str, int]] = []
    real = media._connect

    def counted(address: tuple[str, int], *args: Any, **kwargs: Any) -> socket.socket:
        connects.append(address)
        return real(address, *args, **kwargs)

    monkeypatch.setattr(media, "_connect", counted)
    for n in range(3):
        got = fetch(f"http://127.0.0.1:{server.port}/out/{n}.png", **local(server.port))
        assert got.data == b"inside" and got.content_type == "image/png"
    assert connects == [("127.0.0.1", server.port)]
    assert (server.connections, len(server.requests)) == (1, 3)


def test_a_kept_connection_serves_only_the_address_it_is_pinned_to(
        serve: Callable[..., KeepAliveServer]) -> None:
    """DNS rebinding between two fetches: ``media.test`` resolved to 127.0.0.1 for the first
    (its connection is kept), to 127.0.0.2 for the second. The second hop is approved for
    127.0.0.2, so the connection kept for 127.0.0.1 is closed, and the new one goes to
    127.0.0.2 (nothing listens there: refused). Reused, the old connection would have answered
    from the other address."""
    server = serve()
    answers = iter(["127.0.0.1", "127.0.0.2"])
    address = {"now": ""}

    def resolver(host: str, port: int, **_: Any) -> list[tuple[Any, ...]]:
        assert host == "media.test"
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address["now"], port))]

    allowed = {"allowed_hosts": [f"media.test:{server.port}"], "resolver": resolver}
    address["now"] = next(answers)
    assert fetch(f"http://media.test:{server.port}/a.png", **allowed).data == b"inside"
    address["now"] = next(answers)
    with pytest.raises(MediaFetchFailed, match="fetching media failed"):
        fetch(f"http://media.test:{server.port}/b.png", **allowed)
    assert (server.connections, len(server.requests)) == (1, 1)


def test_a_connection_the_server_closed_while_idle_is_replaced(
        serve: Callable[..., KeepAliveServer]) -> None:
    """The server closes each connection after its answer without saying so: the next fetch
    finds the kept one dead and connects again, and succeeds."""
    server = serve(close_idle=True)
    for _ in range(3):
        assert fetch(f"http://127.0.0.1:{server.port}/x.png", **local(server.port)).data == b"inside"
        time.sleep(0.05)  # the close reaches the client before its next fetch
    assert (server.connections, len(server.requests)) == (3, 3)


def test_a_kept_connection_is_under_the_next_fetchs_own_deadline(
        serve: Callable[..., KeepAliveServer]) -> None:
    """The second fetch rides the kept connection, and the server trickles its status line a
    byte every 0.4 s: the second fetch's 1-s bound still ends it (the reused socket joined
    its deadline), on the one connection."""
    trickle = [(bytes([c]), 0.4) for c in b"HTTP/1.1 200 OK\r\n"] + [(b"Content-Length: 0\r\n\r\n", 0.0)]
    server = serve(lambda request: ok() if request["n"] == 0 else trickle)
    assert fetch(f"http://127.0.0.1:{server.port}/a.png", **local(server.port)).data == b"inside"
    started = time.monotonic()
    with pytest.raises(MediaFetchFailed, match="time bound"):
        fetch(f"http://127.0.0.1:{server.port}/b.png", timeout=1.0, **local(server.port))
    assert time.monotonic() - started < 3.0
    assert server.connections == 1


def test_an_unfinished_body_is_never_kept(serve: Callable[..., KeepAliveServer]) -> None:
    """A body refused mid-stream (over the byte bound) leaves bytes on its connection: that
    connection is closed, and the next fetch connects afresh and reads its own answer."""
    server = serve(lambda request: ok(b"x" * 5000) if request["n"] == 0 else ok())
    with pytest.raises(MediaTooLarge):
        fetch(f"http://127.0.0.1:{server.port}/big.png", max_bytes=1000, **local(server.port))
    assert fetch(f"http://127.0.0.1:{server.port}/a.png", **local(server.port)).data == b"inside"
    assert server.connections == 2


def test_each_thread_has_its_own_connection(serve: Callable[..., KeepAliveServer]) -> None:
    """Two threads fetching from one host each use a session of their own: two connections,
    and neither thread's session is the other's."""
    server = serve()
    sessions: list[Any] = []

    def run() -> None:
        for _ in range(2):
            fetch(f"http://127.0.0.1:{server.port}/x.png", **local(server.port))
        sessions.append(media._SESSIONS.session)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert len(sessions) == 2 and sessions[0] is not sessions[1]
    assert (server.connections, len(server.requests)) == (2, 4)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX")
def test_a_forked_child_never_shares_its_parents_connection(
        serve: Callable[..., KeepAliveServer]) -> None:
    """A prefork worker forked after its parent fetched: the child starts with no session of
    its own and opens its own connection; the parent's is not touched."""
    server = serve()
    assert fetch(f"http://127.0.0.1:{server.port}/a.png", **local(server.port)).data == b"inside"
    parent_session = media._SESSIONS.session
    assert parent_session is not None
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, and leave without running pytest's teardown
        try:
            fresh = media._SESSIONS.session is None
            got = fetch(f"http://127.0.0.1:{server.port}/b.png", **local(server.port)).data
            os.write(write, b"ok" if fresh and got == b"inside" else b"no")
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        said = pipe.read()
    os.waitpid(pid, 0)
    assert said == b"ok"
    assert media._SESSIONS.session is parent_session
    assert fetch(f"http://127.0.0.1:{server.port}/c.png", **local(server.port)).data == b"inside"
    assert (server.connections, len(server.requests)) == (2, 3)


# -- what a kept session must not carry over, and what it must not send twice -----------------


def test_a_cookie_set_in_one_call_is_never_sent_by_a_later_call(
        serve: Callable[..., KeepAliveServer]) -> None:
    """Call 1 (one job): the provider's media host sets a session cookie for the provider's
    domain. Call 2 (another job, its URL chosen by someone else) redirects to a private file on
    that domain: it carries no auth header there (another origin), and no cookie either. The
    thread's session outlives the call, its cookie jar does not."""
    def answer(request: dict[str, Any]) -> list[tuple[bytes, float]]:
        host = request["headers"]["host"].split(":")[0]
        if host == "api.provider.test":
            return ok(extra="Set-Cookie: session=JOB-A; Domain=provider.test; Path=/\r\n")
        if host == "elsewhere.test":
            return [(f"HTTP/1.1 302 Found\r\nLocation: http://files.provider.test:{server.port}"
                     "/private.png\r\nContent-Length: 0\r\n\r\n".encode(), 0.0)]
        return ok(b"private")

    server = serve(answer)
    names = ("api.provider.test", "elsewhere.test", "files.provider.test")
    kwargs = {"allowed_hosts": [f"{name}:{server.port}" for name in names],
              "resolver": lambda host, port, **_: [
                  (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]}
    fetch(f"http://api.provider.test:{server.port}/a.png", headers={"Authorization": "Key a"},
          **kwargs)
    assert fetch(f"http://elsewhere.test:{server.port}/b.png", **kwargs).data == b"private"
    last = server.requests[-1]["headers"]
    assert "cookie" not in last and "authorization" not in last
    assert server.requests[0]["headers"]["authorization"] == "Key a"


def test_a_cookie_is_not_sent_to_its_own_host_by_a_later_call(
        serve: Callable[..., KeepAliveServer]) -> None:
    server = serve(lambda request: ok(extra="Set-Cookie: t=1\r\n"))
    for name in ("a", "b"):
        fetch(f"http://127.0.0.1:{server.port}/{name}.png", **local(server.port))
    assert [("cookie" in r["headers"]) for r in server.requests] == [False, False]
    assert server.connections == 1  # the same connection: only the jar was dropped


def test_a_request_dropped_on_a_new_connection_is_not_sent_again(
        serve: Callable[..., KeepAliveServer]) -> None:
    """Only a kept connection's failure is retried: a one-time URL that the server consumed
    before dropping a NEW connection is sent once, and stays a retryable failure (a second GET
    would read 410 and turn it into a final MediaExpired)."""
    server = serve(lambda request: None if request["n"] == 0 else [
        (b"HTTP/1.1 410 Gone\r\nContent-Length: 0\r\n\r\n", 0.0)])
    with pytest.raises(MediaFetchFailed, match="fetching media failed") as failed:
        fetch(f"http://127.0.0.1:{server.port}/once.png", timeout=3.0, **local(server.port))
    assert not isinstance(failed.value, MediaExpired)
    assert len(server.requests) == 1


def test_a_request_dropped_on_a_kept_connection_is_sent_once_more(
        serve: Callable[..., KeepAliveServer]) -> None:
    """The case the retry is for: the kept connection dies as the second fetch's request goes
    out (the server drops it unanswered); the GET goes once more, on a new connection."""
    server = serve(lambda request: None if request["n"] == 1 else ok())
    for name in ("a", "b"):
        assert fetch(f"http://127.0.0.1:{server.port}/{name}.png",
                     **local(server.port)).data == b"inside"
    assert (server.connections, len(server.requests)) == (2, 3)


def test_an_answer_to_a_status_is_never_retried(serve: Callable[..., KeepAliveServer]) -> None:
    server = serve(lambda request: [(b"HTTP/1.1 503 Busy\r\nRetry-After: 0\r\n"
                                     b"Content-Length: 0\r\n\r\n", 0.0)])
    for name in ("a", "b"):  # the second on the kept connection
        with pytest.raises(MediaFetchFailed, match="503"):
            fetch(f"http://127.0.0.1:{server.port}/{name}.png", **local(server.port))
    assert len(server.requests) == 2


def test_bytes_a_server_sends_unasked_never_reach_another_origins_fetch(
        serve: Callable[..., KeepAliveServer]) -> None:
    """A server sends a second, unasked-for answer after the first body. What arrives on a
    kept connection is that server's to say (a later fetch from the same origin may read it, as
    with any HTTP/1.1 client: the server could answer it so anyway); it never reaches a fetch
    from another origin, whose connection is its own."""
    smuggling = serve(lambda request: ok() + ok(b"SMUGGL"))
    other = serve(lambda request: ok(b"theirs"))
    assert fetch(f"http://127.0.0.1:{smuggling.port}/a.png",
                 **local(smuggling.port)).data == b"inside"
    for name in ("b", "c"):
        assert fetch(f"http://127.0.0.1:{other.port}/{name}.png",
                     **local(other.port)).data == b"theirs"
    assert other.connections == 1


def _fill_accept_queue(port: int) -> list[socket.socket]:
    """Connects to a server that accepts no more, until its queue is full: later SYNs are
    dropped, so a new connect hangs as to a silent address."""
    fillers = []
    for _ in range(4):
        sock = socket.socket()
        sock.settimeout(0.2)
        try:
            sock.connect(("127.0.0.1", port))
        except OSError:
            pass
        fillers.append(sock)
    return fillers


@pytest.mark.parametrize("kept", [True, False], ids=["kept-connection", "new-connection"])
def test_a_reconnect_late_in_the_fetch_is_cut_to_the_time_left(
        serve: Callable[..., KeepAliveServer], kept: bool) -> None:
    """The server holds the request 1.2 s of a 1.5-s bound, then drops it unanswered; by then
    its accept queue is full (a new connect hangs). On a kept connection the GET is retried,
    and the new connect is cut to the fetch's time left: the fetch ends at its bound, not a
    whole connect timeout later. On a new connection there is no retry at all."""
    held = threading.Event()

    def answer(request: dict[str, Any]) -> list[tuple[bytes, float]] | None:
        if kept and request["n"] == 0:
            return ok()
        held.set()
        time.sleep(1.2)
        return None

    server = serve(answer, backlog=0, accept_max=1)
    outcome: dict[str, Any] = {}

    def run() -> None:  # on a thread of its own: its first fetch keeps the connection for it
        if kept:
            outcome["first"] = fetch(f"http://127.0.0.1:{server.port}/a.png",
                                     **local(server.port)).data
        started = time.monotonic()
        try:
            fetch(f"http://127.0.0.1:{server.port}/b.png", timeout=1.5, **local(server.port))
        except MediaFetchFailed as exc:
            outcome["error"] = exc
        outcome["took"] = time.monotonic() - started

    thread = threading.Thread(target=run)
    thread.start()
    assert held.wait(5)
    fillers = _fill_accept_queue(server.port)
    try:
        thread.join(10)
    finally:
        for sock in fillers:
            sock.close()
    assert "error" in outcome and outcome.get("first", b"inside") == b"inside"
    assert server.connections == 1
    assert outcome["took"] < 1.5 + 0.6, f"a 1.5-s fetch took {outcome['took']:.2f} s"
