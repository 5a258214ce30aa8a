"""A customer-facing provider message leaking addresses/signatures.

``for_customer`` is what the snapshot shows for UPSTREAM_FAILED / UPSTREAM_INVALID_INPUT
(``api.customer_message``). Each case below leaked on main before the fix.
"""
from __future__ import annotations

import pytest

from reconcile.api import customer_message
from reconcile.core.redact import for_customer


@pytest.mark.parametrize(("message", "secret"), [
    ("connect to fd00::1 refused", "fd00::1"),  # compressed IPv6 was not matched at all
    ("connect to ::1 refused", "::1"),
    ("no route to fe80::1%eth0", "fe80::1"),
    ("metadata at [fd00:ec2::254]:80 answered", "254"),  # partial scrub left the tail
    ("peer 2001:db8::dead:beef reset", "dead:beef"),
    ("bad image_url https%3A%2F%2F10.1.2.3%2Fa.png", "10.1.2.3"),  # URL-encoded: no \b
    ("resolved ip_10.2.3.4", "10.2.3.4"),
    ("cannot fetch s3.amazonaws.com/b/k.png?X-Amz-Signature=SECRETSIG", "SECRETSIG"),
])
def test_reproducer_for_customer_leaks(message: str, secret: str) -> None:
    """reproducer: the scrubbed provider message must not keep the address or signature."""
    assert secret not in for_customer(message)
    shown = customer_message("UPSTREAM_FAILED", {"provider_message": message}, None)
    assert secret not in shown and shown.startswith("The provider failed")


@pytest.mark.parametrize("message", [
    "prompt must be at most 1000 characters",
    "width must be one of 512, 768",
    "unsupported version 1.2.3",
])
def test_for_customer_keeps_plain_text(message: str) -> None:
    assert for_customer(message) == message
