"""Hostile input at every entry, as a customer, a hostile provider and a network would try it. Each test here failed on the code it was written against.

* (held, pinned) a verified webhook nested deeper than the NUL/NaN scrub's recursion reaches is
  a 400, never a 500;
* a ``Content-Length`` that ``str.isdigit`` accepts but ``int`` does not (``²``), or one of
  thousands of digits, is a 400/413 from :class:`~reconcile.webhook_ingest.CappedBody`, never a
  ``ValueError`` (a 500) out of the library's ingestion helper;
* the total deadline covers name resolution and every address a name resolves to: a slow DNS
  answer, or a name resolving to many addresses that never answer the SYN, cannot hold an
  exchange (or a media fetch) past its documented total (no address outside 127.0.0.1 is ever
  contacted: the resolver is replaced);
* a media host's ``Content-Length`` of thousands of digits is MediaTooLarge, not a ValueError;
* no provider read follows a redirect (it carried the key header to another origin);
* a provider's task id or a customer's idempotency key PostgreSQL cannot hold (NUL, unpaired
  surrogate) is refused (uncertain / 400), never an exception; a poll answer holding one fails the
  job (``redact.text``, the one stored-text function, writes them as U+FFFD);
* no adoption (an operator's ``resolve --upstream-id`` included) takes an upstream id another
  job holds, and ``reconcile show`` never calls such a delivery adoptable.
"""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from reconcile.db.models import WebhookDelivery
from reconcile.errors import ReadFailed
from reconcile.providers.http import HttpClient, ProviderSession
from reconcile.testing import sim_signing
from reconcile.testing.simulator import Script, Simulator
from reconcile.webhook_ingest import BodyRefused, handle_webhook, read_capped
from tests.integration._sweep_helpers import FOREVER, World
from tests.unit.test_media_ssrf import read_head

# ----------------------------------------------------------------------------- webhooks


@pytest.mark.parametrize("depth", [400, 600, 900])
def test_a_verified_webhook_nested_deeply_is_a_400_never_a_500(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path, depth: int) -> None:
    """Held: a signed Replicate delivery whose ``logs`` nest ``depth`` objects deep (json.loads
    takes 900; the NUL/NaN scrub, two frames a level, would not) is refused by the schemes'
    64-level bound before the scrub runs."""
    w = World(db, simulator, tmp_path)
    job_id = w.accept("replicate-prediction", Script(timeline=FOREVER))
    task_id = w.task_id(job_id)
    nested = '{"a":' * depth + "NaN" + "}" * depth
    body = ('{"id": "' + task_id + '", "status": "processing", "logs": ' + nested + "}").encode()
    headers = sim_signing.replicate_headers(simulator.secrets.replicate_webhook_secret, body,
                                            f"msg_{uuid.uuid4().hex}", sim_signing.now_seconds())
    status, answer = handle_webhook(w.rt, "replicate", headers, body, {"job_id": str(job_id)})
    assert status == 400 and answer["error"]["code"] == "WEBHOOK_INVALID", (status, answer)
    with db() as s:  # refused as bad input (the provider sees it): nothing half-stored
        assert s.execute(select(WebhookDelivery).where(
            WebhookDelivery.upstream_id == task_id)).first() is None


@pytest.mark.parametrize("declared", ["\u00b2", "\u00b9\u2070", "1" * 5000, "\u0663"])
def test_a_content_length_only_str_isdigit_accepts_is_refused_not_a_crash(declared: str) -> None:
    with pytest.raises(BodyRefused) as refused:
        read_capped([b"hello"], {"Content-Length": declared}, 10)
    assert refused.value.response[0] in (400, 413)


# ----------------------------------------------------------------------------- deadline


class _Answering:
    """127.0.0.1: answers every request at once with ``{}``."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                try:
                    conn.recv(65536)
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
                except OSError:
                    pass


@pytest.fixture
def answering() -> Iterator[_Answering]:
    server = _Answering()
    yield server
    server.sock.close()


def _client(host: str, port: int) -> HttpClient:
    # connect 1 s + read 1 s: a documented total of 2 s
    return HttpClient(f"http://{host}:{port}", connect_timeout=1.0, read_timeout=1.0,
                      read_retries=0, session=ProviderSession())


def test_slow_name_resolution_is_inside_the_total_deadline(
        answering: _Answering, monkeypatch: pytest.MonkeyPatch) -> None:
    """The provider's DNS answers after 4 s (the name resolves to 127.0.0.1): before the fix
    the 2 s exchange took the whole 4 s — the watchdog shuts sockets, and there is none yet."""
    real = socket.getaddrinfo

    def slow(host: str, port: object, *args: object, **kwargs: object) -> object:
        if host == "slow-dns.invalid":
            time.sleep(4)
            host = "127.0.0.1"
        return real(host, port, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "getaddrinfo", slow)
    started = time.monotonic()
    with pytest.raises(ReadFailed, match="deadline"):
        _client("slow-dns.invalid", answering.port).read("GET", "/v1/task")
    assert time.monotonic() - started < 3.0
    # a name that resolves in time still works
    assert _client("127.0.0.1", answering.port).read("GET", "/v1/task").json() == {}


def test_a_name_resolving_to_many_silent_addresses_is_inside_the_total_deadline(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Six addresses whose SYN is never answered (a listening socket with a full accept queue
    on 127.0.0.1): each connect waited its own 1 s connect timeout, 6 s for a 2 s total."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(0)
    port = silent.getsockname()[1]
    fillers = []
    for _ in range(4):  # fill the accept queue: later SYNs are dropped
        filler = socket.socket()
        filler.setblocking(False)
        try:
            filler.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        fillers.append(filler)
    time.sleep(0.2)
    real = socket.getaddrinfo

    def many(host: str, *args: object, **kwargs: object) -> object:
        if host == "many.invalid":
            return real("127.0.0.1", port, socket.AF_INET, socket.SOCK_STREAM) * 6
        return real(host, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "getaddrinfo", many)
    started = time.monotonic()
    try:
        with pytest.raises(ReadFailed):
            _client("many.invalid", port).read("GET", "/v1/task")
        assert time.monotonic() - started < 3.0
    finally:
        for filler in fillers:
            filler.close()
        silent.close()


def test_a_media_fetchs_slow_name_resolution_is_inside_its_timeout(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The media fetch resolves the host itself (the SSRF guard pins the address) before its
    hop's deadline starts: a resolver answering after 4 s held a 1 s fetch for 4 s."""
    from reconcile.errors import MediaFetchFailed
    from reconcile.media.fetch import safe_fetch

    def slow(host: str, port: int, **kwargs: object) -> list[tuple[object, ...]]:
        time.sleep(4)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]

    started = time.monotonic()
    with pytest.raises(MediaFetchFailed, match="resolve"):
        safe_fetch("https://cdn.invalid/a.png", max_bytes=10, timeout=1.0, resolver=slow)
    assert time.monotonic() - started < 2.0


def test_a_media_hosts_content_length_of_thousands_of_digits_is_too_large_not_a_crash() -> None:
    """A hostile media host declares a 5000-digit ``Content-Length``: ``int()`` raised
    ValueError out of safe_fetch (not a MediaError the store step handles)."""
    from reconcile.errors import MediaTooLarge
    from reconcile.media.fetch import safe_fetch

    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: " + b"1" * 5000
                         + b"\r\nConnection: close\r\n\r\nhello")

    threading.Thread(target=serve, daemon=True).start()
    try:
        with pytest.raises(MediaTooLarge):
            safe_fetch(f"http://127.0.0.1:{port}/a.png", allowed_hosts=["127.0.0.1:*"],
                       max_bytes=100, timeout=5.0)
    finally:
        server.close()


# ----------------------------------------------------------------------------- redirects


class _Recorder:
    """127.0.0.1: answers ``{}`` and records each request's head (the redirect's target)."""

    def __init__(self, answer: bytes = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}") -> None:
        self.answer = answer
        self.heads: list[bytes] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                try:
                    self.heads.append(read_head(conn))
                    conn.sendall(self.answer)
                except OSError:
                    pass


@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_a_providers_read_never_follows_a_redirect_to_another_origin(status: int) -> None:
    """A hostile (or hijacked) provider answers a poll with a redirect to another origin: the
    read followed it with the provider's key header (requests strips only ``Authorization``;
    ElevenLabs' ``xi-api-key`` went along), and the target's answer was parsed as the task —
    an SSRF into the worker's network (a metadata endpoint) whose body lands in the job's error.
    A create (``send_once``) already refused redirects; a read now does too: the 3xx is the
    answer to classify."""
    target = _Recorder()
    provider = _Recorder(f"HTTP/1.1 {status} Moved\r\nLocation: http://127.0.0.1:{target.port}"
                         f"/latest/meta-data/\r\nContent-Length: 0\r\n\r\n".encode())
    try:
        client = HttpClient(f"http://127.0.0.1:{provider.port}", headers={"xi-api-key": "xi-secret"},
                            connect_timeout=1.0, read_timeout=1.0, read_retries=0,
                            session=ProviderSession())
        response = client.read("GET", "/v1/dubbing/dub1")
        assert response.status_code == status
        assert target.heads == [], target.heads
    finally:
        provider.sock.close()
        target.sock.close()


# ----------------------------------------------------------------------------- poll answers


@pytest.mark.parametrize("text", ["bad\x00msg", "bad\ud800msg"])
def test_a_poll_answer_with_a_nul_or_lone_surrogate_fails_the_job_never_a_crash(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    """A hostile provider's poll says failed with a NUL (or an unpaired surrogate) in its
    message, status and code: PostgreSQL's text and jsonb refuse both, so saving the failure
    raised DataError out of every poll and the job could never settle (its credits held). The
    webhook path already stores them as U+FFFD; the poll path now does the same."""
    from reconcile import lifecycle
    from reconcile.providers import PollResult, PollStatus

    w = World(db, simulator, tmp_path)
    job_id = w.accept("replicate-prediction", Script(timeline=FOREVER))
    kind = w.rt.kind("replicate-prediction")
    client = w.rt.client(kind)  # type: ignore[arg-type]
    hostile = PollResult(PollStatus.FAILED, raw_status=f"failed{text}", error_code=f"E{text}",
                         error_message=text, request_id=f"req{text}")
    monkeypatch.setattr(client, "poll", lambda *a, **k: hostile)
    job = w.job(job_id)
    assert lifecycle.observe(w.rt, job, kind, via="poll",  # type: ignore[arg-type]
                             result=hostile) == "failed"
    failed = w.job(job_id)
    assert failed.status == "failed" and "\x00" not in (failed.error_message or "")
    assert w.refunds(job_id) > 0


@pytest.mark.parametrize("task_id", ["pred\ud800x", "\udfff"])
def test_a_created_task_id_with_a_lone_surrogate_is_uncertain_not_an_error_loop(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, task_id: str) -> None:
    """A hostile provider accepts the create and answers an id holding an unpaired surrogate
    (valid JSON: ``"\\ud800"``). ``usable_task_id`` refused only NUL; PostgreSQL's text cannot
    hold the surrogate either (psycopg cannot encode it), so saving the id raised out of the
    create step. Now the id is unusable: the job is uncertain, as for a NUL."""
    from reconcile import lifecycle
    from reconcile.providers import Created

    w = World(db, simulator, tmp_path)
    job_id = w.submit("replicate-prediction")
    client = w.rt.client(w.rt.kind("replicate-prediction"))  # type: ignore[arg-type]
    monkeypatch.setattr(client, "create", lambda request: Created(task_id=task_id))
    assert lifecycle.create_step(w.rt, job_id).action == "uncertain"
    job = w.job(job_id)
    assert (job.submission_state, job.provider_task_id) == ("uncertain", None)


# ----------------------------------------------------------------------------- submit


@pytest.mark.parametrize("key", ["key\x00", "key\ud800"])
def test_an_idempotency_key_postgresql_cannot_hold_is_a_400_and_writes_nothing(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path, key: str) -> None:
    """``api.submit`` checked the key's length only: a NUL or an unpaired surrogate (from a
    JSON body field, or a framework that hands headers as text) reached the idempotency row's
    INSERT and answered 500 INTERNAL after the ledger's reservation was attempted."""
    from reconcile import api

    w = World(db, simulator, tmp_path)
    before = _written_rows(db)
    status, body = api.submit(w.rt, w.user, "kie-standard", "seedream/4.5-edit", {"prompt": "cat"},
                              40, job_type="image", inline=True, idempotency_key=key)
    assert status == 400 and body["error"]["code"] == "INVALID_PARAM", (status, body)
    assert body["error"]["param"] == "idempotency_key"
    assert _written_rows(db) == before


def _written_rows(db: sessionmaker[Session]) -> tuple[int, ...]:
    from sqlalchemy import func

    from reconcile.db.models import CreditTransaction, Job, UsageLog

    with db() as s:
        return tuple(s.execute(select(func.count()).select_from(model)).scalar_one()
                     for model in (Job, UsageLog, CreditTransaction))


# ----------------------------------------------------------------------------- evidence


def test_an_operator_cannot_adopt_an_upstream_id_another_job_holds(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """The rule "an upstream id another job holds is that job's" (evidence.held_elsewhere) was
    applied by the sweep only: ``reconcile resolve --upstream-id`` — the path the documentation
    (README, Security model) sends an operator down for a delivery the sweep will not adopt, and ``reconcile show`` calls such
    a delivery "adoptable (signed)" — adopted the other job's task. Two jobs then poll one task
    and both are charged for one output (the attacker's dubbing of finding 1, stored before the
    fix, adopted by hand). adopt_upstream_id, the one door of every adoption, now refuses it."""
    from click.testing import CliRunner

    from reconcile.cli import main

    w = World(db, simulator, tmp_path)
    victim = w.submit("replicate-prediction", 300)
    simulator.script(str(victim), Script(timeline=FOREVER, create="server_error"))
    from reconcile import lifecycle

    assert lifecycle.create_step(w.rt, victim).action == "uncertain"
    other = w.accept("replicate-prediction", Script(timeline=FOREVER))
    held = w.task_id(other)

    result = CliRunner().invoke(main, ["resolve", str(victim), "--upstream-id", held], obj=w.rt)
    assert result.exit_code != 0, result.output
    assert str(other) in result.output
    job = w.job(victim)
    assert (job.submission_state, job.provider_task_id) == ("uncertain", None)
    # and the library door itself, whoever calls it
    assert not lifecycle.adopt_upstream_id(w.rt, victim, held, source="listing")
    assert w.job(victim).provider_task_id is None


def test_reconcile_show_never_calls_a_delivery_naming_another_jobs_task_adoptable(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """A signed delivery stored for the uncertain victim whose upstream id another job holds
    (finding 1's row, stored before the fix): ``reconcile show`` said "adoptable (signed)",
    sending the operator to adopt the other job's task; it now says whose task it is."""
    from click.testing import CliRunner

    from reconcile import lifecycle
    from reconcile.cli import main

    w = World(db, simulator, tmp_path)
    victim = w.submit("replicate-prediction", 300)
    simulator.script(str(victim), Script(timeline=FOREVER, create="server_error"))
    assert lifecycle.create_step(w.rt, victim).action == "uncertain"
    other = w.accept("replicate-prediction", Script(timeline=FOREVER))
    held = w.task_id(other)
    with db.begin() as s:
        s.add(WebhookDelivery(provider="replicate", delivery_id=f"msg_{uuid.uuid4().hex}",
                              upstream_id=held, job_id=victim, received_at=w.clock.now,
                              payload_digest="x" * 16, status="succeeded", payload={"id": held}))
    shown = CliRunner().invoke(main, ["show", str(victim)], obj=w.rt)
    assert shown.exit_code == 0, shown.output
    assert "adoptable" not in shown.stdout, shown.stdout
    assert f"never: the task of job {other}" in shown.stdout
