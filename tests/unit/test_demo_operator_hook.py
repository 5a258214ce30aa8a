"""The example platform's demo operator hook (``examples/platform/acme/ops.py``) vouches for a
named operator from loopback only — and only for a request addressed to a loopback name: a web
page that rebinds its own DNS name to 127.0.0.1 reaches the demo from the operator's own
browser (a loopback client), with any ``X-Operator`` header it likes."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from starlette.requests import Request

OPS = Path(__file__).resolve().parents[2] / "examples" / "platform" / "acme" / "ops.py"


def _ops() -> Any:
    spec = importlib.util.spec_from_file_location("acme_ops_under_test", OPS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _request(host: str, client: str = "127.0.0.1", path: str = "/ops/") -> Request:
    return Request({"type": "http", "method": "GET", "path": path, "query_string": b"as=ops@acme.test",
                    "headers": [(b"host", host.encode()), (b"x-operator", b"ops@acme.test")],
                    "client": (client, 50000), "scheme": "http", "server": ("127.0.0.1", 8000)})


def test_the_demo_hook_vouches_only_for_a_loopback_request_to_a_loopback_name() -> None:
    ops = _ops()
    for host in ("127.0.0.1:8000", "localhost:8000", "[::1]:8000", "localhost"):
        who = ops.authorize(_request(host))
        assert who is not None and who.can_act, host
    for host in ("evil.example:8000", "127.0.0.1.nip.io:8000", "", "localhost.evil.example"):
        assert ops.authorize(_request(host)) is None, host
        assert ops.login(_request(host, path="/ops-login")).status_code == 403, host
    assert ops.authorize(_request("127.0.0.1:8000", client="10.0.0.7")) is None
