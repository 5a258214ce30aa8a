"""Issue 25: one redaction function used by every sink (:func:`reconcile.core.redact.text` /
:func:`~reconcile.core.redact.value`), against a corpus of credential shapes: SigV4 headers and
query strings, ``x-amz-security-token`` lines of a canonical request, ``?password=``, bearer
tokens, each provider's key header, and the configured secrets' values themselves. The sinks
(log records, stored errors and anomalies, CLI output) are checked to go through it."""

from __future__ import annotations

import json
import logging
import uuid

import click
import pytest
from click.testing import CliRunner

from reconcile import Settings
from reconcile.core import redact
from reconcile.errors import ProviderError
from reconcile.ops.output import _cell, _dump

AKID = "AKIAIOSFODNN7EXAMPLE"
TOKEN = "FwoGZXIvYXdzEJr//////////wEaDEXAMPLEtoken=="
SIG = "d947200399e4d7a1d10147c4905b0c53e4a3d7d1f1f8cbc1f5c1cd08fbd6ad9e"

# (text, the secret parts it holds, a part that must stay)
CORPUS = [
    # SigV4 Authorization header: as a header line, in a headers dict's repr, in JSON
    (f"Authorization: AWS4-HMAC-SHA256 Credential={AKID}/20261202/us-east-1/s3/aws4_request, "
     f"SignedHeaders=host;x-amz-date;x-amz-security-token, Signature={SIG}", [AKID, SIG],
     "Authorization: AWS4-HMAC-SHA256"),
    (f"headers={{'X-Amz-Date': b'20261202T032924Z', 'X-Amz-Security-Token': b'{TOKEN}', "
     f"'Authorization': b'AWS4-HMAC-SHA256 Credential={AKID}/20261202/us-east-1/s3/aws4_request, "
     f"SignedHeaders=host, Signature={SIG}'}}", [TOKEN, AKID, SIG], "'X-Amz-Date': b'20261202T032924Z'"),
    (json.dumps({"authorization": f"AWS4-HMAC-SHA256 Credential={AKID}/x, Signature={SIG}"}),
     [AKID, SIG], '"authorization"'),
    # SigV4 fields on their own and botocore's computed-signature record
    (f"Credential={AKID}/20261202/us-east-1/s3/aws4_request, Signature={SIG}", [AKID, SIG],
     "Credential="),
    (f"Signature:\n{SIG}", [SIG], "Signature:"),
    # canonical request header lines
    (f"PUT\n/bucket/key\n\nhost:127.0.0.1:9000\nx-amz-date:20261202T032924Z\n"
     f"x-amz-security-token:{TOKEN}\n\nhost;x-amz-date;x-amz-security-token\nUNSIGNED-PAYLOAD",
     [TOKEN], "x-amz-date:20261202T032924Z"),
    # SigV4 / SigV2 / GCS query strings
    (f"https://b.s3.amazonaws.com/k.png?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential={AKID}"
     f"%2F20261202%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Date=20261202T000000Z&X-Amz-Expires=3600"
     f"&X-Amz-Security-Token={TOKEN}&X-Amz-SignedHeaders=host&X-Amz-Signature={SIG}",
     [AKID, TOKEN, SIG], "X-Amz-Expires=3600"),
    (f"http://127.0.0.1:9000/b/k?AWSAccessKeyId={AKID}&Signature=1vdPkq%2Bx%3D&Expires=17",
     [AKID, "1vdPkq"], "Expires=17"),
    ("https://storage.googleapis.com/b/o?X-Goog-Credential=svc%40p.iam&X-Goog-Signature=abcdef12",
     ["svc%40p.iam", "abcdef12"], "storage.googleapis.com"),
    # passwords
    ("postgresql+psycopg://app@db:5432/app?sslmode=require&password=qs3cret", ["qs3cret"],
     "sslmode=require"),
    ("connect failed: host=db user=app password=kvsecret dbname=app", ["kvsecret"], "dbname=app"),
    ("redis://:hunter2hunter2@127.0.0.1:6379/0", ["hunter2hunter2"], "127.0.0.1:6379/0"),
    ("amqp://guest:guestpw@127.0.0.1:5672//", ["guestpw"], "amqp://guest:"),
    # bearer tokens and each provider's key header
    ("Authorization: Bearer kie_0123456789abcdef", ["kie_0123456789abcdef"], "Bearer"),  # KIE
    ("'Authorization': 'Bearer r8_Ab12Cd34Ef56Gh78'", ["r8_Ab12Cd34Ef56Gh78"], "Bearer"),  # Replicate
    ("xi-api-key: sk_5f2e1d0c9b8a7f6e5d4c", ["sk_5f2e1d0c9b8a7f6e5d4c"], "xi-api-key"),  # ElevenLabs
    ("Authorization: Key 1a2b3c4d-key-id:9f8e7d6c5b4a", ["1a2b3c4d-key-id", "9f8e7d6c5b4a"], "Key"),  # fal
    ('{"x-api-key": "sk-ant-api03-abcdefghijkl", "anthropic-version": "2023-06-01"}',
     ["sk-ant-api03-abcdefghijkl"], "2023-06-01"),  # Anthropic
    ("calling with bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig then", ["eyJhbGciOiJIUzI1NiJ9"],
     "then"),
    (f"aws_secret_access_key={'wJalrXUtnFEMI/K7MDENG'} aws_session_token={TOKEN}",
     ["wJalrXUtnFEMI", TOKEN], "aws_secret_access_key="),
    (f"creds {AKID} in prose", [AKID], "in prose"),
    # a provider body quoting a request (escaped JSON), a presigned URL inside another URL
    ('{"detail": "{\\"x-api-key\\": \\"sk-ant-api03-zyxwvut\\", \\"n\\": 1}"}',
     ["sk-ant-api03-zyxwvut"], "detail"),
    (f"https://proxy.example/fetch?url=https%3A%2F%2Fb.s3.amazonaws.com%2Fk%3FX-Amz-Signature%3D"
     f"{SIG}%26X-Amz-Security-Token%3DFwoG%252Fabc%26X-Amz-Expires%3D60", [SIG, "FwoG%252Fabc"],
     "X-Amz-Expires%3D60"),
]


@pytest.mark.parametrize(("text", "secrets", "kept"), CORPUS, ids=range(len(CORPUS)))
def test_every_credential_shape_is_redacted(text: str, secrets: list[str], kept: str) -> None:
    clean = redact.text(text)
    for secret in secrets:
        assert secret not in clean, (secret, clean)
    assert redact.REDACTED in clean
    assert kept in clean  # what is not a credential stays readable
    assert redact.text(clean) == clean  # idempotent


@pytest.mark.parametrize("plain", [
    "provider said: rate limited, retry later",
    "a Bearer token is required",
    "task 7f3c is running (42%)",
    "https://cdn.example.com/out/0.png?width=512&height=512",
    "Signature verification failed",
    "password is too short",
])
def test_plain_text_is_left_alone(plain: str) -> None:
    assert redact.text(plain) == plain


def test_configured_secrets_values_are_redacted_wherever_they_appear() -> None:
    key = f"fal-{uuid.uuid4().hex}"
    hmac_key = f"kie-hmac-{uuid.uuid4().hex}"
    Settings(fal_api_key=key, kie_webhook_hmac_key=hmac_key, anthropic_api_key="short")
    clean = redact.text(f"echoed {key} and {hmac_key}; short stays")
    assert key not in clean and hmac_key not in clean and "short stays" in clean


def test_value_redacts_every_string_of_a_nested_value() -> None:
    stored = redact.value({"error": f"Authorization: Bearer {TOKEN}", "urls": [
        f"https://b/k?X-Amz-Signature={SIG}"], "n": 3, f"x-amz-security-token:{TOKEN}": None})
    assert TOKEN not in json.dumps(stored) and SIG not in json.dumps(stored)
    assert stored["n"] == 3


def test_the_sinks_go_through_the_one_function(caplog: pytest.LogCaptureFixture) -> None:
    """A log record of any logger (formatted with its args), a stored error message and the
    ``reconcile`` command's cells and ``--json`` all use :func:`redact.text`."""
    with caplog.at_level(logging.DEBUG, logger="botocore.auth"):
        logging.getLogger("botocore.auth").debug("CanonicalRequest:\n%s", f"x-amz-security-token:{TOKEN}")
    assert TOKEN not in caplog.text and TOKEN not in caplog.records[-1].getMessage()
    try:
        raise ValueError(f"boto said x-amz-security-token:{TOKEN}")
    except ValueError:
        logging.getLogger("thirdparty").warning("failed %s", "put", exc_info=True, stack_info=True)
    assert TOKEN not in caplog.text and "failed put" in caplog.text
    error = ProviderError(f"upstream said Authorization: Bearer {TOKEN}")
    assert TOKEN not in str(error) and TOKEN not in error.message
    assert TOKEN not in _cell(f"x-amz-security-token:{TOKEN}")
    assert TOKEN not in _cell({"detail": [f"https://b/k?X-Amz-Security-Token={TOKEN}"]})
    runner = CliRunner()
    printed = runner.invoke(click.command()(lambda: _dump({"e": f"Bearer {TOKEN}"}))).output
    assert "Bearer REDACTED" in printed and TOKEN not in printed
