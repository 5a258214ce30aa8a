"""Internal: Where fetched outputs are kept: a local folder or an S3 bucket, behind one small Protocol.

Keys are deterministic (:func:`object_key`), so a retried finalize overwrites the same object
instead of leaving a second copy, and ``put`` is an idempotent overwrite on both backends.
Backend failures surface as :class:`~reconcile.errors.MediaError` (the cause chained), so the
finalizer handles one exception tree whichever backend is configured.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable
from urllib.parse import quote, unquote, urlsplit

from botocore.exceptions import BotoCoreError, ClientError

from .errors import MediaError

if TYPE_CHECKING:
    from .settings import Settings

_TMP_PREFIX = ".tmp-"  # in-flight LocalStorage writes; never listed as keys


@runtime_checkable
class Storage(Protocol):
    def put(self, key: str, data: bytes, content_type: str | None) -> None:
        """Store ``data`` under ``key``, replacing whatever was there."""

    def exists(self, key: str) -> bool: ...

    def delete(self, key: str) -> None:
        """Remove ``key``; a missing key is not an error."""

    def url(self, key: str) -> str: ...

    def keys(self, prefix: str = "") -> list[str]:
        """Every stored key starting with ``prefix``, sorted."""


def _segment(value: str) -> str:
    """One path segment that cannot climb out or nest: ``../../etc`` → ``_etc``."""
    # Each run of unsafe characters and dot-dots becomes one "_"; safe names pass unchanged.
    cleaned = re.sub(r"(?:[^A-Za-z0-9_.-]|\.{2,})+", "_", value).lstrip(".")
    return cleaned or "_"


def object_key(job_type: str, job_id: str, index: int, ext: str) -> str:
    """The deterministic key ``{job_type}/{job_id}/{index}.{ext}`` of one output."""
    if index < 0:
        raise ValueError(f"output index must be >= 0, got {index}")
    clean_ext = re.sub(r"[^a-z0-9]", "", ext.lower()) or "bin"
    return f"{_segment(job_type)}/{_segment(job_id)}/{index}.{clean_ext}"


def _checked(key: str) -> str:
    """Refuse keys that could escape the root (``..``, absolute, backslashes, empty parts)."""
    parts = key.split("/")
    if not key or key.startswith("/") or "\\" in key or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"unsafe storage key {key!r}")
    return key


def _public(base: str, key: str) -> str:
    return f"{base.rstrip('/')}/{quote(key)}"


_FILE_MODE = 0o666


def _umask() -> int:
    """The process's umask: from /proc on Linux (no change to it), else read by setting it."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


class LocalStorage:
    """A folder: each put writes a temp file beside the target, then ``os.replace`` (atomic)."""

    def __init__(self, root: Path | str, public_base_url: str | None = None) -> None:
        self.root = Path(root).resolve()
        self.public_base_url = public_base_url

    def _path(self, key: str) -> Path:
        return self.root / _checked(key)

    def put(self, key: str, data: bytes, content_type: str | None = None) -> None:
        path = self._path(key)
        tmp_name: str | None = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # Same folder as the target, so the rename never crosses filesystems; a reader
            # sees the old file or the whole new one, never a half-written one.
            with tempfile.NamedTemporaryFile(
                dir=path.parent, prefix=_TMP_PREFIX, delete=False
            ) as tmp:
                tmp_name = tmp.name
                # a temp file is 0600; a stored file is what a plain open() makes (0666 less
                # the umask: 0644 usually), so a web server serving the folder can read it
                os.fchmod(tmp.fileno(), _FILE_MODE & ~_umask())
                tmp.write(data)
                tmp.flush()
                os.fsync(tmp.fileno())
            os.replace(tmp_name, path)
            tmp_name = None
        except OSError as exc:
            raise MediaError(f"storing {key!r} under {self.root} failed: {exc}") from exc
        finally:
            if tmp_name is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp_name)

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def delete(self, key: str) -> None:
        try:
            self._path(key).unlink(missing_ok=True)
        except OSError as exc:
            raise MediaError(f"deleting {key!r} under {self.root} failed: {exc}") from exc

    def url(self, key: str) -> str:
        if self.public_base_url:
            return _public(self.public_base_url, _checked(key))
        return self._path(key).as_uri()

    def keys(self, prefix: str = "") -> list[str]:
        # walk only the folder the prefix names (one job's outputs, not the whole root)
        folder = self.root.joinpath(*[p for p in prefix.split("/")[:-1] if p not in ("", ".", "..")])
        if not folder.is_dir():
            return []
        found = (
            path.relative_to(self.root).as_posix()
            for path in folder.rglob("*")
            if path.is_file() and not path.name.startswith(_TMP_PREFIX)
        )
        return sorted(key for key in found if key.startswith(prefix))


class S3Storage:
    """An S3 bucket (or MinIO / moto) through an injected boto3 client, under ``prefix``."""

    def __init__(
        self,
        bucket: str,
        prefix: str,
        client: Any,
        public_base_url: str | None = None,
        *,
        url_expiry: timedelta = timedelta(hours=1),
    ) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.client = client
        # The public base maps to the bucket root, so public URLs include the prefix.
        self.public_base_url = public_base_url
        self.url_expiry = url_expiry

    def _full(self, key: str) -> str:
        key = _checked(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def put(self, key: str, data: bytes, content_type: str | None = None) -> None:
        extra = {"ContentType": content_type} if content_type else {}
        full = self._full(key)
        self._call("storing", key, self.client.put_object, Key=full, Body=data, **extra)

    def exists(self, key: str) -> bool:
        try:
            self.client.head_object(Bucket=self.bucket, Key=self._full(key))
        except ClientError as exc:
            if str(exc.response.get("Error", {}).get("Code", "")) in (
                "404",
                "NoSuchKey",
                "NotFound",
            ):
                return False
            raise MediaError(f"checking {key!r} in s3://{self.bucket} failed: {exc}") from exc
        return True

    def delete(self, key: str) -> None:
        # S3 answers 204 for a missing key too, so delete is idempotent for free.
        self._call("deleting", key, self.client.delete_object, Key=self._full(key))

    def url(self, key: str) -> str:
        if self.public_base_url:
            return _public(self.public_base_url, self._full(key))
        params = {"Bucket": self.bucket, "Key": self._full(key)}
        expires = int(self.url_expiry.total_seconds())
        try:
            return str(
                self.client.generate_presigned_url("get_object", Params=params, ExpiresIn=expires)
            )
        except (BotoCoreError, ClientError) as exc:
            raise MediaError(f"signing {key!r} in s3://{self.bucket} failed: {exc}") from exc

    def keys(self, prefix: str = "") -> list[str]:
        base = f"{self.prefix}/" if self.prefix else ""
        found: list[str] = []
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=base + prefix
            )
            for page in pages:
                found.extend(obj["Key"][len(base) :] for obj in page.get("Contents", []))
        except (BotoCoreError, ClientError) as exc:
            raise MediaError(f"listing s3://{self.bucket}/{base} failed: {exc}") from exc
        return sorted(found)

    def _call(self, verb: str, key: str, method: Any, **kwargs: Any) -> Any:
        try:
            return method(Bucket=self.bucket, **kwargs)
        except (BotoCoreError, ClientError) as exc:
            raise MediaError(f"{verb} {key!r} in s3://{self.bucket} failed: {exc}") from exc


def storage_from_settings(settings: Settings, *, s3_client: Any = None) -> Storage:
    """The backend named by ``STORAGE_URL``: ``file://<folder>`` or ``s3://bucket/prefix``."""
    url = settings.storage_url
    public = settings.media_public_base_url
    if url.startswith("file://"):
        # file:///abs, file://localhost/abs and the default's relative file://./folder.
        rest = url[len("file://") :]
        if rest.startswith("localhost/"):
            rest = rest[len("localhost") :]
        return LocalStorage(Path(unquote(rest) or "."), public_base_url=public)
    parts = urlsplit(url)
    if parts.scheme == "s3":
        if len(parts.netloc) < 3:  # S3 refuses shorter bucket names (InvalidBucketName)
            raise ValueError(f"STORAGE_URL {url!r} needs a bucket name: s3://bucket/prefix")
        if s3_client is None:
            import boto3

            s3_client = boto3.client(
                "s3", endpoint_url=settings.s3_endpoint_url, region_name=settings.s3_region
            )
        return S3Storage(parts.netloc, unquote(parts.path), s3_client, public_base_url=public)
    raise ValueError(f"STORAGE_URL {url!r} is neither file://… nor s3://bucket/prefix")


__all__ = ["LocalStorage", "S3Storage", "Storage", "object_key", "storage_from_settings"]
