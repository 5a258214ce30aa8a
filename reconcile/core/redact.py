"""Internal: the library's own mechanics, not an import path for platforms (may move).

What operators and customers may see of an error (issue 12, part 5: what users see).

* Operators get full detail — except signed query strings (``X-Amz-Signature``,
  ``X-Amz-Credential``, GCS/Azure/CloudFront signatures, tokens): a presigned result URL is a
  bearer credential, so its signature is replaced by ``REDACTED`` wherever the library stores or
  logs text (exception messages, provider bodies, ``error_detail``, anomalies) and in every log
  record of the process, third-party DEBUG loggers (urllib3, botocore) included
  (:func:`install_log_redaction`).
* Customers get the stable code and the library's own message; for ``UPSTREAM_INVALID_INPUT``
  and ``UPSTREAM_FAILED`` also the provider's own message with URLs, host names and IP addresses
  removed (:func:`for_customer`).
* A database URL or libpq DSN shown to an operator has every credential masked
  (:func:`database_url`): the ``user:password@`` form, ``password=`` / ``sslpassword=`` (and
  other secret-looking keys) in a query string, percent-encoded or not, and in a keyword/value
  DSN, quoted or not.
* An operator's terminal gets customer and provider text with every non-printable character
  (ESC, OSC, other C0/C1 controls, bidi and format characters, line separators) escaped
  (:func:`for_terminal`); submit refuses them in identifiers (:func:`printable`).
"""

from __future__ import annotations

import ipaddress
import logging
import re
import traceback
from typing import Any
from urllib.parse import unquote_plus

REDACTED = "REDACTED"
_SIGNED_PARAMS = (
    "x-amz-signature", "x-amz-credential", "x-amz-security-token", "x-goog-signature",
    "x-goog-credential", "signature", "sig", "key-pair-id", "policy", "token", "access_token",
    "x-oss-signature", "ossaccesskeyid", "awsaccesskeyid",
)
_SIGNED = re.compile(
    r"(?i)([?&;](?:" + "|".join(re.escape(p) for p in _SIGNED_PARAMS) + r")=)[^&#\s\"'<>]*")
_URL = re.compile(r"(?i)\b[a-z][a-z0-9+.-]*://[^\s\"'<>]+")
# No \b: an address glued to a word character (``%2F10.0.0.5`` in an encoded URL, ``ip_10.0.0.5``)
# must go too.
_IPV4 = re.compile(r"(?<![\d.])\d{1,3}(?:\.\d{1,3}){3}(?::\d{1,5})?(?![\d.]*\d)")
# A candidate IPv6 token (compressed forms included: ``fd00::1``, ``::1``, ``fe80::1%eth0``);
# it is scrubbed only when it parses as an address, so ``12:30:45`` stays.
_IPV6 = re.compile(r"(?i)(?<![\w:])\[?(?:[0-9a-f]{0,4}:){2,7}[0-9a-f.]*(?:%[\w.-]+)?\]?"
                   r"(?::\d{1,5})?")
_FILE_SUFFIXES = ("png", "jpg", "jpeg", "webp", "gif", "mp4", "mov", "mp3", "wav", "txt", "json",
                  "pdf", "zip", "safetensors", "tar", "gz")
_HOST = re.compile(r"(?i)\b(?:[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9])?\.)+([a-z][a-z0-9-]{1,23})"
                   r"(?::\d{1,5})?\b")
_HOST_PORT = re.compile(r"(?i)\b[a-z0-9_][a-z0-9_.-]*:\d{2,5}\b")
_MAX_DEPTH = 32


def signed(text: str) -> str:
    """``text`` with every signed query-string value replaced by ``REDACTED``."""
    if "=" not in text:
        return text
    return _SIGNED.sub(lambda m: m.group(1) + REDACTED, text)


def detail(value: Any, _depth: int = 0) -> Any:
    """A stored ``error_detail`` / anomaly detail with signed query strings redacted."""
    if isinstance(value, str):
        return signed(value)
    if _depth > _MAX_DEPTH:
        return value
    if isinstance(value, dict):
        return {k: detail(v, _depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [detail(v, _depth + 1) for v in value]
    return value


def for_customer(text: str) -> str:
    """A provider's message fit for the customer: no URL, host name or IP address left."""
    text = _URL.sub("[url]", signed(text))  # a scheme-less presigned URL keeps its path
    text = _IPV6.sub(lambda m: "[address]" if _is_ipv6(m.group(0)) else m.group(0), text)
    text = _IPV4.sub("[address]", text)
    text = _HOST.sub(lambda m: m.group(0) if m.group(1).lower() in _FILE_SUFFIXES
                     else "[host]", text)
    return _HOST_PORT.sub("[host]", text)


def _is_ipv6(token: str) -> bool:
    """``token`` (maybe ``[v6]:port``, ``v6%zone``, or ``v6:port`` unbracketed) is an IPv6 address."""
    core = token.lstrip("[")
    candidates = [core.split("]", 1)[0]] if "]" in core else [core, core.rpartition(":")[0]]
    for candidate in candidates:
        try:
            ipaddress.IPv6Address(candidate)
        except ValueError:
            continue
        return True
    return False


# A key whose value is a credential, matched in its decoded, lower-case form: libpq's
# ``password``/``sslpassword``, drivers' ``pwd``/``passwd``, and tokens or secrets of any kind.
_SECRET_KEY = re.compile(r"pass|pwd|secret|token|credential|private|api_?key")
_URL_START = re.compile(r"\s*[a-z][a-z0-9+.-]*://", re.IGNORECASE)
# user:password@ — the password runs to the last @ (an unencoded @, / or ? inside it included)
_URL_USERINFO = re.compile(r"(?s)^(\s*[a-z][a-z0-9+.-]*://[^:/?#@]*:)(.*)(@)", re.IGNORECASE)
# key=value in a URL query: the value runs to the next & or #
_QUERY_PAIR = re.compile(r"([?&;])([^=&#?;]*)=([^&#]*)")
# key = value in a keyword/value DSN: a single-quoted value (\' and \\ escaped) or a bare word
_DSN_PAIR = re.compile(r"(?:(?<=\s)|^)([^\s=']+)(\s*=\s*)('(?:[^'\\]|\\.)*'?|\S*)")


def _secret_key(key: str) -> bool:
    return bool(_SECRET_KEY.search(unquote_plus(key).strip().lower()))


def database_url(text: str) -> str:
    """A database URL or libpq keyword/value DSN with every credential replaced by ``***``."""
    if _URL_START.match(text):  # a keyword/value DSN never starts with scheme://
        text = _URL_USERINFO.sub(lambda m: m.group(1) + "***" + m.group(3), text, count=1)
        return _QUERY_PAIR.sub(lambda m: f"{m.group(1)}{m.group(2)}="
                               f"{'***' if _secret_key(m.group(2)) else m.group(3)}", text)
    return _DSN_PAIR.sub(lambda m: m.group(1) + m.group(2) + (
        "***" if _secret_key(m.group(1)) else m.group(3)), text)


def printable(text: str) -> bool:
    """No character an operator's terminal would act on or hide (see :func:`for_terminal`)."""
    return text.isprintable()


def for_terminal(text: str) -> str:
    """``text`` safe for a terminal: each non-printable character (``str.isprintable``: C0/C1
    controls and ESC, bidi and other format characters, line and paragraph separators,
    non-ASCII spaces) as its Python escape (``\\x1b``, ``\\u202e``); the rest unchanged."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)


class _Redacting:
    """A log record factory wrapper: the message (and traceback) of every record is redacted."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __call__(self, *args: Any, **kwargs: Any) -> logging.LogRecord:
        record = self.inner(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: logging reports it itself, later
            return record
        clean = signed(message)
        if clean != message:
            record.msg, record.args = clean, ()
        if record.exc_info and record.exc_info[1] is not None:
            text = "".join(traceback.format_exception(*record.exc_info))
            if signed(text) != text:
                record.exc_text = signed(text)
        return record


def install_log_redaction() -> None:
    """Redact signed query strings from every log record of the process (idempotent)."""
    current = logging.getLogRecordFactory()
    if not isinstance(current, _Redacting):
        logging.setLogRecordFactory(_Redacting(current))


__all__ = ["REDACTED", "database_url", "detail", "for_customer", "for_terminal",
           "install_log_redaction", "printable", "signed"]
