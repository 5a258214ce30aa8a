"""The operator console attacked: a hostile customer's and provider's strings and volumes, a
malicious page in the operator's browser, malformed query strings and forms, and two operators
racing — each answer a 4xx page with the security headers (never a 500, never a redirect past the
hook), and the money and the operator record stay right."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker
from starlette.testclient import TestClient

from reconcile.console import create_app
from reconcile.console._auth import DevLogin
from reconcile.db.models import OperatorAction
from reconcile.testing.simulator import Simulator
from tests.integration._sweep_helpers import World
from tests.integration.test_console import by_cookie, csrf_of, records


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


def test_a_hook_whose_permissions_are_not_booleans_vouches_for_nobody(world: World) -> None:
    """``can_act="no"`` (a setting read as text, say) is truthy: the console let that operator
    act. A permission must be True or False; anything else fails closed, like a raising hook."""
    from reconcile.console import OperatorIdentity

    job_id = world.submit("kie-standard")
    for garbage in ("no", "false", 0, 1, None):
        c = client(world, None,
                   authorize=lambda r, g=garbage: OperatorIdentity("eve", True, g))
        assert c.get(f"/jobs/{job_id}").status_code == 403, garbage
        c.cookies.set("reconcile_console_csrf", "c")
        token = c.app.state.console.csrf.token("c", "eve")  # type: ignore[attr-defined]
        r = c.post(f"/jobs/{job_id}/fail", data={"csrf": token, "reason": "x"})
        assert r.status_code == 403 and secured(r), garbage
    with pytest.raises(ValueError):
        OperatorIdentity("eve", can_read="yes")  # type: ignore[arg-type]
    assert world.job(job_id).status == "pending" and records(world) == []


# ----------------------------------------------------------------------------- query strings


BAD_QUERIES = [
    "/?older_than=1e308", "/?older_than=inf", "/?older_than=-inf", "/?older_than=1e12",
    "/lists/stuck?older_than=99999999999", "/?anomaly=a%00b", "/lists/anomalies?anomaly=a%00b",
    "/lists/anomalies?anomaly=%1b%5b2J", "/lists/anomalies?after=99999999999999999999999",
    "/lists/anomalies?after=-99999999999999999999999", "/lists/anomalies?after=0",
    "/audit?run=full&grace_minutes=99999999999", "/audit?run=full&grace_minutes=-5",
    "/audit?run=since&since=99999999999d", "/audit?run=since&since=0001-01-01T00:00:00%2B14:00",
    "/audit?run=since&since=9999-12-31T23:59:59-14:00",
]


def test_malformed_filters_cursors_and_audit_params_answer_400_never_500(world: World) -> None:
    """Each of these was a 500 (OverflowError in a timedelta or a datetime, a NUL byte or an
    out-of-range bigint sent to PostgreSQL) without the security headers."""
    alice = client(world)
    for path in BAD_QUERIES:
        r = alice.get(path)
        assert r.status_code == 400 and secured(r), (path, r.status_code, r.text[:200])
        assert "Traceback" not in r.text
    # the CLI's --since is the same parser: a refusal (exit 2), not a traceback
    from tests.integration.test_cli import cli_with

    said = cli_with(world.rt, "audit", "--since", "99999999999d")
    assert said.exit_code == 2, said.output


def test_an_unexpected_error_answers_500_with_the_security_headers_and_no_detail(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    from reconcile.console import _pages

    def broken(rt: Any) -> Any:
        raise RuntimeError("secret-db-password in a traceback")

    monkeypatch.setattr(_pages, "health", broken)
    r = client(world).get("/health")
    assert r.status_code == 500 and secured(r)
    assert "secret-db-password" not in r.text and "Traceback" not in r.text


# ----------------------------------------------------------------------------- actions


def test_an_upstream_id_postgresql_cannot_store_is_refused_not_a_500(world: World) -> None:
    """The holder check sent the id to PostgreSQL first: a NUL in the form's upstream id was a
    500 (the CLI's argv cannot carry one; the console's form and ``operator.run`` can)."""
    from reconcile import operator
    from tests.integration.test_console import outcome_of, uncertain_fal

    job_id = uncertain_fal(world)
    alice = client(world)
    token = csrf_of(alice.get(f"/jobs/{job_id}").text)
    r = alice.post(f"/jobs/{job_id}/resolve_upstream",
                   data={"csrf": token, "reason": "the dashboard", "upstream_id": "req\x00-1"})
    assert r.status_code == 409 and outcome_of(r.text) == "refused" and secured(r)
    assert "upstream id" in r.text
    assert "cannot" in (operator.refusal(world.rt, operator.RESOLVE_UPSTREAM, job_id,
                                         upstream_id="\ud800") or "")
    job = world.job(job_id)
    assert (job.status, job.submission_state, job.provider_task_id) == ("pending", "uncertain",
                                                                       None)
    assert records(world) == []


def _run_all(calls: list[Any]) -> list[Any]:
    """Each call in its own thread (an operator's request); what each returned or raised."""
    import threading

    out: list[Any] = [None] * len(calls)

    def run(i: int) -> None:
        try:
            out[i] = calls[i]()
        except Exception as exc:
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


def test_two_operators_adopting_one_upstream_id_for_two_jobs_one_wins(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """The "another job holds this upstream id" rule was checked in each transaction and not
    serialised: two operators resolving two uncertain jobs with the same id (each check before
    the other's commit) both adopted it — two jobs polling one paid task, the user charged
    twice. Here the second operator's check runs while the first's transaction is open, after
    its own check; it must see the first's job (wait for it), not adopt."""
    import threading

    from sqlalchemy import select, text

    from reconcile import operator
    from reconcile.db.models import Job
    from reconcile.jobstore import evidence
    from tests.integration.test_console import uncertain_fal

    first, second = uncertain_fal(world, "u-1"), uncertain_fal(world, "u-2")
    checked, go = threading.Event(), threading.Event()
    real = evidence.held_elsewhere

    def held_elsewhere(session: Any, ids: Any, job_id: Any) -> set[str]:
        found = real(session, ids, job_id)
        if job_id == first:  # the first operator: checked, its transaction still open
            checked.set()
            go.wait(30)
        return found

    monkeypatch.setattr(evidence, "held_elsewhere", held_elsewhere)

    def act(job_id: Any, who: str) -> Any:
        return lambda: operator.run(world.rt, operator.RESOLVE_UPSTREAM, job_id,
                                    operator=operator.Operator(who, via="console"),
                                    reason="the dashboard", upstream_id="req-shared")

    results: list[Any] = []
    t1 = threading.Thread(target=lambda: results.extend(_run_all([act(first, "alice")])))
    t1.start()
    assert checked.wait(30)
    t2 = threading.Thread(target=lambda: results.extend(_run_all([act(second, "bob")])))
    t2.start()
    # the second runs until it is done (no lock) or waits on a lock the first holds
    with world.db() as s:
        while t2.is_alive() and not s.execute(text(
                "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database "
                "WHERE NOT l.granted AND d.datname = current_database()")).scalar_one():
            t2.join(0.02)
            s.rollback()
    go.set()
    t1.join(60)
    t2.join(60)
    done = [r for r in results if isinstance(r, operator.Done) and r.changed]
    assert len(done) == 1, results
    assert [type(r) for r in results if r not in done] == [operator.ActionLost], results
    with world.db() as s:
        holders = s.execute(select(Job.id).where(Job.provider_task_id == "req-shared")).all()
    assert holders == [(done[0].job_id,)]
    assert [r.job_id for r in records(world)] == [done[0].job_id]


# ----------------------------------------------------------------------------- volumes


def _statements(w: World) -> Any:
    """A counter of the SQL statements the test database runs while the block runs."""
    from contextlib import contextmanager

    from sqlalchemy import event

    @contextmanager
    def counting() -> Any:
        seen: list[str] = []
        engine = w.db.kw["bind"]

        def before(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
            seen.append(statement)

        event.listen(engine, "before_cursor_execute", before)
        try:
            yield seen
        finally:
            event.remove(engine, "before_cursor_execute", before)

    return counting()


def test_a_job_story_with_a_thousand_webhook_deliveries_stays_bounded(world: World) -> None:
    """Anyone with a fal account gets fal's signature on a webhook naming any job id; a hostile
    provider signs what it likes. The story listed every stored delivery twice and judged each
    with its own query (N+1): a thousand deliveries were a thousand queries and a megabyte page.
    It shows the newest ones, says how many there are, and its queries do not grow with them."""
    from sqlalchemy import text

    from tests.integration.test_console import uncertain_fal

    job_id = uncertain_fal(world, upstream="req-first")
    with world.db.begin() as s:
        s.execute(text(
            "INSERT INTO reconcile_webhook_deliveries (provider, delivery_id, upstream_id, job_id,"
            " received_at, payload_digest, status, payload) SELECT 'fal', 'flood-' || g,"
            " 'flood-' || g, :job, :at - g * interval '1 second', 'x', 'OK', '{}'"
            " FROM generate_series(1, 1000) AS g"), {"job": job_id, "at": world.clock.now})
    alice = client(world)
    with _statements(world) as seen:
        page = alice.get(f"/jobs/{job_id}")
    assert page.status_code == 200
    assert len(seen) < 40, len(seen)
    assert page.text.count('class="upstream-id"') <= 100
    assert "req-first" in page.text  # the newest delivery (the one that matters) is shown
    assert "1001 webhook deliveries" in page.text
    assert len(page.content) < 200_000


def test_a_job_story_with_ten_thousand_events_shows_the_newest_and_counts_the_rest(
        world: World) -> None:
    """The story read the job's first 500 events and said nothing of the others: with more, the
    operator never saw the newest (what the job did last)."""
    from sqlalchemy import text

    job_id = world.submit("kie-standard")
    with world.db.begin() as s:
        s.execute(text(
            "INSERT INTO reconcile_job_events (event_id, job_id, user_id, type, payload,"
            " created_at, published_at) SELECT gen_random_uuid()::text, :job, :user,"
            " CASE WHEN g = 10000 THEN 'the_newest' ELSE 'progress' END, '{}',"
            " :at + g * interval '1 millisecond', :at FROM generate_series(1, 10000) AS g"),
            {"job": job_id, "user": world.user, "at": world.clock.now})
    with _statements(world) as seen:
        page = client(world).get(f"/jobs/{job_id}")
    assert page.status_code == 200 and len(seen) < 40
    assert "event the_newest" in page.text
    assert page.text.count("event progress") <= 500
    assert "9501 earlier events not shown" in page.text


def test_health_counts_every_refund_and_completion_of_the_day(world: World) -> None:
    """The health page read at most 20,000 refund rows (in no order) and 5,000 completions, and
    reported what it read as the day's totals: a busy day's refunds per hour were an arbitrary
    part of them, and "5000 jobs completed"."""
    from sqlalchemy import text

    with world.db.begin() as s:
        s.execute(text(
            "INSERT INTO reconcile_credit_transactions (id, user_id, job_id, type, amount,"
            " from_sub, from_topup, created_at) SELECT 'refund-' || g, :user, gen_random_uuid(),"
            " 'REFUND', 2, 2, 0, :at - (g % 3000) * interval '1 second'"
            " FROM generate_series(1, 20500) AS g"), {"user": world.user, "at": world.clock.now})
        s.execute(text(
            "INSERT INTO jobs (id, user_id, job_type, status, progress, created_at, started_at,"
            " provider_call_started_at, completed_at) SELECT gen_random_uuid(), :user, 'image',"
            " 'completed', 100, :at - interval '1 hour', :at - interval '1 hour',"
            " :at - interval '1 hour', :at - (g % 600) * interval '1 second'"
            " FROM generate_series(1, 5200) AS g"), {"user": world.user, "at": world.clock.now})
    page = client(world).get("/health")
    assert page.status_code == 200
    assert "20500 refunds, 41000 credits, in the last 24 hours" in page.text
    assert "5200 jobs completed in the last 24 hours" in page.text


# ----------------------------------------------------------------------------- parity


def _uncertain_with_its_id_held(w: World) -> uuid.UUID:
    """An uncertain job whose upstream id (the one the parity test offers: ``up-{job}``) is
    already another job's task."""
    from tests.integration.test_console import _uncertain_kie

    job_id = _uncertain_kie(w)
    holder = w.submit("kie-standard")
    w.set(holder, status="processing", submission_state="accepted",
          provider_task_id=f"up-{job_id}")
    return job_id


def _cancelled_settlement_pending(w: World) -> uuid.UUID:
    from reconcile import jobstore

    job_id = w.submit("kie-standard")
    with w.db.begin() as s:
        assert jobstore.mark_failed(s, job_id, now=w.clock.now, code="CANCELED",
                                    message="cancelled", detail=None,
                                    status="cancelled") is not None
    return job_id


def _at_now(w: World) -> Any:
    return w.clock.now


MORE_STATES: dict[str, Any] = {
    "uncertain_unknown_kind": lambda w: _set(w, w.submit("kie-standard"),
                                             provider_kind="gone-kind",
                                             submission_state="uncertain",
                                             provider_call_started_at=_at_now(w)),
    "uncertain_upstream_held_elsewhere": _uncertain_with_its_id_held,
    "platform_row_with_task_id": lambda w: w.platform_row(provider_task_id="t-plat",
                                                          provider_call_started_at=_at_now(w)),
    "platform_pending_never_called": lambda w: w.platform_row(status="pending"),
    "processing_sync_kind": lambda w: _set(w, w.submit("anthropic-sync", job_type="llm"),
                                           status="processing", submission_state="accepted",
                                           provider_call_started_at=_at_now(w)),
    "cancelled_settlement_pending": _cancelled_settlement_pending,
    "submitting_live_claim_unknown_kind": lambda w: _set(
        w, w.submit("kie-standard"), provider_kind="gone-kind", submission_state="submitting",
        claim_token="c", claim_expires_at=_at_now(w) + timedelta(minutes=5)),
}


def _set(w: World, job_id: uuid.UUID, **values: Any) -> uuid.UUID:
    w.set(job_id, **values)
    return job_id


@pytest.mark.parametrize("state", sorted(MORE_STATES))
def test_the_console_and_the_cli_agree_on_states_the_parity_test_did_not_cover(
        world: World, state: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The parity test's own body (every action, CLI vs form, same answer and same state
    after) over rows it did not build: unknown kinds, a sync kind in flight, platform rows with
    and without a task id, an upstream id another job holds, a cancelled job owed its refund."""
    from tests.integration import test_console

    monkeypatch.setitem(test_console.STATES, state, MORE_STATES[state])
    test_console.test_the_console_refuses_and_allows_every_action_exactly_as_the_cli(
        world, state)


# ----------------------------------------------------------------------------- the record


def test_the_operator_log_exports_the_newest_actions(world: World) -> None:
    """``operator.records`` took the *first* ``limit`` rows: once the record held more than 200
    actions, ``reconcile operator-log`` (and a story's record) never showed the newest."""
    import json

    from sqlalchemy import text

    from tests.integration.test_cli import cli_with

    with world.db.begin() as s:
        s.execute(text(
            "INSERT INTO reconcile_operator_actions (created_at, operator, via, action, job_id,"
            " reason) SELECT :at - (300 - g) * interval '1 minute', 'op-' || g, 'cli', 'fail',"
            " gen_random_uuid(), 'r' FROM generate_series(1, 300) AS g"), {"at": world.clock.now})
    said = cli_with(world.rt, "operator-log", "--json")
    assert said.exit_code == 0, said.output
    rows = json.loads(said.stdout)
    assert len(rows) == 200 and rows[-1]["operator"] == "op-300"  # the newest, oldest first
    assert rows[0]["operator"] == "op-101" and rows == sorted(rows, key=lambda r: r["at"])


def test_racing_operators_refund_once_record_each_change_once_and_leave_the_audit_clean(
        world: World) -> None:
    """Pairs (and a trio) of operators acting on one job at the same moment: at most one
    refund per job, exactly one record per action that changed something, none for one that
    was refused or lost, and the ledger audit clean afterwards."""
    from reconcile import operator
    from reconcile.ledger import audit
    from tests.integration.test_console import _orphan, _uncertain_kie
    from tests.integration.test_settle_owed import library_failed

    def op(action: str, job_id: uuid.UUID, who: str, **kw: Any) -> Any:
        return lambda: operator.run(world.rt, action, job_id,
                                    operator=operator.Operator(who, via="console"),
                                    reason=f"{who}'s reason", **kw)

    races = [
        (_uncertain_kie, [("resolve_upstream", {"upstream_id": "req-a"}),
                          ("resolve_not_submitted", {})]),
        (_uncertain_kie, [("resolve_not_submitted", {}), ("resolve_not_submitted", {})]),
        (_uncertain_kie, [("resolve_upstream", {"upstream_id": "req-b"}),
                          ("resolve_upstream", {"upstream_id": "req-c"})]),
        (library_failed, [("retry_settle", {}), ("retry_settle", {}), ("fail", {})]),
        (lambda w: w.submit("kie-standard"), [("fail", {}), ("fail", {}), ("retry_settle", {})]),
        (_orphan, [("release_orphan", {}), ("release_orphan", {}), ("release_orphan", {})]),
    ]
    for build, actions in races:
        job_id = build(world)
        before = {r.id for r in records(world)}
        results = _run_all([op(a, job_id, f"op{i}", **kw) for i, (a, kw) in enumerate(actions)])
        changed = [r for r in results if isinstance(r, operator.Done) and r.changed]
        assert all(isinstance(r, operator.Done | operator.ActionLost | operator.ActionRefused)
                   for r in results), results
        assert world.refunds(job_id) <= 1, (actions, results)
        new = [r for r in records(world) if r.id not in before]
        assert sorted((r.action, r.operator) for r in new) == sorted(
            (d.action, f"op{results.index(d)}") for d in changed), (actions, results)
        if actions[0][0].startswith("resolve"):
            assert len(changed) == 1, (actions, results)
    with world.db() as s:
        assert audit(world.rt.ledger, s, now=world.clock.now, grace=timedelta(0),
                     settings=world.rt.settings, policy=world.rt.settlement_policy) == []
