"""Internal: the library's own mechanics, not an import path for platforms (may move).

HTTP discipline shared by every provider client.

* every request has explicit connect and read timeouts, and its body is read under a size cap
  (:data:`MAX_BODY_BYTES`) and a TOTAL deadline (connect + read timeout for the whole exchange,
  status line and headers included: :mod:`.deadline`'s watchdog): an endless chunked body, or
  headers or a body trickled a line per second, ends as a transport error
  (:class:`BodyTooLarge` / :class:`BodyDeadline` / ``DeadlineExceeded``) instead of holding a
  worker;
* :meth:`HttpClient.read` retries GETs (and other reads) on 429/5xx and transport errors with
  exponential backoff, honouring ``Retry-After``;
* :meth:`HttpClient.send_once` never retries: creates go through it, and the caller classifies
  the outcome (a create is never blindly retried: README, Design notes: The outcome table);
* a client's own session (:class:`ProviderSession`, when the platform injects none) reads the
  proxy and CA-bundle environment once per origin instead of on every request.
"""

from __future__ import annotations

import copy
import email.utils
import json
import math
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import requests
import urllib3

from ..errors import ProviderError, ReadFailed
from .deadline import bounded, prepare

if TYPE_CHECKING:
    from ..settings import Settings

RETRYABLE_STATUSES = frozenset({429, 500, 502, 503, 504, 529})
MAX_BODY_BYTES = 64 * 1024 * 1024  # no status/result/listing body (nor sync TTS audio) nears it
_CHUNK = 64 * 1024


class BodyTooLarge(requests.RequestException):
    """A provider body exceeded :data:`MAX_BODY_BYTES` (never retried)."""


class BodyDeadline(requests.Timeout):
    """A provider body was still arriving at the request's total deadline."""


def _total_seconds(timeout: Any) -> float:
    if isinstance(timeout, tuple):
        return float(sum(t for t in timeout if t is not None))
    return float(timeout) if timeout is not None else 60.0


def load_bounded(response: requests.Response, max_bytes: int, deadline: float) -> None:
    """Read the whole body into ``response`` (``.content``/``.json()`` keep working) under a
    byte cap and a monotonic deadline checked between socket reads."""
    raw = response.raw
    if hasattr(raw, "read1"):
        def pieces() -> Any:
            while piece := raw.read1(_CHUNK, decode_content=True):
                yield piece
        chunks = pieces()
    else:
        chunks = response.iter_content(_CHUNK)
    body, size = [], 0
    try:
        for chunk in chunks:
            size += len(chunk)
            if size > max_bytes:
                raise BodyTooLarge(f"response body exceeds {max_bytes} bytes")
            body.append(chunk)
            if time.monotonic() > deadline:
                raise BodyDeadline("response body still arriving at the request's total deadline")
    except requests.RequestException:
        raise
    except (urllib3.exceptions.HTTPError, OSError) as exc:  # a broken or reset body
        raise requests.ConnectionError(f"reading the response body failed: {exc}") from exc
    response._content = b"".join(body)
    response._content_consumed = True


def parse_retry_after(value: str | None, *, now: Callable[[], datetime] | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or HTTP date), or None.

    Defensive: always a finite number of seconds ≥ 0, or None for anything else (garbage,
    ``inf``, ``nan``, a date that does not exist). It is not bounded: a far-future date is a
    huge number, and every caller caps the wait (a read's backoff, a create's horizon)."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return max(0.0, seconds) if math.isfinite(seconds) else None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, OverflowError):
        return None
    if when is None:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    current = now() if now else datetime.now(UTC)
    return max(0.0, (when - current).total_seconds())


class ProviderSession(requests.Session):
    """A ``requests.Session`` that works out the environment's settings for an origin once.

    With ``trust_env`` (the default) requests reads the proxy variables, ``NO_PROXY`` and the
    CA-bundle variables on every request (``merge_environment_settings``): profiled under
    ``make bench`` that was 17 % of a chain poll's CPU and 29 % of a batch read's. The answer
    depends only on the origin, the call's own proxies/stream/verify/cert and the session's own
    (all part of the key), so it is kept per origin for the session's life: a worker that
    changes its proxy environment after its clients are built needs a restart (or a session of
    its own, injected through ``Runtime.http``).
    """

    MAX_ORIGINS = 256

    def __init__(self) -> None:
        super().__init__()
        self._environment: dict[tuple[Any, ...], dict[str, Any]] = {}
        self._netrc: dict[str | None, Any] = {}

    def prepare_request(self, request: requests.Request) -> requests.PreparedRequest:
        """requests looks the host up in the netrc file (a stat of ``~/.netrc`` and
        ``~/_netrc`` at least) on every request with no auth of its own: that answer is kept per
        host too, with the same lifetime as the environment's. The caller's ``request`` is not
        changed (a copy carries the answer). Any URL this does not read as requests does (one
        with credentials of its own, leading whitespace, a host that does not parse, bytes) is
        left to requests."""
        host = self._plain_host(request.url) if self.trust_env and not request.auth \
            and not self.auth else None
        if host is not None:
            url = str(request.url)
            request = copy.copy(request)
            request.auth = self._kept(self._netrc, host,
                                      lambda: requests.utils.get_netrc_auth(url) or _no_auth)
        return super().prepare_request(request)

    def _kept(self, cache: dict[Any, Any], key: Any, compute: Callable[[], Any]) -> Any:
        """``cache[key]``, from ``compute()`` the first time (never None); a cache holding
        :attr:`MAX_ORIGINS` answers is emptied first. Both per-origin caches keep theirs so."""
        value = cache.get(key)
        if value is None:
            if len(cache) >= self.MAX_ORIGINS:
                cache.clear()
            value = cache[key] = compute()
        return value

    @staticmethod
    def _plain_host(url: Any) -> str | None:
        """The host of a URL whose netrc lookup may be kept: a str with no whitespace before
        its scheme, no credentials, and a host that parses. None: any other."""
        if not isinstance(url, str) or url[:1].isspace():
            return None
        try:
            parts = urlsplit(url)
            host = parts.hostname
        except ValueError:
            return None
        return host if host and "@" not in parts.netloc else None

    def merge_environment_settings(self, url: Any, proxies: Any, stream: Any, verify: Any,
                                   cert: Any) -> dict[str, Any]:
        if not self.trust_env:
            return super().merge_environment_settings(url, proxies, stream, verify, cert)
        parts = urlsplit(url)
        # the answer depends on the origin, the call's own settings and the session's own
        # (requests merges self.proxies/stream/verify/cert in too): all of them are the key
        key = (parts.scheme, parts.hostname, parts.port, _frozen(proxies), _frozen(stream),
               _frozen(verify), _frozen(cert), _frozen(self.proxies), _frozen(self.stream),
               _frozen(self.verify), _frozen(self.cert))
        settings = self._kept(self._environment, key, lambda: _copied(
            super(ProviderSession, self).merge_environment_settings(url, proxies, stream,
                                                                    verify, cert)))
        return _copied(settings)


def _no_auth(request: requests.PreparedRequest) -> requests.PreparedRequest:
    """The auth of a host the netrc file has no entry for: the request as it is."""
    return request


def _frozen(value: Any) -> Any:
    """A hashable snapshot of a requests setting (a dict of proxies, a cert list, a scalar)."""
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _frozen(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(_frozen(v) for v in value)
    return value


def _copied(settings: Mapping[str, Any]) -> dict[str, Any]:
    """A copy whose dicts and lists are the copy's own: neither the caller who passed them nor
    the caller who receives them can change what the cache holds."""
    return {name: dict(value) if isinstance(value, Mapping) else
            list(value) if isinstance(value, list) else value
            for name, value in settings.items()}


class HttpClient:
    """A thin wrapper over an injected ``requests.Session`` bound to one base URL."""

    def __init__(
        self,
        base_url: str,
        *,
        headers: Mapping[str, str] | None = None,
        session: requests.Session | None = None,
        connect_timeout: float = 5.0,
        read_timeout: float = 30.0,
        read_retries: int = 3,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
        max_body_bytes: int = MAX_BODY_BYTES,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.headers = dict(headers or {})
        self.session = session or ProviderSession()
        self.timeout = (connect_timeout, read_timeout)
        self.read_retries = read_retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.sleep = sleep
        self.max_body_bytes = max_body_bytes

    def url(self, path: str) -> str:
        if path.startswith(("http://", "https://")):
            return path
        return f"{self.base_url}/{path.lstrip('/')}"

    def _request(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        """One exchange under ONE total deadline (connect + read timeout), from connect to the
        last byte: the watchdog of :mod:`.deadline` shuts the socket when it passes, so a
        status line or headers trickled a line at a time cannot outlive it (issue 25 finding
        4). A ``stream=True`` caller gets the response once its headers are in and bounds the
        body itself.

        A redirect is never followed, by a create or a read: a 307/308 would re-send a (billed)
        request to another origin, and any 3xx would carry the provider's key header there
        (requests strips only ``Authorization``) and have the worker read whatever that origin
        answers (a metadata endpoint) as the task; the 3xx is the answer to classify."""
        kwargs.setdefault("allow_redirects", False)
        headers = {**self.headers, **kwargs.pop("headers", {})}
        timeout = kwargs.pop("timeout", self.timeout)
        streamed = kwargs.pop("stream", False)  # the caller bounds a streamed download itself
        url = self.url(path)
        total = _total_seconds(timeout)
        deadline = time.monotonic() + total
        prepare(self.session, url)
        with bounded(total):
            response = self.session.request(method, url, headers=headers, timeout=timeout,
                                            stream=True, **kwargs)
            if streamed:
                return response
            try:
                load_bounded(response, self.max_body_bytes, deadline)
            finally:
                response.close()  # the body is held (or refused): give the connection back
        return response

    def send_once(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        """One attempt, no retry. Transport errors propagate (``requests.RequestException``).
        A redirect is never followed (:meth:`_request`)."""
        return self._request(method, path, **kwargs)

    def read(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        """A read: retried on 429/5xx and transport errors; returns the last response (a 3xx
        is not followed: :meth:`_request`).

        Raises :class:`ReadFailed` when every attempt failed at the transport level.
        """
        attempt = 0
        while True:
            try:
                response = self._request(method, path, **kwargs)
            except requests.RequestException as exc:
                if attempt >= self.read_retries or isinstance(exc, BodyTooLarge):
                    raise ReadFailed(f"{method} {path}: {exc.__class__.__name__}: {exc}") from exc
                self.sleep(self._delay(attempt, None))
                attempt += 1
                continue
            if response.status_code not in RETRYABLE_STATUSES or attempt >= self.read_retries:
                return response
            if response.headers.get("x-should-retry", "").lower() == "false":
                return response
            self.sleep(self._delay(attempt, parse_retry_after(response.headers.get("Retry-After"))))
            attempt += 1

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, self.max_backoff)
        delay: float = self.backoff * (2**attempt)
        return min(delay, self.max_backoff)


def json_or_none(response: requests.Response) -> Any:
    """The response's JSON, or None when the body is not JSON."""
    try:
        return response.json()
    except ValueError:
        return None


def header(response: requests.Response, *names: str) -> str | None:
    """The first present header among ``names`` (e.g. the provider's request id)."""
    for name in names:
        value = response.headers.get(name)
        if value:
            return value
    return None


# --- pure helpers for the parse functions (bodies and headers as plain values) -------------


def body_json(body: str | bytes | None) -> Any:
    """A body's JSON, or None when it is empty or not JSON (never raises)."""
    if body is None or body == b"" or body == "":
        return None
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        return None


def body_text(body: str | bytes | None) -> str | None:
    """A body as text (undecodable bytes replaced)."""
    if isinstance(body, bytes):
        return body.decode("utf-8", errors="replace")
    return body


def header_value(headers: Mapping[str, str] | None, *names: str) -> str | None:
    """The first present header among ``names``, matched case-insensitively (plain dicts in
    tests and requests' CaseInsensitiveDict both reach the parsers)."""
    if not headers:
        return None
    lowered = {str(k).lower(): v for k, v in headers.items()}
    for name in names:
        value = lowered.get(name.lower())
        if value:
            return str(value)
    return None


# -- request plumbing every provider client shares ------------------------------------------


def provider_http(
    base_url: str,
    auth: Mapping[str, str],
    settings: Settings,
    session: requests.Session | None,
    *,
    read_timeout: float | None = None,
    read_retries: int = 3,
    sleep: Callable[[float], None] = time.sleep,
) -> HttpClient:
    """The :class:`HttpClient` of one provider API: its base URL and auth headers, the
    settings' connect timeout and (unless given) read timeout."""
    return HttpClient(
        base_url,
        headers=auth,
        session=session,
        connect_timeout=settings.connect_timeout,
        read_timeout=settings.read_timeout if read_timeout is None else read_timeout,
        read_retries=read_retries,
        sleep=sleep,
    )


def send_create(
    http: HttpClient,
    to_error: Callable[..., ProviderError],
    method: str,
    path: str,
    **kwargs: Any,
) -> requests.Response:
    """Send a create once; a transport failure (sent or not, we cannot know) is the provider's
    ``to_error("create", exc=…)``: uncertain, never resubmitted."""
    try:
        return http.send_once(method, path, **kwargs)
    except requests.RequestException as exc:
        raise to_error("create", exc=exc) from exc


def cancel_once(http: HttpClient, method: str, path: str) -> bool:
    """A best-effort cancel: True only for a 2xx; a transport error is "not confirmed"."""
    try:
        response = http.send_once(method, path)
    except requests.RequestException:
        return False
    return 200 <= response.status_code < 300


def _chat_body(model: str, input: Mapping[str, Any], **defaults: Any) -> dict[str, Any]:
    """A chat call's JSON body from a job's input: ``stream`` dropped (a sync call reads one
    JSON body), ``model`` set, ``defaults`` filled in where absent, and ``prompt`` (a
    convenience) turned into one user message unless ``messages`` is given."""
    body: dict[str, Any] = {k: v for k, v in input.items() if k not in ("prompt", "stream")}
    body["model"] = model
    for key, value in defaults.items():
        body.setdefault(key, value)
    if "messages" not in body and isinstance(input.get("prompt"), str):
        body["messages"] = [{"role": "user", "content": input["prompt"]}]
    return body
