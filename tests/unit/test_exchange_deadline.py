"""Issue 25 finding 4: one total deadline, from connect to the last byte, for every outbound
exchange — the status line and the headers included.

A provider (or fal's JWKS host) that sends ``HTTP/1.1 200 OK`` and then trickles one header
line every half second never trips a per-read timeout; before the fix ``HttpClient.read``,
``send_once`` and the JWKS fetch waited for the last header (20 s here) whatever their
documented total. Each is now cut by :mod:`reconcile.providers.deadline`'s watchdog.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
import requests

from reconcile.errors import ReadFailed
from reconcile.providers import deadline
from reconcile.providers.fal.webhook import JwksCache
from reconcile.providers.http import HttpClient, ProviderSession
from tests.unit.test_media_ssrf import read_head

LINES = 40  # one header line per GAP: 20 s of headers in all
GAP = 0.5


class Trickler:
    """A TCP server on 127.0.0.1: the status line at once, then one header line per GAP (or,
    with ``body=True``, every header at once, then one body byte per GAP)."""

    def __init__(self, *, body: bool = False) -> None:
        self.body = body
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.stop = threading.Event()
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._trickle, args=(conn,), daemon=True).start()

    def _trickle(self, conn: socket.socket) -> None:
        with conn:
            try:
                if b"\r\n\r\n" not in read_head(conn):
                    return
                conn.sendall(b"HTTP/1.1 200 OK\r\n")
                if self.body:
                    conn.sendall(f"Content-Length: {LINES}\r\n\r\n".encode())
                    for _ in range(LINES):
                        if self.stop.wait(GAP):
                            return
                        conn.sendall(b"x")
                    return
                for i in range(LINES):
                    if self.stop.wait(GAP):
                        return
                    conn.sendall(f"X-Trickle-{i}: {i}\r\n".encode())
                conn.sendall(b"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
            except OSError:
                return

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


@pytest.fixture
def trickler() -> Iterator[Trickler]:
    server = Trickler()
    yield server
    server.close()


def _client(port: int) -> HttpClient:
    # connect 1 s + read 1 s: a documented total of 2 s; no read is ever 1 s without a byte
    return HttpClient(f"http://127.0.0.1:{port}", connect_timeout=1.0, read_timeout=1.0,
                      read_retries=0, session=ProviderSession())


def test_http_client_read_ends_at_its_total_deadline_against_trickled_headers(
        trickler: Trickler) -> None:
    started = time.monotonic()
    with pytest.raises(ReadFailed, match="deadline"):
        _client(trickler.port).read("GET", "/v1/task")
    assert time.monotonic() - started < 3.0


def test_send_once_ends_at_its_total_deadline_against_trickled_headers(
        trickler: Trickler) -> None:
    started = time.monotonic()
    with pytest.raises(requests.Timeout):
        _client(trickler.port).send_once("POST", "/v1/create", json={"prompt": "x"})
    assert time.monotonic() - started < 3.0


def test_the_fal_jwks_fetch_ends_at_its_timeout_against_trickled_headers(
        trickler: Trickler) -> None:
    cache = JwksCache(f"http://127.0.0.1:{trickler.port}/.well-known/jwks.json",
                      requests.Session(), timeout=2.0)
    started = time.monotonic()
    with pytest.raises(ReadFailed):
        cache.keys(datetime.now(UTC))
    assert time.monotonic() - started < 3.0


def test_a_dubbing_audio_download_ends_at_media_timeout_against_a_trickled_body() -> None:
    """The dubbing download is a streamed read: its body is under ``MEDIA_TIMEOUT`` too."""
    from reconcile import Settings
    from reconcile.errors import MediaFetchFailed
    from reconcile.providers.elevenlabs.async_jobs import ElevenLabsAsyncClient

    server = Trickler(body=True)
    try:
        client = ElevenLabsAsyncClient(Settings(
            elevenlabs_base_url=f"http://127.0.0.1:{server.port}", elevenlabs_api_key="xi",
            media_timeout=2.0), read_retries=0)
        started = time.monotonic()
        with pytest.raises(MediaFetchFailed):
            client.download_audio("dub1", "es")
        assert time.monotonic() - started < 3.0
    finally:
        server.close()


def test_an_enclosing_deadline_still_cuts_an_exchange_with_a_longer_own_deadline(
        trickler: Trickler) -> None:
    """Deadlines nest: a sync call's 1 s bound around a client whose own total is 20 s."""
    client = HttpClient(f"http://127.0.0.1:{trickler.port}", connect_timeout=10.0,
                        read_timeout=10.0, read_retries=0, session=ProviderSession())
    started = time.monotonic()
    with pytest.raises(requests.Timeout), deadline.bounded(1.0):
        client.send_once("POST", "/v1/create")
    assert time.monotonic() - started < 2.0


def test_prepare_keeps_a_platform_adapters_pool_settings_and_leaves_its_own_class_alone() -> None:
    session = requests.Session()
    session.mount("https://", requests.adapters.HTTPAdapter(pool_maxsize=32, max_retries=2))

    class Own(requests.adapters.HTTPAdapter):
        pass

    session.mount("https://own.example/", Own())
    deadline.prepare(session, "https://api.example/v1/x")
    deadline.prepare(session, "https://own.example/v1/x")
    tracked = session.get_adapter("https://api.example/v1/x")
    assert isinstance(tracked, deadline._Adapter)
    assert tracked._pool_maxsize == 32 and tracked.max_retries.total == 2
    assert type(session.get_adapter("https://own.example/v1/x")) is Own
