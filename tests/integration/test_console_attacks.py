"""The operator console attacked: a hostile customer's and provider's strings and volumes, a
malicious page in the operator's browser, malformed query strings and forms, and two operators
racing — each answer a 4xx page with the security headers (never a 500, never a redirect past the
hook), and the money and the operator record stay right."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker
from starlette.testclient import TestClient

from reconcile.console import create_app
from reconcile.console._auth import DevLogin
from reconcile.db.models import OperatorAction
from reconcile.testing.simulator import Simulator
from tests.integration.test_console import by_cookie, csrf_of, records
from tests.integration.test_sweep import World


@pytest.fixture
def world(db: sessionmaker[Session], simulator: Simulator, tmp_path: Any) -> World:
    with db.begin() as s:  # the operator record is not among conftest's truncated tables
        s.execute(OperatorAction.__table__.delete())
    return World(db, simulator, tmp_path)


def client(w: World, who: str | None = "alice", **kw: Any) -> TestClient:
    """A browser (server errors answered as the app answers them, not raised)."""
    c = TestClient(create_app(w.rt, **({"authorize": by_cookie} | kw)),
                   base_url="http://127.0.0.1", raise_server_exceptions=False,
                   follow_redirects=False)
    if who:
        c.cookies.set("operator", who)
    return c


def secured(r: Any) -> bool:
    return (r.headers.get("content-security-policy", "").startswith("default-src 'none'")
            and r.headers.get("x-frame-options") == "DENY")


FORM = {"content-type": "application/x-www-form-urlencoded"}


# ----------------------------------------------------------------------------- tokens


def test_a_csrf_or_dev_token_that_is_not_ascii_is_refused_not_a_500(world: World) -> None:
    """``hmac.compare_digest`` raises TypeError on non-ASCII text: a form (or a cookie, or the
    --dev login link) carrying ``é`` or an undecodable byte was a 500 without the headers."""
    job_id = world.submit("kie-standard")
    alice = client(world)
    token = csrf_of(alice.get(f"/jobs/{job_id}").text)
    for body in ("csrf=%C3%A9&reason=x", "csrf=%FF&reason=x"):
        r = alice.post(f"/jobs/{job_id}/fail", content=body, headers=FORM)
        assert r.status_code == 403 and secured(r), body
    r = alice.post(f"/jobs/{job_id}/fail", content=f"csrf={token}&reason=x",
                   headers={**FORM, "cookie": "operator=alice; reconcile_console_csrf=\u00e9".encode(
                       "latin-1")})
    assert r.status_code == 403 and secured(r)
    dev = client(world, None, authorize=None, dev=DevLogin("t"))
    r = dev.get("/login?token=%C3%A9")
    assert r.status_code == 403 and secured(r)
    assert world.job(job_id).status == "pending" and records(world) == []


# ----------------------------------------------------------------------------- the hook


ODD = ["/audit/", "/lists/stuck/", "/static/console.css/", "/audit//", "//audit", "/jobs/x/",
       "/%2e%2e/audit", "/jobs/../audit", "/login/"]


def test_with_no_hook_an_odd_path_answers_403_never_a_redirect(world: World) -> None:
    """Starlette's router answered a trailing slash with a 307 to a URL built from the Host
    header — before the hook ran, without the security headers."""
    job_id = world.submit("kie-standard")
    c = client(world, "alice", authorize=None)
    for method in ("GET", "HEAD", "POST", "OPTIONS"):
        for path in [*ODD, f"/jobs/{job_id}/", f"/jobs/{job_id}/fail/"]:
            r = c.request(method, path, headers={"host": "evil.example"})
            assert r.status_code == 403 and secured(r), (method, path, r.status_code,
                                                         r.headers.get("location"))
            assert "location" not in r.headers
    assert world.job(job_id).status == "pending" and records(world) == []
