"""Issue 25: the one redaction home (:mod:`reconcile.core.redact`) against a corpus of shapes —
database credentials in every form libpq and SQLAlchemy accept (finding 6), text for an
operator's terminal (finding 8), and the ElevenLabs binding each event type reads (finding 1's
suspected item)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from click.testing import CliRunner

from reconcile.cli import main
from reconcile.core import redact
from reconcile.providers.elevenlabs.webhook import signed_job_id, verify_elevenlabs
from reconcile.testing import sim_signing

SECRET = "s3cr%t"
# (database URL or DSN, the secret parts it holds)
CORPUS = [
    ("postgresql+psycopg://app:s3cret@db:5432/app", ["s3cret"]),
    ("postgresql://app:p@ss/w?rd@db/app", ["p@ss", "w?rd"]),
    ("postgresql://:onlypw@db/app", ["onlypw"]),
    ("postgresql://app:pw1@h1:5432,h2:5433/app?target_session_attrs=any", ["pw1"]),
    ("postgresql+psycopg://app@db/app?password=qs3cret", ["qs3cret"]),
    ("postgresql+psycopg://app@db/app?sslmode=require&password=qs3cret&connect_timeout=5",
     ["qs3cret"]),
    ("postgresql://app@db/app?sslpassword=keypw&sslkey=/k.pem", ["keypw"]),
    ("postgresql://app@db/app?PASSWORD=upper", ["upper"]),
    ("postgresql://app@db/app?pass%77ord=encodedkey", ["encodedkey"]),
    ("postgresql://app@db/app?password=p%40ss%26word", ["p%40ss%26word"]),
    ("postgresql://app@db/app?password=a=b=c#frag", ["a=b=c"]),
    ("postgresql:///app?host=/var/run/postgresql&password=sockpw", ["sockpw"]),
    ("mysql+pymysql://u@h/db?passwd=mysqlpw", ["mysqlpw"]),
    ("mssql+pyodbc://u@dsn?pwd=odbcpw", ["odbcpw"]),
    ("postgresql://u:pw2@h/db?password=pw3&sslpassword=pw4", ["pw2", "pw3", "pw4"]),
    ("host=db user=app password=kvsecret dbname=app", ["kvsecret"]),
    ("host=db password = 'with space\\' quote' dbname=app", ["with space", "quote"]),
    ("password=first host=db sslpassword=second", ["first", "second"]),
    ("host=db password='unterminated secret", ["unterminated", "secret"]),
    ("dbname=app options='-c x=y://z' password=afterurl", ["afterurl"]),
    ("  postgresql://app:leading@db/app", ["leading"]),
]


@pytest.mark.parametrize(("url", "secrets"), CORPUS, ids=[c[0][:40] for c in CORPUS])
def test_every_credential_form_is_masked(url: str, secrets: list[str]) -> None:
    shown = redact.database_url(url)
    for secret in secrets:
        assert secret not in shown, (url, shown)
    assert "***" in shown


@pytest.mark.parametrize("url", [
    "postgresql+psycopg://app@db:5432/app?sslmode=require&application_name=worker",
    "sqlite:///reconcile.db",
    "host=db user=app dbname=app sslmode=verify-full",
    "postgresql://app@db/app?application_name=a@b",
])
def test_what_holds_no_credential_is_shown_unchanged(url: str) -> None:
    assert redact.database_url(url) == url


@pytest.mark.parametrize("url", [
    "postgresql+psycopg://postgres@127.0.0.1:1/none?password=clisecret",
    "host=127.0.0.1 port=1 user=postgres password=clisecret dbname=none",
])
def test_the_cli_database_line_masks_a_query_or_dsn_password(url: str) -> None:
    """Finding 6: every command's ``database: …`` line masked only ``user:pw@``."""
    result = CliRunner().invoke(main, ["--database-url", url, "unsettled"])
    first = result.stderr.splitlines()[0]
    assert first.startswith("database: ") and "password=***" in first, first
    assert "clisecret" not in result.output


@pytest.mark.parametrize(("text", "shown"), [
    ("plain model/name:v1 é 漢字", "plain model/name:v1 é 漢字"),
    ("m\x1b]0;title\x07", "m\\x1b]0;title\\x07"),
    ("x\x1b]52;c;ZXZpbA==\x1b\\", "x\\x1b]52;c;ZXZpbA==\\x1b\\"),
    ("a\x9b31mb", "a\\x9b31mb"),
    ("rtl\u202eevil\u2066", "rtl\\u202eevil\\u2066"),
    ("line\nforged\rover\u2028", "line\\nforged\\rover\\u2028"),
    ("del\x7f", "del\\x7f"),
])
def test_for_terminal_escapes_what_a_terminal_acts_on(text: str, shown: str) -> None:
    assert redact.for_terminal(text) == shown
    assert redact.printable(shown) and redact.printable(text) == (text == shown)


# ----------------------------------------------------------------------------- finding 1, suspected


def _dubbing_event(data: dict[str, object]) -> tuple[dict[str, str], bytes]:
    body = json.dumps({"type": "dubbing", "event_timestamp": 1, "data": data}).encode()
    ts = int(datetime.now(UTC).timestamp())
    return sim_signing.elevenlabs_headers("whsec", body, ts), body


def test_a_dubbing_event_binds_by_its_name_never_by_an_echoed_webhook_metadata() -> None:
    """Suspected item of finding 1, confirmed: a customer's ``webhook_metadata`` passed through
    on a dubbing create, and had ElevenLabs echoed it, the verifier read it before ``name``. A
    dubbing event now binds by ``name`` only (and submit refuses the field)."""
    data = {"dubbing_id": "dub-1", "name": "reconcile-job:own-job", "status": "dubbed",
            "webhook_metadata": {"job_id": "victim-job"}}
    headers, body = _dubbing_event(data)
    event = verify_elevenlabs(headers, body, {}, "whsec", datetime.now(UTC))
    assert event.planted_job_id == "own-job"
    assert signed_job_id(json.loads(body)) == "own-job"
    unnamed = {**data, "name": "my film"}
    assert signed_job_id({"type": "dubbing", "data": unnamed}) is None


def test_a_speech_to_text_event_binds_by_webhook_metadata_never_by_a_name() -> None:
    payload = {"type": "speech_to_text_transcription", "data": {
        "request_id": "r", "webhook_metadata": {"job_id": "stt-job"},
        "name": "reconcile-job:victim-job", "transcription": {"text": "x"}}}
    assert signed_job_id(payload) == "stt-job"
