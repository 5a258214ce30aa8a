"""The operator console (``reconcile.console``) over HTTP against real PostgreSQL: with no hook
every page answers 403; a read-only operator sees no form and a forged POST writes nothing; a
POST without the CSRF token (or with another operator's) is refused; every action is refused or
allowed exactly as the same ``reconcile`` command, over every job state; the lists page with
keysets; customer strings are escaped; the anomaly an action answers is closed."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from starlette.testclient import TestClient

from reconcile import jobstore, operator
from reconcile.console import OperatorIdentity, create_app
from reconcile.db.models import (
    CreditAnomaly,
    CreditBalance,
    Job,
    OperatorAction,
    UsageLog,
    WebhookDelivery,
)
from reconcile.ops import queries
from reconcile.testing.simulator import Simulator
from tests.integration._sweep_helpers import World
from tests.integration.test_cli import cli_with
from tests.integration.test_settle_owed import library_failed, platform_failed_row

ALICE = OperatorIdentity("alice@ops.test", can_read=True, can_act=True)
BOB = OperatorIdentity("bob@ops.test", can_read=True, can_act=False)
OPERATORS = {"alice": ALICE, "bob": BOB}


def by_cookie(request: Any) -> OperatorIdentity | None:
    """The tests' hook: the ``operator`` cookie names one of :data:`OPERATORS`."""
    return OPERATORS.get(request.cookies.get("operator", ""))


def client(w: World, who: str | None = "alice", **kw: Any) -> TestClient:
    c = TestClient(create_app(w.rt, **({"authorize": by_cookie} | kw)),
                   base_url="http://127.0.0.1")
    if who:
        c.cookies.set("operator", who)
    return c


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert found, "no CSRF field on the page"
    return found.group(1)


def outcome_of(html: str) -> str:
    found = re.search(r'data-outcome="([a-z-]+)"', html)
    assert found, html[:2000]
    return found.group(1)


def uncertain_fal(w: World, upstream: str = "req-1") -> uuid.UUID:
    """An uncertain fal job (its create's answer lost) with a stored delivery naming it."""
    job_id = w.submit("fal-queue")
    w.set(job_id, submission_state="uncertain", provider_call_started_at=w.clock.now)
    with w.db.begin() as s:
        s.add(WebhookDelivery(provider="fal", delivery_id=f"d-{job_id}", job_id=job_id,
                              upstream_id=upstream, received_at=w.clock.now, payload_digest="x",
                              status="OK", payload={"request_id": upstream}))
    return job_id


def records(w: World) -> list[OperatorAction]:
    with w.db() as s:
        return list(s.execute(select(OperatorAction)).scalars())


@pytest.fixture
def world(db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> World:
    with db.begin() as s:  # the operator record is not among conftest's truncated tables
        s.execute(OperatorAction.__table__.delete())
    return World(db, simulator, tmp_path)


# ----------------------------------------------------------------------------- security


PAGES = ["/", "/lists/uncertain", "/lists/anomalies", f"/jobs/{uuid.uuid4()}",
         f"/users/{uuid.uuid4()}", "/audit", "/audit?run=full", "/health", "/static/console.css",
         "/no-such-page", "/login?token=x"]


def test_with_no_hook_every_page_answers_403_and_says_how_to_configure(world: World) -> None:
    job_id = world.submit("kie-standard")
    c = client(world, "alice", authorize=None)
    for path in [*PAGES, f"/jobs/{job_id}"]:
        r = c.get(path)
        assert r.status_code == 403, path
        assert "RECONCILE_CONSOLE_AUTH" in r.text and "OperatorIdentity" in r.text, path
        assert r.headers["content-security-policy"].startswith("default-src 'none'")
    r = c.post(f"/jobs/{job_id}/fail", data={"reason": "x", "csrf": "0" * 64})
    assert r.status_code == 403 and world.job(job_id).status == "pending"
    assert records(world) == []


def test_a_request_the_hook_does_not_vouch_for_is_refused(world: World) -> None:
    def broken(request: Any) -> OperatorIdentity:
        raise RuntimeError("the platform's session store is down")

    for c in (client(world, None), client(world, "mallory"),
              client(world, "alice", authorize=broken),
              client(world, "alice", authorize=lambda r: OperatorIdentity("x", can_read=False))):
        for path in PAGES:
            assert c.get(path).status_code == 403, path


def test_an_async_hook_is_awaited(world: World) -> None:
    async def authorize(request: Any) -> OperatorIdentity:
        return ALICE

    assert client(world, None, authorize=authorize).get("/").status_code == 200


def test_a_read_only_operator_sees_no_form_and_a_forged_post_writes_nothing(world: World) -> None:
    job_id = uncertain_fal(world)
    bob = client(world, "bob")
    page = bob.get(f"/jobs/{job_id}")
    assert page.status_code == 200 and "read only" in page.text
    assert "<form method=\"post\"" not in page.text and 'id="actions"' not in page.text
    # a forged POST with a token made for bob's own cookie: refused for lack of permission
    token = csrf_of(client(world, "alice").get(f"/jobs/{job_id}").text)
    for action in operator.ACTIONS:
        r = bob.post(f"/jobs/{job_id}/{action}", data={"csrf": token, "reason": "forged",
                                                       "upstream_id": "req-1"})
        assert r.status_code == 403 and "may read the console but not act" in r.text
    job = world.job(job_id)
    assert (job.status, job.submission_state, job.provider_task_id) == ("pending", "uncertain",
                                                                       None)
    assert records(world) == [] and world.log_status(job_id) == "reserved"


def test_a_post_without_a_matching_csrf_token_is_refused(world: World) -> None:
    job_id = world.submit("kie-standard")
    alice = client(world, "alice")
    page = alice.get(f"/jobs/{job_id}")
    cookie = page.cookies.get("reconcile_console_csrf") or alice.cookies.get(
        "reconcile_console_csrf")
    set_cookie = page.headers["set-cookie"].lower()
    assert "samesite=strict" in set_cookie and "httponly" in set_cookie and cookie
    token = csrf_of(page.text)
    url = f"/jobs/{job_id}/fail"
    refused = [
        alice.post(url, data={"reason": "no token"}),
        alice.post(url, data={"reason": "bad token", "csrf": "f" * 64}),
        alice.post(url, content=f"csrf={token}&reason=json", headers={
            "content-type": "text/plain"}),
        alice.post(url, data={"reason": "other site", "csrf": token},
                   headers={"origin": "https://evil.example"}),
    ]
    # the same token from a browser without the cookie it was made for
    stranger = client(world, "alice")
    refused.append(stranger.post(url, data={"reason": "stolen token", "csrf": token}))
    # a token made for bob's name does not pass for alice
    bob_token = world_token(alice, cookie, "bob")
    refused.append(alice.post(url, data={"reason": "bob's token", "csrf": bob_token}))
    for r in refused:
        assert r.status_code == 403, r.text[:500]
    assert world.job(job_id).status == "pending" and records(world) == []
    done = alice.post(url, data={"reason": "provider lost it", "csrf": token})
    assert done.status_code == 200 and outcome_of(done.text) == "done"
    assert world.job(job_id).status == "failed"
    (row,) = records(world)
    assert (row.operator, row.via, row.action, row.reason) == (
        "alice@ops.test", "console", "fail", "provider lost it")


def world_token(c: TestClient, cookie: str, name: str) -> str:
    return c.app.state.console.csrf.token(cookie, name)  # type: ignore[attr-defined]


# ----------------------------------------------------------------------------- parity


def _orphan(w: World) -> uuid.UUID:
    """A reservation whose job row was deleted."""
    job_id = w.submit("kie-standard")
    with w.db.begin() as s:
        s.execute(Job.__table__.delete().where(Job.id == job_id))
    return job_id


def _uncertain_kie(w: World) -> uuid.UUID:
    job_id = w.submit("kie-standard")
    w.set(job_id, submission_state="uncertain", provider_call_started_at=w.clock.now)
    return job_id


STATES: dict[str, Callable[[World], uuid.UUID]] = {
    "pending_not_started": lambda w: w.submit("kie-standard"),
    "processing_accepted": lambda w: _set(w, w.submit("kie-standard"), status="processing",
                                          submission_state="accepted", provider_task_id="t-1"),
    "submitting_live_claim": lambda w: _set(w, w.submit("kie-standard"),
                                            submission_state="submitting", claim_token="c",
                                            claim_expires_at=w.clock.now + timedelta(minutes=5)),
    "submitting_claim_gone": lambda w: _set(w, w.submit("kie-standard"),
                                            submission_state="submitting", claim_token="c",
                                            claim_expires_at=w.clock.now - timedelta(minutes=5)),
    "uncertain": _uncertain_kie,
    "uncertain_sync_kind": lambda w: _set(w, w.submit("anthropic-sync", job_type="llm"),
                                          submission_state="uncertain"),
    "completed": lambda w: _set(w, w.submit("kie-standard"), status="completed",
                                submission_state="accepted", credits_actual=40),
    "failed_settlement_pending": library_failed,
    "failed_settled": lambda w: _failed_settled(w),
    "platform_failed_row": platform_failed_row,
    "platform_call_in_flight": lambda w: w.platform_row(provider_call_started_at=w.clock.now),
    "orphaned_reservation": _orphan,
    "no_such_job": lambda w: uuid.uuid4(),
}


def _set(w: World, job_id: uuid.UUID, **values: Any) -> uuid.UUID:
    w.set(job_id, **values)
    return job_id


def _failed_settled(w: World) -> uuid.UUID:
    job_id = library_failed(w)
    operator.run(w.rt, operator.RETRY_SETTLE, job_id, operator=operator.Operator("setup"),
                 reason="setup")
    return job_id


CLI_ARGS = {
    operator.FAIL: lambda j: ["fail", str(j)],
    operator.RESOLVE_UPSTREAM: lambda j: ["resolve", str(j), "--upstream-id", f"up-{j}"],
    operator.RESOLVE_NOT_SUBMITTED: lambda j: ["resolve", str(j), "--not-submitted"],
    operator.RETRY_SETTLE: lambda j: ["retry-settle", str(j)],
    operator.RELEASE_ORPHAN: lambda j: ["credits", "release-orphan", str(j)],
}
EXIT = {"done": 0, "nothing": 0, "refused": 2, "lost": 1}


def _after(w: World, job_id: uuid.UUID) -> tuple[Any, ...]:
    with w.db() as s:
        job = s.get(Job, job_id)
        held = s.execute(select(UsageLog.status).where(UsageLog.job_id == job_id)).scalars().all()
    row = (job.status, job.submission_state, job.credits_actual is None) if job else None
    return row, tuple(held), w.refunds(job_id)


@pytest.mark.parametrize("state", sorted(STATES))
def test_the_console_refuses_and_allows_every_action_exactly_as_the_cli(
        world: World, state: str) -> None:
    """Each action on two jobs in the same state: one through the CLI, one through the
    console's form. Same answer (done / nothing to do / refused / lost ↔ exit 0 / 0 / 2 / 1),
    the same state after, and the form is offered exactly when ``operator.allowed`` says."""
    alice = client(world, "alice")
    for action in operator.ACTIONS:
        by_cli, by_console = STATES[state](world), STATES[state](world)
        said = cli_with(world.rt, *CLI_ARGS[action](by_cli), "--reason", "parity")
        page = alice.get(f"/jobs/{by_console}")
        allowed = operator.allowed(world.rt, by_console)
        if page.status_code == 200:
            assert (f'id="form-{action}"' in page.text) == (action in allowed), (state, action)
            token = csrf_of(page.text) if allowed else None
        else:  # nothing names the job: no page, no form
            assert page.status_code == 404 and state == "no_such_job"
            token = None
        token = token or world_token(alice, alice.cookies.get("reconcile_console_csrf")
                                     or _prime(alice), ALICE.name)
        r = alice.post(f"/jobs/{by_console}/{action}",
                       data={"csrf": token, "reason": "parity", "upstream_id": f"up-{by_console}"})
        got = outcome_of(r.text)
        assert EXIT[got] == said.exit_code, (state, action, got, said.output)
        assert r.status_code == (200 if got in ("done", "nothing") else 409)
        assert _after(world, by_cli) == _after(world, by_console), (state, action)
        if got == "done":
            assert action in allowed or (action == operator.FAIL and state == "failed_settled")


def _prime(c: TestClient) -> str:
    c.get("/")
    return c.cookies["reconcile_console_csrf"]


# ----------------------------------------------------------------------------- pages


def test_customer_and_provider_strings_are_escaped(world: World) -> None:
    job_id = uncertain_fal(world, upstream="<img src=x onerror=alert(1)>")
    evil = "<script>alert(1)</script>\x1b[2J\u202egnp.exe\x07"
    world.set(job_id, error_message=evil, reconcile_last_error=evil)
    page = client(world).get(f"/jobs/{job_id}").text
    assert "<script>alert(1)" not in page and "<img src=x" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page
    assert "\x1b" not in page and "\u202e" not in page and "\x07" not in page
    assert "\\x1b[2J" in page and "\\u202e" in page


def test_resolving_in_the_console_closes_the_anomaly_it_answers(world: World) -> None:
    job_id = uncertain_fal(world)
    with world.db.begin() as s:
        jobstore.record_anomaly(s, job_id=job_id, user_id=world.user,
                                kind="uncertain_unresolved", detail={}, now=world.clock.now)
        jobstore.record_anomaly(s, job_id=job_id, user_id=world.user, kind="task_id_conflict",
                                detail={}, now=world.clock.now)
    alice = client(world)
    home = alice.get("/").text
    assert f"/jobs/{job_id}" in home and "uncertain_unresolved" in home
    token = csrf_of(alice.get(f"/jobs/{job_id}").text)
    r = alice.post(f"/jobs/{job_id}/resolve_upstream",
                   data={"csrf": token, "reason": "the stored webhook", "upstream_id": "req-1"})
    assert outcome_of(r.text) == "done", r.text
    with world.db() as s:
        states = dict(s.execute(select(CreditAnomaly.kind, CreditAnomaly.resolved_by)
                                .where(CreditAnomaly.job_id == job_id)).all())
    assert states == {"uncertain_unresolved": "alice@ops.test via console",
                      "task_id_conflict": None}
    story = alice.get(f"/jobs/{job_id}").text
    assert "resolved" in story and "resolve_upstream" in story
    assert "uncertain_unresolved" not in alice.get("/lists/anomalies").text


def test_the_lists_filter_and_page_with_keysets(world: World) -> None:
    other = uuid.uuid4()
    mine = [_uncertain_kie(world) for _ in range(5)]
    theirs = _uncertain_kie(world)
    with world.db.begin() as s:
        s.execute(Job.__table__.update().where(Job.id == theirs).values(user_id=other))
    for i, job_id in enumerate(mine):
        world.set(job_id, created_at=world.clock.now - timedelta(minutes=10 + i))
    seen: list[uuid.UUID] = []
    after = None
    with world.db() as s:
        while True:
            page = queries.uncertain(world.rt, s, now=world.clock.now, limit=2, after=after,
                                     filters=queries.Filters(user=world.user))
            seen += [r["id"] for r in page.rows]
            after = page.next
            if after is None:
                break
        assert seen == list(reversed(mine))  # oldest first, each once, only this user's
        older = queries.uncertain(world.rt, s, now=world.clock.now, limit=50,
                                  filters=queries.Filters(older_than=timedelta(minutes=12)))
        assert {r["id"] for r in older.rows} == set(mine[3:])
        fal = queries.uncertain(world.rt, s, now=world.clock.now, limit=50,
                                filters=queries.Filters(kind="fal-queue"))
        assert fal.rows == []
    alice = client(world)
    first = alice.get(f"/lists/uncertain?user={world.user}")
    assert first.status_code == 200
    assert alice.get("/lists/uncertain?after=garbage").status_code == 400
    assert alice.get("/?kind=no-such-kind").status_code == 400
    assert alice.get("/?older_than=-3").status_code == 400


def test_the_user_audit_and_health_pages(world: World) -> None:
    job_id = library_failed(world)
    alice = client(world)
    user = alice.get(f"/users/{world.user}").text
    assert 'id="identity-state">holds' in user and f"job-usage:{job_id}" in user
    clean = alice.get("/audit?run=full").text
    assert 'id="audit-state">' in clean
    with world.db.begin() as s:  # break a balance: the audit names the user, linked
        s.execute(CreditBalance.__table__.update().where(CreditBalance.user_id == world.user)
                  .values(sub=1))
    found = alice.get("/audit?run=full").text
    assert "balance_mismatch" in found and f"/users/{world.user}" in found
    assert "does not hold" in alice.get(f"/users/{world.user}").text
    since = alice.get("/audit?run=since&since=1h")
    assert since.status_code == 200 and "balance_mismatch" in since.text
    assert alice.get("/audit?run=since&since=soon").status_code == 400
    health = alice.get("/health")
    assert health.status_code == 200 and health.text.count("<svg") == 2
    assert "<script" not in health.text
    assert "no sweep tick stored yet" in health.text


def test_health_shows_the_sweeps_last_ticks_and_their_decisions(world: World) -> None:
    """Each real tick is stored with its counts and its decisions by row, action and outcome;
    a dry run is not; the page shows the newest first, and a week-old tick is dropped."""

    from reconcile.db.models import SweepTick

    job_id = library_failed(world)  # its refund is due: the tick settles it
    world.clock.advance(minutes=5)
    from reconcile import sweep

    sweep.sweep(world.rt, dry_run=True)
    report = world.tick()
    assert report.failed == 1 and world.job(job_id).credits_actual == 0
    with world.db() as s:
        (tick,) = s.query(SweepTick).all()
    assert (tick.scanned, tick.failed, tick.errors) == (1, 1, 0)
    assert tick.decisions == {"unsettled settle settled": 1}
    page = client(world).get("/health").text
    assert 'id="ticks"' in page and "unsettled settle settled ×1" in page
    world.clock.advance(days=8)
    world.tick()
    with world.db() as s:
        assert [t.scanned for t in s.query(SweepTick).all()] == [0]  # the old one dropped


def test_dev_login_takes_its_token_once(world: World) -> None:
    from reconcile.console._auth import DevLogin

    login = DevLogin("tester")
    token = login.token
    c = TestClient(create_app(world.rt, dev=login), base_url="http://127.0.0.1")
    assert c.get("/").status_code == 403
    assert c.get("/login?token=wrong").status_code == 403
    r = c.get(f"/login?token={token}", follow_redirects=False)
    assert r.status_code == 303 and "samesite=strict" in r.headers["set-cookie"].lower()
    assert c.get("/").status_code == 200
    other = TestClient(create_app(world.rt, dev=login), base_url="http://127.0.0.1")
    assert other.get(f"/login?token={token}").status_code == 403  # used once
    assert other.get("/").status_code == 403


def test_the_cli_serves_it_and_dev_is_loopback_only(db: sessionmaker[Session]) -> None:
    """``reconcile console --dev``: a real server on loopback that prints a one-time URL; the
    URL logs in once; --dev refuses any other address."""
    import subprocess
    import sys

    import httpx

    from reconcile.testing.processes import free_port
    from tests.integration.test_cli import cli, url_of

    refused = cli(db, "console", "--dev", "--host", "0.0.0.0")
    assert refused.exit_code == 2 and "loopback only" in refused.stderr
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "reconcile", "--database-url", url_of(db),
                             "console", "--dev", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(4)]
        (login,) = [ln.strip() for ln in lines if "/login?token=" in ln]
        assert login.startswith(f"http://127.0.0.1:{port}/login?token="), lines
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as c:
            for _ in range(100):  # until uvicorn listens
                try:
                    assert c.get("/").status_code == 403  # no session yet
                    break
                except httpx.TransportError:
                    time.sleep(0.1)
            assert c.get(login).status_code == 303  # to /, with the session cookie
            assert "console --dev" in c.get("/").text
        with httpx.Client() as other:
            assert other.get(login).status_code == 403  # the token worked once
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def test_the_hook_setting_names_a_callable() -> None:
    from reconcile.console import load_authorizer

    assert load_authorizer("tests.integration.test_console:by_cookie") is by_cookie
    for bad in ("", "tests.integration.test_console", ":by_cookie",
                "tests.integration.test_console:nope", "tests.integration.test_console:OPERATORS"):
        with pytest.raises(ValueError):
            load_authorizer(bad)


def test_mounted_under_a_path_links_stay_under_it(world: World) -> None:
    from starlette.applications import Starlette
    from starlette.routing import Mount

    job_id = uncertain_fal(world)
    app = Starlette(routes=[Mount("/ops", app=create_app(world.rt, authorize=by_cookie))])
    c = TestClient(app, base_url="http://127.0.0.1")
    c.cookies.set("operator", "alice")
    home = c.get("/ops/")
    assert home.status_code == 200 and f'href="/ops/jobs/{job_id}"' in home.text
    assert 'href="/ops/static/console.css"' in home.text
    story = c.get(f"/ops/jobs/{job_id}").text
    assert f'action="/ops/jobs/{job_id}/resolve_upstream"' in story
    assert c.get("/ops/static/console.css").status_code == 200



def test_stuck_and_past_horizon_narrow_in_sql_exactly_as_the_rules_decide(world: World) -> None:
    """The lists' SQL narrowing (``horizon.past_threshold_sql``, ``may_be_past_deadline_sql``)
    never drops a row the rules keep: over a spread of kinds, ages, attempts, last attempts,
    claims and states, each list equals the rule applied to every in-flight row in Python."""
    import itertools

    from reconcile.jobstore.horizon import exhaustion_deadline

    now = world.clock.now
    kinds = ["kie-standard", "fal-queue", "anthropic-sync", None, "gone-kind"]
    ages = [timedelta(minutes=m) for m in (1, 7, 25, 70, 130, 300)]
    for n, (kind, age, attempts, state) in enumerate(itertools.product(
            kinds, ages, (0, 6, 18, 25), ("accepted", "uncertain", None))):
        world.platform_row(
            status="processing", provider_kind=kind, submission_state=state,
            provider_task_id=f"t-{n}", created_at=now - age, provider_call_started_at=now - age,
            reconcile_attempts=attempts,
            reconcile_last_attempt_at=(now - age / 3) if n % 3 == 0 else None,
            claim_expires_at=(now + timedelta(minutes=n % 20 - 10)) if n % 2 else None)
    with world.db() as s:
        every = list(s.execute(select(Job).where(jobstore.in_flight())).scalars())
        horizon = {j.id for j in every
                   if (d := exhaustion_deadline(world.rt.settings, j)) is not None and d < now}
        stuck = {j.id for j in every
                 if now - (j.provider_call_started_at or j.created_at)
                 >= queries.threshold(world.rt, j)}

        def listed(read: Any) -> set[uuid.UUID]:
            got, after = [], None
            while True:
                page = read(world.rt, s, now=now, limit=7, after=after)
                got += [r["id"] for r in page.rows]
                if page.next is None:
                    return set(got) if len(got) == len(set(got)) else set()
                after = page.next

        assert horizon and stuck and horizon != stuck
        missing = horizon - listed(queries.past_horizon)
        assert not missing, [(j.provider_kind, j.submission_state, j.reconcile_attempts,
                              now - j.created_at, j.reconcile_last_attempt_at,
                              j.claim_expires_at, exhaustion_deadline(world.rt.settings, j))
                             for j in every if j.id in missing]
        assert listed(queries.past_horizon) == horizon
        assert listed(queries.stuck) == stuck
