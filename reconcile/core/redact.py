"""Internal: the library's own mechanics, not an import path for platforms (may move).

What operators and customers may see of an error (issue 12, part 5: what users see).

* Operators get full detail — except credentials. :func:`text` (one string) and :func:`value`
  (a JSON-like value) are the one redaction every sink uses: log records of the process,
  third-party DEBUG loggers (urllib3, botocore) included (:func:`install_log_redaction`),
  stored error messages, ``error_detail``, anomalies' detail, stored webhook payloads and the
  ``reconcile`` command's output. They replace with ``REDACTED``: signed query strings
  (``X-Amz-Signature``, ``X-Amz-Credential``, ``X-Amz-Security-Token``, GCS/Azure/CloudFront
  signatures, tokens, ``password``) — a presigned result URL is a bearer credential; SigV4
  ``Credential=`` / ``Signature=`` fields and a logged ``Signature:`` value; AWS access key ids;
  the value of every credential header or key (``Authorization`` — keeping its scheme word,
  ``Bearer``, ``Key``, ``AWS4-HMAC-SHA256`` —, ``x-amz-security-token``, ``x-api-key``,
  ``xi-api-key``, ``Cookie``, ``password``…) as a header line, a ``name=value`` pair or a quoted
  mapping entry; a bearer token anywhere; a URL's ``user:password@``; and the configured
  secrets' values themselves (:func:`remember_secrets`, called for every
  :class:`~reconcile.settings.Settings`).
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

from .limits import storable

REDACTED = "REDACTED"
_SIGNED_PARAMS = (
    "x-amz-signature", "x-amz-credential", "x-amz-security-token", "x-goog-signature",
    "x-goog-credential", "signature", "sig", "key-pair-id", "policy", "token", "access_token",
    "x-oss-signature", "ossaccesskeyid", "awsaccesskeyid", "password", "passwd", "pwd",
    "sslpassword", "api_key", "apikey", "api-key", "client_secret", "secret", "key",
)
_SIGNED = re.compile(
    r"(?i)([?&;](?:" + "|".join(re.escape(p) for p in _SIGNED_PARAMS) + r")=)[^&#\s\"'<>]*")
# the same inside a percent-encoded URL (a URL passed as another URL's query value)
_SIGNED_ENCODED = re.compile(
    r"(?i)((?:%3F|%26)(?:" + "|".join(re.escape(p) for p in _SIGNED_PARAMS) + r")%3D)"
    r"(?:(?!%26)[^&#\s\"'<>])*")
# The names whose value is a credential: request headers (each provider's key header included:
# ``Authorization`` for KIE, Replicate and fal, ``xi-api-key`` for ElevenLabs, ``x-api-key`` for
# Anthropic) and the keys of configuration and connection strings.
_SECRET_NAMES = (
    "authorization", "proxy-authorization", "x-amz-security-token", "x-api-key", "xi-api-key",
    "x-goog-api-key", "api-key", "api_key", "apikey", "x-auth-token", "cookie", "set-cookie",
    "password", "passwd", "pwd", "sslpassword", "client_secret", "aws_secret_access_key",
    "aws_session_token", "secret_access_key", "session_token",
)
_NAME = r"(?<![\w-])(?:" + "|".join(re.escape(n) for n in _SECRET_NAMES) + r")"
# 'Authorization': b'…' (a headers dict's repr), "x-api-key": "…" (JSON)
_QUOTED_ENTRY = re.compile(r"(?i)(" + _NAME + r"(\\?['\"])\s*:\s*b?(\\?['\"]))(.*?)(\3)")
# Authorization: … / x-amz-security-token:… (a header line, a canonical request): to the line's end
_HEADER_LINE = re.compile(r"(?im)(" + _NAME + r"[ \t]*:[ \t]*)([^\r\n]+)")
# password=… (a DSN, a log's key=value)
_KEY_VALUE = re.compile(r"(?i)(" + _NAME + r"[ \t]*=[ \t]*)('(?:[^'\\]|\\.)*'?|[^\s&,;\"'<>]+)")
_AUTH_SCHEME = re.compile(r"(?i)^\s*(bearer|basic|key|token|digest|aws4-hmac-sha256|aws)\s+")
# SigV4 fields wherever they stand, and botocore's ``Signature:\n<hex>`` record
_SIGV4_FIELD = re.compile(r"(?i)(?<![\w-])((?:credential|signature)=)[^,\s&\"'<>]+")
_SIGNATURE_LINE = re.compile(r"(?i)(?<![\w-])(signature:\s*)[0-9a-f]{16,}")
_BEARER = re.compile(r"(?i)(?<![\w-])(bearer\s+)(?!REDACTED)[A-Za-z0-9._~+/=-]{8,}")
_AWS_KEY_PREFIXES = ("AKIA", "ASIA", "AIDA", "AROA", "AGPA", "ANPA", "ANVA", "AIPA", "ABIA", "ACCA")
_AWS_KEY_ID = re.compile(r"(?<![A-Z0-9])(?:" + "|".join(_AWS_KEY_PREFIXES) + r")[A-Z0-9]{16}"
                         r"(?![A-Z0-9])")
_USERINFO = re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://[^\s/:@\"'<>]*:)[^\s/@\"'<>]+(@)")
_MIN_SECRET = 8  # a shorter configured value is too likely to be ordinary text
_MAX_SECRETS = 64
_secrets: dict[str, None] = {}  # insertion-ordered: the oldest goes first
_secrets_pattern: re.Pattern[str] | None = None
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


def remember_secrets(*values: str | None) -> None:
    """Redact these configured secret values wherever they appear (API keys, webhook secrets);
    values shorter than 8 characters are ignored, and only the latest 64 are kept (a process
    has one configuration; a test session builds many)."""
    global _secrets_pattern
    new = [v for v in values if isinstance(v, str) and len(v.strip()) >= _MIN_SECRET]
    if all(v in _secrets for v in new):
        return
    for v in new:
        _secrets.pop(v, None)
        _secrets[v] = None
    while len(_secrets) > _MAX_SECRETS:
        del _secrets[next(iter(_secrets))]
    _secrets_pattern = re.compile("|".join(
        re.escape(v) for v in sorted(_secrets, key=len, reverse=True)))


def _header_value(match: re.Match[str], value_group: int) -> str:
    scheme = _AUTH_SCHEME.match(match.group(value_group))
    return match.group(1) + (scheme.group(0) if scheme else "") + REDACTED


def text(value: str) -> str:
    """``value`` with every credential shape replaced by ``REDACTED`` (module docstring): the
    one redaction of every sink — logs, stored errors and payloads, anomalies, CLI output. A NUL
    or an unpaired surrogate (which PostgreSQL's text and jsonb refuse) becomes U+FFFD."""
    value = storable(value)
    if _secrets_pattern is not None:
        value = _secrets_pattern.sub(REDACTED, value)
    lower = value.lower()  # cheap substring tests first: every log record comes through here
    named = any(name in lower for name in _SECRET_NAMES)
    sigv4 = "credential" in lower or "signature" in lower
    if "=" in value:
        value = _SIGNED.sub(lambda m: m.group(1) + REDACTED, value)
    if "%3d" in lower:
        value = _SIGNED_ENCODED.sub(lambda m: m.group(1) + REDACTED, value)
    if "=" in value:
        if sigv4:
            value = _SIGV4_FIELD.sub(lambda m: m.group(1) + REDACTED, value)
        if named:
            value = _KEY_VALUE.sub(lambda m: m.group(1) + REDACTED, value)
    if ":" in value:
        if named:
            value = _QUOTED_ENTRY.sub(lambda m: _header_value(m, 4) + m.group(5), value)
            value = _HEADER_LINE.sub(lambda m: _header_value(m, 2), value)
        if sigv4:
            value = _SIGNATURE_LINE.sub(lambda m: m.group(1) + REDACTED, value)
        if "@" in value and "://" in value:
            value = _USERINFO.sub(lambda m: m.group(1) + REDACTED + m.group(2), value)
    if "bearer" in lower:
        value = _BEARER.sub(lambda m: m.group(1) + REDACTED, value)
    if any(prefix in value for prefix in _AWS_KEY_PREFIXES):
        value = _AWS_KEY_ID.sub(REDACTED, value)
    return value


def value(obj: Any, _depth: int = 0) -> Any:
    """A JSON-like value (stored ``error_detail``, anomaly detail, webhook payload, CLI output)
    with :func:`text` applied to every string, keys included."""
    if isinstance(obj, str):
        return text(obj)
    if _depth > _MAX_DEPTH:
        return obj
    if isinstance(obj, dict):
        return {(text(k) if isinstance(k, str) else k): value(v, _depth + 1) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [value(v, _depth + 1) for v in obj]
    return obj


def for_customer(message: str) -> str:
    """A provider's message fit for the customer: no URL, host name or IP address left."""
    message = _URL.sub("[url]", text(message))  # a scheme-less presigned URL keeps its path
    message = _IPV6.sub(lambda m: "[address]" if _is_ipv6(m.group(0)) else m.group(0), message)
    message = _IPV4.sub("[address]", message)
    message = _HOST.sub(lambda m: m.group(0) if m.group(1).lower() in _FILE_SUFFIXES
                        else "[host]", message)
    return _HOST_PORT.sub("[host]", message)


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
    """A log record factory wrapper: the message (and traceback) of every record, whichever
    logger made it, goes through :func:`text` — formatted with its args first."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __call__(self, *args: Any, **kwargs: Any) -> logging.LogRecord:
        record: logging.LogRecord = self.inner(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: logging reports it itself, later
            return record
        clean = text(message)
        if clean != message:
            record.msg, record.args = clean, ()
        if record.exc_info and record.exc_info[1] is not None:
            trace = "".join(traceback.format_exception(*record.exc_info))
            if text(trace) != trace:
                record.exc_text = text(trace)
        if record.stack_info:
            record.stack_info = text(record.stack_info)
        return record


def install_log_redaction() -> None:
    """Redact every log record of the process with :func:`text` (idempotent)."""
    current = logging.getLogRecordFactory()
    if not isinstance(current, _Redacting):
        logging.setLogRecordFactory(_Redacting(current))


__all__ = ["REDACTED", "database_url", "for_customer", "for_terminal", "install_log_redaction",
           "printable", "remember_secrets", "text", "value"]
