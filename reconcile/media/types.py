"""Internal: the library's own mechanics, not an import path for platforms (may move).

Media types and storage extensions of fetched outputs (no I/O)."""

from __future__ import annotations

from pathlib import PurePosixPath
from urllib.parse import urlsplit

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


__all__ = ["guess_extension", "media_type_for_extension"]
