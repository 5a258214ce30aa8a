"""S3Storage against a real S3 API: moto's server over HTTP on 127.0.0.1."""

from __future__ import annotations

import uuid
from typing import Any

import boto3
import pytest
import requests

from reconcile import Settings
from reconcile.errors import MediaError
from reconcile.storage import S3Storage, object_key, storage_from_settings

pytest_plugins = ("tests.integration.conftest_s3",)  # the s3_endpoint fixture


@pytest.fixture
def s3_client(s3_endpoint: str) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


@pytest.fixture
def bucket(s3_client: Any) -> str:
    """A fresh bucket per test, so tests sharing the session server never see each other."""
    name = f"reconcile-{uuid.uuid4().hex[:12]}"
    s3_client.create_bucket(Bucket=name)
    return name


def test_put_twice_overwrites_the_same_key(s3_client: Any, bucket: str) -> None:
    """A retried put replaces the object under its deterministic key: one object, new bytes."""
    store = S3Storage(bucket, "media", s3_client)
    key = object_key("image", "job-1", 0, "png")
    store.put(key, b"first", "image/png")
    store.put(key, b"second", "image/png")
    got = s3_client.get_object(Bucket=bucket, Key=f"media/{key}")
    assert got["Body"].read() == b"second"
    assert got["ContentType"] == "image/png"
    assert store.keys() == [key]


def test_exists_delete_and_keys_respect_the_prefix(s3_client: Any, bucket: str) -> None:
    """Keys are listed without the storage prefix; delete is idempotent."""
    store = S3Storage(bucket, "/media/", s3_client)
    s3_client.put_object(Bucket=bucket, Key="elsewhere/x.txt", Body=b"not ours")
    store.put("video/j1/0.mp4", b"v", "video/mp4")
    store.put("video/j2/0.mp4", b"v", None)
    assert store.exists("video/j1/0.mp4") and not store.exists("video/j3/0.mp4")
    assert store.keys() == ["video/j1/0.mp4", "video/j2/0.mp4"]
    assert store.keys("video/j2") == ["video/j2/0.mp4"]
    store.delete("video/j1/0.mp4")
    store.delete("video/j1/0.mp4")
    assert store.keys() == ["video/j2/0.mp4"]


def test_presigned_url_is_fetchable(s3_client: Any, bucket: str) -> None:
    """Without a public base, url() is a presigned GET that serves the object over HTTP."""
    store = S3Storage(bucket, "", s3_client)
    store.put("audio/j1/0.mp3", b"ID3-bytes", "audio/mpeg")
    response = requests.get(store.url("audio/j1/0.mp3"), timeout=10)
    assert response.status_code == 200
    assert response.content == b"ID3-bytes"


def test_public_base_url_maps_to_the_bucket_root(s3_client: Any, bucket: str) -> None:
    """With a public base the URL is base + prefix + key, not a signed URL."""
    store = S3Storage(bucket, "media", s3_client, public_base_url="https://cdn.example.com/")
    assert store.url("image/j/0.png") == "https://cdn.example.com/media/image/j/0.png"


def test_backend_failure_is_a_media_error(s3_client: Any) -> None:
    """A missing bucket surfaces as MediaError with the cause chained."""
    store = S3Storage("no-such-bucket-here", "", s3_client)
    with pytest.raises(MediaError, match="no-such-bucket-here"):
        store.put("a/b/0.bin", b"x", None)


def test_storage_from_settings_builds_a_client_for_the_endpoint(
    s3_endpoint: str, s3_client: Any, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """s3://bucket/prefix plus S3_ENDPOINT_URL gives a working store without an injected client."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    settings = Settings(storage_url=f"s3://{bucket}/out", s3_endpoint_url=s3_endpoint)
    store = storage_from_settings(settings)
    store.put("t/j/0.txt", b"hi", "text/plain")
    assert s3_client.get_object(Bucket=bucket, Key="out/t/j/0.txt")["Body"].read() == b"hi"
