"""Safe fetch (the SSRF guard, bounds, expiry) and the local storage backend."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests
import responses
from hypothesis import given, settings, strategies as st

from reconcile import Settings
from reconcile.errors import (
    MediaError,
    MediaExpired,
    MediaFetchFailed,
    MediaTooLarge,
    UnsafeMediaURL,
)
from reconcile.media.fetch import guess_extension, safe_fetch
from reconcile.storage import LocalStorage, S3Storage, object_key, storage_from_settings

PUBLIC_IP = "93.184.216.34"


def resolver(table: dict[str, str]) -> Callable[..., list[tuple[Any, ...]]]:
    """A fake getaddrinfo answering from ``table`` (host → IP); unknown hosts fail."""

    def resolve(host: str, port: int, **_: Any) -> list[tuple[Any, ...]]:
        if host not in table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        family = socket.AF_INET6 if ":" in table[host] else socket.AF_INET
        return [(family, socket.SOCK_STREAM, 6, "", (table[host], port))]

    return resolve


PUBLIC = resolver({"cdn.example.com": PUBLIC_IP, "other.example.com": "93.184.216.35"})


def fetch(url: str, **kwargs: Any) -> Any:
    kwargs.setdefault("resolver", PUBLIC)
    kwargs.setdefault("max_bytes", 1000)
    kwargs.setdefault("timeout", 5.0)
    return safe_fetch(url, **kwargs)


# -- allowed fetches -----------------------------------------------------------------------


@responses.activate
def test_public_host_is_fetched_with_its_media_type() -> None:
    """A public URL returns its bytes, the bare media type and the final URL."""
    responses.get("https://cdn.example.com/a.png", body=b"PNG", content_type="image/png; q=1")
    media = fetch("https://cdn.example.com/a.png")
    assert (media.data, media.content_type, media.final_url) == (
        b"PNG",
        "image/png",
        "https://cdn.example.com/a.png",
    )


@responses.activate
def test_redirect_between_public_hosts_is_followed_and_rechecked() -> None:
    """A redirect is followed by hand; the final URL is reported."""
    responses.get(
        "https://cdn.example.com/a", status=302, headers={"Location": "https://other.example.com/b"}
    )
    responses.get("https://other.example.com/b", body=b"ok")
    media = fetch("https://cdn.example.com/a")
    assert (media.data, media.final_url) == (b"ok", "https://other.example.com/b")


@responses.activate
def test_caller_headers_are_not_forwarded_to_another_host() -> None:
    """An Authorization header meant for the origin never reaches a redirect target."""
    responses.get(
        "https://cdn.example.com/a", status=302, headers={"Location": "https://other.example.com/b"}
    )
    responses.get("https://other.example.com/b", body=b"ok")
    fetch("https://cdn.example.com/a", headers={"Authorization": "Bearer secret"})
    assert responses.calls[0].request.headers["Authorization"] == "Bearer secret"
    assert "Authorization" not in responses.calls[1].request.headers


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("http://localhost:9000/bucket/x.png", ["localhost:*"]),
        ("http://127.0.0.1:9000/bucket/x.png", ["127.0.0.1:*"]),
        ("http://localhost:9000/bucket/x.png", ["LOCALHOST:9000"]),
    ],
)
@responses.activate
def test_allow_listed_loopback_host_is_fetched(url: str, allowed: list[str]) -> None:
    """An operator-listed host (a simulator, a MinIO) skips the address check."""
    responses.get(url, body=b"local")
    loopback = resolver({"localhost": "127.0.0.1"})
    assert fetch(url, allowed_hosts=allowed, resolver=loopback).data == b"local"


# -- refused addresses and schemes ---------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "table"),
    [
        ("http://127.0.0.1/x", {}),
        ("http://[::1]/x", {}),
        ("http://169.254.169.254/latest/meta-data/", {}),
        ("http://[fd00:ec2::254]/latest/meta-data/", {}),
        ("http://internal.example/x", {"internal.example": "10.1.2.3"}),
        ("http://internal.example/x", {"internal.example": "192.168.0.7"}),
        ("http://internal.example/x", {"internal.example": "100.64.0.1"}),
        ("http://internal.example/x", {"internal.example": "::ffff:127.0.0.1"}),
        ("http://internal.example/x", {"internal.example": "0.0.0.0"}),
        ("http://internal.example/x", {"internal.example": "224.0.0.1"}),
        ("http://metadata.example/x", {"metadata.example": "169.254.169.254"}),
    ],
)
@responses.activate
def test_non_public_addresses_are_refused_before_any_request(
    url: str, table: dict[str, str]
) -> None:
    """Loopback, private, shared, link-local, metadata, multicast and unspecified are refused."""
    responses.get(url, body=b"secret")
    with pytest.raises(UnsafeMediaURL, match="non-public address"):
        fetch(url, resolver=resolver(table))
    assert len(responses.calls) == 0


def test_a_host_with_one_private_address_among_public_ones_is_refused() -> None:
    """Every resolved address must be public, not just the first."""

    def mixed(host: str, port: int, **_: Any) -> list[tuple[Any, ...]]:
        return [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", (PUBLIC_IP, port)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.1", port)),
        ]

    with pytest.raises(UnsafeMediaURL):
        fetch("https://cdn.example.com/x", resolver=mixed)


@pytest.mark.parametrize(
    "url", ["file:///etc/passwd", "ftp://cdn.example.com/x", "gopher://x/", "//cdn.example.com/x"]
)
def test_non_http_schemes_are_refused(url: str) -> None:
    """Only http and https are fetched."""
    with pytest.raises(UnsafeMediaURL, match="scheme"):
        fetch(url)


@pytest.mark.parametrize("target", ["http://10.0.0.5/x", "http://internal.example/x"])
@responses.activate
def test_redirect_to_a_private_address_is_refused(target: str) -> None:
    """A public URL that redirects inward is stopped at the redirect, before the inner request."""
    responses.get("https://cdn.example.com/a", status=307, headers={"Location": target})
    table = {"cdn.example.com": PUBLIC_IP, "internal.example": "10.0.0.5"}
    with pytest.raises(UnsafeMediaURL, match="10.0.0.5"):
        fetch("https://cdn.example.com/a", resolver=resolver(table))
    assert len(responses.calls) == 1


@responses.activate
def test_too_many_redirects_fail() -> None:
    """A redirect loop ends after max_redirects hops."""
    responses.get("https://cdn.example.com/loop", status=302, headers={"Location": "/loop"})
    with pytest.raises(MediaFetchFailed, match="redirects"):
        fetch("https://cdn.example.com/loop", max_redirects=3)
    assert len(responses.calls) == 4


# -- bounds and upstream answers -----------------------------------------------------------


@responses.activate
def test_declared_oversize_body_is_refused_early() -> None:
    """A Content-Length over the bound is refused from the header alone."""
    responses.get("https://cdn.example.com/big", body=b"x" * 10, headers={"Content-Length": "5000"})
    with pytest.raises(MediaTooLarge, match="declares 5000 bytes"):
        fetch("https://cdn.example.com/big", max_bytes=1000)


@responses.activate
def test_undeclared_oversize_body_is_refused_while_streaming() -> None:
    """Without a Content-Length the streamed bytes are counted."""
    responses.get("https://cdn.example.com/big", body=b"x" * 5000)
    with pytest.raises(MediaTooLarge, match="exceeds the 1000-byte bound"):
        fetch("https://cdn.example.com/big", max_bytes=1000)


@responses.activate
def test_body_exactly_at_the_bound_is_accepted() -> None:
    """The bound is inclusive."""
    responses.get("https://cdn.example.com/ok", body=b"x" * 1000)
    assert len(fetch("https://cdn.example.com/ok", max_bytes=1000).data) == 1000


@pytest.mark.parametrize("status", [403, 404, 410])
@responses.activate
def test_gone_result_urls_are_expired(status: int) -> None:
    """403/404/410 on a result URL means it expired: a terminal MediaExpired."""
    responses.get("https://cdn.example.com/old.png", status=status)
    with pytest.raises(MediaExpired, match=str(status)):
        fetch("https://cdn.example.com/old.png")


@pytest.mark.parametrize("status", [500, 502, 429])
@responses.activate
def test_other_error_statuses_are_retryable_failures(status: int) -> None:
    """Other non-2xx answers are a retryable MediaFetchFailed."""
    responses.get("https://cdn.example.com/x", status=status)
    with pytest.raises(MediaFetchFailed, match=str(status)):
        fetch("https://cdn.example.com/x")


@responses.activate
def test_transport_error_is_a_retryable_failure() -> None:
    """A connection error is a retryable MediaFetchFailed, not a requests exception."""
    responses.get("https://cdn.example.com/x", body=requests.ConnectionError("reset"))
    with pytest.raises(MediaFetchFailed, match="ConnectionError"):
        fetch("https://cdn.example.com/x")


def test_unresolvable_host_is_a_retryable_failure() -> None:
    """DNS failure is a MediaFetchFailed."""
    with pytest.raises(MediaFetchFailed, match="cannot resolve"):
        fetch("https://nowhere.example/x")


def test_exhausted_time_bound_fails_without_a_request() -> None:
    """A fetch with no time left fails as retryable."""
    with pytest.raises(MediaFetchFailed, match="time bound"):
        fetch("https://cdn.example.com/x", timeout=0)


@pytest.mark.parametrize(
    ("content_type", "url", "ext"),
    [
        ("image/png", "https://x/y", "png"),
        ("image/jpeg; charset=binary", "https://x/y", "jpg"),
        ("image/webp", None, "webp"),
        ("video/mp4", None, "mp4"),
        ("audio/mpeg", None, "mp3"),
        ("audio/x-wav", None, "wav"),
        ("text/plain; charset=utf-8", None, "txt"),
        ("application/json", None, "json"),
        ("application/octet-stream", "https://x/files/out.JPEG?sig=1", "jpg"),
        (None, "https://x/a.mp3", "mp3"),
        (None, "https://x/a.exe", "bin"),
        (None, None, "bin"),
    ],
)
def test_guess_extension(content_type: str | None, url: str | None, ext: str) -> None:
    """Media type first, then the URL suffix, else bin."""
    assert guess_extension(content_type, url) == ext


# -- storage keys and the local folder ------------------------------------------------------


@pytest.mark.parametrize(
    ("job_type", "job_id", "expected"),
    [
        ("image", "0b1c", "image/0b1c/2.png"),
        ("../../etc", "0b1c", "_etc/0b1c/2.png"),
        ("/abs/path", "../x", "_abs_path/_x/2.png"),
        ("..", "", "_/_/2.png"),
    ],
)
def test_object_key_is_deterministic_and_cannot_escape(
    job_type: str, job_id: str, expected: str
) -> None:
    """The key is {job_type}/{job_id}/{index}.{ext} with unsafe segments neutralised."""
    key = object_key(job_type, job_id, 2, "png")
    assert key == expected
    assert ".." not in key.split("/") and not key.startswith("/")


@settings(deadline=None)
@given(job_type=st.text(), job_id=st.text(), index=st.integers(min_value=0), ext=st.text())
def test_fuzz_object_key_always_has_three_safe_segments(
    job_type: str, job_id: str, index: int, ext: str
) -> None:
    """Whatever the inputs, the key is three non-empty segments with no '..' and no root."""
    parts = object_key(job_type, job_id, index, ext).split("/")
    assert len(parts) == 3 and all(parts)
    assert not any(p.startswith(".") or ".." in p for p in parts)


def test_local_storage_put_overwrite_delete(tmp_path: Path) -> None:
    """put writes, a second put replaces, delete removes (twice is fine), keys lists."""
    store = LocalStorage(tmp_path)
    key = object_key("image", "job1", 0, "png")
    store.put(key, b"first", "image/png")
    store.put(key, b"second", "image/png")
    assert (tmp_path / key).read_bytes() == b"second"
    store.put("image/job2/0.png", b"x", None)
    assert store.keys() == ["image/job1/0.png", "image/job2/0.png"]
    assert store.keys("image/job1/") == ["image/job1/0.png"]
    store.delete(key)
    store.delete(key)
    assert not store.exists(key) and store.exists("image/job2/0.png")


def test_local_storage_write_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A crash before the rename leaves the old object whole and no temp file behind."""
    store = LocalStorage(tmp_path)
    store.put("a/b/0.txt", b"old", "text/plain")

    def crash(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(MediaError, match="disk full"):
        store.put("a/b/0.txt", b"new", "text/plain")
    assert (tmp_path / "a/b/0.txt").read_bytes() == b"old"
    assert sorted(p.name for p in (tmp_path / "a/b").iterdir()) == ["0.txt"]


@pytest.mark.parametrize("key", ["../escape", "/etc/passwd", "a/../../b", "a\\b", "", "a//b"])
def test_local_storage_refuses_keys_that_escape_the_root(tmp_path: Path, key: str) -> None:
    """A key can never address a file outside the storage root."""
    with pytest.raises(ValueError, match="unsafe storage key"):
        LocalStorage(tmp_path / "root").put(key, b"x", None)


def test_local_storage_urls(tmp_path: Path) -> None:
    """Without a public base the URL is an absolute file:// URL; with one, base + key."""
    assert LocalStorage(tmp_path).url("a/0.png") == (tmp_path / "a/0.png").resolve().as_uri()
    public = LocalStorage(tmp_path, public_base_url="https://media.example.com/out/")
    assert public.url("a b/0.png") == "https://media.example.com/out/a%20b/0.png"


def test_storage_from_settings_file_and_s3(tmp_path: Path) -> None:
    """STORAGE_URL picks the backend: file:// a folder, s3://bucket/prefix a bucket."""
    local = storage_from_settings(Settings(storage_url=f"file://{tmp_path}/media"))
    assert isinstance(local, LocalStorage) and local.root == tmp_path / "media"
    client = object()
    s3 = storage_from_settings(Settings(storage_url="s3://outputs/prod/media"), s3_client=client)
    assert isinstance(s3, S3Storage)
    assert (s3.bucket, s3.prefix, s3.client) == ("outputs", "prod/media", client)
    with pytest.raises(ValueError, match="STORAGE_URL"):
        storage_from_settings(Settings(storage_url="gs://bucket/x"))


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_stored_files_get_the_plain_open_mode_under_the_umask(tmp_path: Path, umask: int) -> None:
    """A stored media file is 0666 less the umask (0644 usually), not a temp file's 0600."""
    before = os.umask(umask)
    try:
        LocalStorage(tmp_path).put("jobs/a/0.png", b"png", "image/png")
    finally:
        os.umask(before)
    assert (tmp_path / "jobs/a/0.png").stat().st_mode & 0o777 == 0o666 & ~umask
