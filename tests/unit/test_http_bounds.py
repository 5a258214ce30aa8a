"""Issue 12 (bounds and timeouts): provider bodies and the fal JWKS fetch are bounded in size and total time
(loopback servers only)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
import requests

from reconcile.errors import ReadFailed
from reconcile.providers.http import HttpClient
from reconcile.testing import sim_signing
from reconcile.webhooks import JwksCache
from tests.unit.test_media_ssrf import RawServer

NOW = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)


def _chunked(total: int, piece: int = 1 << 20) -> list[tuple[bytes, float]]:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    chunk = f"{piece:x}\r\n".encode() + b" " * piece + b"\r\n"
    return [(head, 0.0)] + [(chunk, 0.0)] * (total // piece) + [(b"0\r\n\r\n", 0.0)]


@pytest.fixture
def big() -> Iterator[RawServer]:
    server = RawServer(_chunked(70 << 20))  # 70 MiB of chunked whitespace: over the 64 MiB cap
    yield server
    server.close()


def test_a_status_body_over_the_cap_is_a_read_failure_not_a_worker_oom(big: RawServer) -> None:
    """A status read whose body never ends (here: 70 MiB, over the cap) fails, without retrying
    a body that will be just as large again."""
    client = HttpClient(f"http://127.0.0.1:{big.port}", read_retries=2, sleep=lambda _: None)
    with pytest.raises(ReadFailed, match="exceeds"):
        client.read("GET", "/v1/predictions/p1")
    assert len(big.requests) == 1


def test_a_trickled_status_body_ends_at_the_total_deadline() -> None:
    """A body sent a byte at a time, each byte inside the read timeout, would take ~8 s; the
    request's total deadline (connect + read timeout = 1.5 s) ends it."""
    trickle = [(b"HTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\n", 0.0)] + \
        [(b" ", 0.4) for _ in range(19)] + [(b"1", 0.0)]
    server = RawServer(trickle)
    try:
        client = HttpClient(f"http://127.0.0.1:{server.port}", connect_timeout=0.5,
                            read_timeout=1.0, read_retries=0)
        with pytest.raises(ReadFailed, match="deadline"):
            client.read("GET", "/status")
    finally:
        server.close()


def test_a_normal_body_still_reads_as_json() -> None:
    body = json.dumps({"id": "p1", "status": "succeeded"}).encode()
    server = RawServer([(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                         + body, 0.0)])
    try:
        response = HttpClient(f"http://127.0.0.1:{server.port}").read("GET", "/x")
        assert response.json() == {"id": "p1", "status": "succeeded"}
    finally:
        server.close()


# -- fal JWKS ---------------------------------------------------------------------------------


def _jwks_trickled(delay: float) -> list[tuple[bytes, float]]:
    doc = json.dumps(sim_signing.jwks(sim_signing.fal_key(b"k" * 32))).encode()
    head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(doc)}\r\n\r\n".encode()
    return [(head, 0.0)] + [(doc[i:i + 8], delay) for i in range(0, len(doc), 8)]


def test_jwks_fetch_has_a_total_deadline_and_its_failure_is_cached() -> None:
    """A JWKS trickled inside every per-read timeout (~8 s in all) fails at the 1 s total
    deadline; the failure is remembered, so the next deliveries fail fast without a fetch."""
    server = RawServer(_jwks_trickled(0.4))
    try:
        cache = JwksCache(f"http://127.0.0.1:{server.port}/jwks", requests.Session(), timeout=1.0)
        with pytest.raises(ReadFailed):
            cache.keys(NOW)
        for _ in range(3):
            with pytest.raises(ReadFailed, match="last JWKS fetch failed"):
                cache.keys(NOW)
        assert len(server.requests) == 1
    finally:
        server.close()


def test_jwks_requests_do_not_queue_behind_one_fetch() -> None:
    """While one delivery's fetch is stalled, another delivery is answered at once (a 503 for
    fal to retry) instead of waiting for the lock."""
    server = RawServer(_jwks_trickled(0.5))
    try:
        cache = JwksCache(f"http://127.0.0.1:{server.port}/jwks", requests.Session(), timeout=30)
        def fetch() -> None:
            try:
                cache.keys(NOW)
            except ReadFailed:
                pass

        first = threading.Thread(target=fetch, daemon=True)
        first.start()
        while not server.requests:  # the first fetch has reached the server and stalls
            first.join(0.01)
        with pytest.raises(ReadFailed, match="being fetched"):
            cache.keys(NOW)
        assert first.is_alive()  # still fetching: the second call did not wait for it
    finally:
        server.close()
