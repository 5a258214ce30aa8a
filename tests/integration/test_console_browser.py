"""The operator console in a real headless Chromium (Debian's ``chromium`` and
``chromium-driver``, installed by ``scripts/services.sh``; Selenium pointed at them, so nothing
downloads a browser), served by uvicorn on 127.0.0.1 over real PostgreSQL data:

* an operator opens "needs attention", finds the uncertain job, reads its story, resolves it
  with the upstream id its stored webhook shows, and — once a worker has polled it — sees it
  complete;
* a second operator without the act permission sees no action button, and a forged POST is
  refused (403) with nothing written;
* a POST without the CSRF token is refused.

A missing browser fails the run (never a skip). Each page is saved as a PNG in
``$RECONCILE_CONSOLE_SCREENSHOTS`` (default ``build/console-screenshots``; the set in
``docs/console-screenshots/`` was made this way).
"""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from reconcile import jobstore, lifecycle
from reconcile.console import create_app
from reconcile.db.models import OperatorAction, WebhookDelivery
from reconcile.testing.simulator import Script, Simulator
from tests.integration._sweep_helpers import INSTANT, World
from tests.integration.harness import drain
from tests.integration.test_console import by_cookie

ROOT = Path(__file__).resolve().parents[2]
SHOTS = Path(os.environ.get("RECONCILE_CONSOLE_SCREENSHOTS") or ROOT / "build" /
             "console-screenshots")
CHROMEDRIVER = "/usr/bin/chromedriver"


def _browser_binary() -> str:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    pytest.fail("Chromium is required for the console's browser tests: run scripts/services.sh "
                "(apt: chromium chromium-driver)", pytrace=False)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary = _browser_binary()
    if not Path(CHROMEDRIVER).exists():
        pytest.fail(f"{CHROMEDRIVER} is required: run scripts/services.sh (apt: chromium-driver)",
                    pytrace=False)
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,1100", "--no-proxy-server", "--no-first-run",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--disable-default-apps", "--disable-extensions"):
        options.add_argument(arg)
    # the driver's and the browser's paths given: Selenium Manager is never asked (and offline)
    offline = os.environ.get("SE_OFFLINE")
    os.environ["SE_OFFLINE"] = "true"
    try:
        driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    finally:
        if offline is None:
            os.environ.pop("SE_OFFLINE", None)
        else:
            os.environ["SE_OFFLINE"] = offline
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


class Served:
    """The console app under uvicorn on a free loopback port, in a thread of this process."""

    def __init__(self, app: Any) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port,
                                                    log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.05)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture
def served(db: sessionmaker[Session], simulator: Simulator,
           tmp_path: Path) -> Iterator[tuple[World, Served]]:
    with db.begin() as s:
        s.execute(OperatorAction.__table__.delete())
    w = World(db, simulator, tmp_path)
    app = create_app(w.rt, authorize=by_cookie)
    server = Served(app)
    try:
        yield w, server
    finally:
        server.stop()


def login(driver: Any, base: str, who: str) -> None:
    """The tests' hook reads the ``operator`` cookie (the platform's session, in real life)."""
    driver.delete_all_cookies()
    driver.get(f"{base}/static/console.css")  # any page of the origin, to own its cookies
    driver.add_cookie({"name": "operator", "value": who, "path": "/"})


def shot(driver: Any, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    width = driver.execute_script("return document.documentElement.scrollWidth")
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(max(1400, width), min(max(900, height + 120), 6000))
    assert driver.save_screenshot(str(SHOTS / f"{name}.png"))
    driver.set_window_size(1400, 1100)


def uncertain_with_webhook(w: World) -> tuple[uuid.UUID, str]:
    """A fal job whose create the provider accepted but whose answer was lost (uncertain,
    reservation held), and the provider's webhook about it stored: what the operator sees."""
    job_id = w.submit("fal-queue", input={"prompt": "a lighthouse at dusk <b>bold</b>"})
    w.sim.script(str(job_id), Script(timeline=INSTANT, create="drop_after_accept"))
    assert lifecycle.create_step(w.rt, job_id).action == "uncertain"
    (task,) = w.sim.tasks_for(str(job_id))
    upstream = task.task_id
    with w.db.begin() as s:
        s.add(WebhookDelivery(provider="fal", delivery_id=f"d-{job_id}", job_id=job_id,
                              upstream_id=upstream, received_at=w.clock.now,
                              payload_digest="x", status="OK",
                              payload={"request_id": upstream, "status": "OK"}))
    return job_id, upstream


def outcome(driver: Any) -> Any:
    """The result page's outcome, once the form's POST has loaded it."""
    return loaded(driver, "outcome")


def loaded(driver: Any, element_id: str) -> Any:
    """The element ``element_id`` of the page a click navigates to, once that page has loaded
    (a click returns before the navigation: the old page has no such element)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, 30).until(
        expected_conditions.presence_of_element_located((By.ID, element_id)))


def _records(w: World) -> list[OperatorAction]:
    with w.db() as s:
        return list(s.execute(select(OperatorAction)).scalars())


def test_an_operator_resolves_an_uncertain_job_from_its_webhook_and_sees_it_complete(
        browser: Any, served: tuple[World, Served]) -> None:
    from selenium.webdriver.common.by import By

    w, server = served
    job_id, upstream = uncertain_with_webhook(w)
    with w.db.begin() as s:  # the sweep's note that nobody resolved it (the action closes it)
        jobstore.record_anomaly(s, job_id=job_id, user_id=w.user, kind="uncertain_unresolved",
                                detail={"since": str(w.clock.now)}, now=w.clock.now)
    w.clock.advance(minutes=42)
    w.q.polls.clear()
    login(browser, server.url, "alice")

    browser.get(f"{server.url}/")
    assert "Needs attention" in browser.title
    assert "uncertain_unresolved" in browser.find_element(By.ID, "list-anomalies").text
    section = browser.find_element(By.ID, "list-uncertain")
    link = section.find_element(By.CSS_SELECTOR, f'a[href$="/jobs/{job_id}"]')
    shot(browser, "01-needs-attention")
    link.click()

    assert loaded(browser, "status").text == "pending"
    assert browser.find_element(By.ID, "submission").text == "uncertain"
    assert "Evidence or an operator" in browser.find_element(By.ID, "waiting").text
    shown = [td.text for td in browser.find_elements(By.CSS_SELECTOR, "#evidence td.upstream-id")]
    assert shown == [upstream]
    shot(browser, "02-story-uncertain")

    browser.find_element(By.ID, "upstream_id").send_keys(shown[0])
    browser.find_element(By.ID, "reason-resolve_upstream").send_keys(
        "fal's stored webhook names this request id")
    browser.find_element(By.ID, "do-resolve_upstream").click()
    said = outcome(browser)
    assert said.get_attribute("data-outcome") == "done", said.text
    assert f"adopted upstream id {upstream}" in said.text
    shot(browser, "03-resolved")

    assert drain(w.rt, w.q) >= 1  # the worker: the resumed poll reads the finished task
    browser.find_element(By.ID, "back").click()
    assert loaded(browser, "status").text == "completed"
    assert browser.find_element(By.ID, "upstream").text == upstream
    assert browser.find_element(By.ID, "waiting").text.startswith("Waiting for: Nothing")
    record = browser.find_element(By.ID, "operator-record").text
    assert "alice@ops.test" in record and "fal's stored webhook names this request id" in record
    assert "resolved" in browser.find_element(By.ID, "anomalies").text
    shot(browser, "04-story-completed")
    (row,) = _records(w)
    assert (row.operator, row.via, row.action) == ("alice@ops.test", "console",
                                                   "resolve_upstream")

    # the other pages, for the record
    browser.get(f"{server.url}/users/{w.user}")
    assert browser.find_element(By.ID, "identity-state").text == "holds"
    shot(browser, "05-user-ledger")
    browser.get(f"{server.url}/audit")
    browser.find_element(By.ID, "run-full").click()
    assert loaded(browser, "audit-state").text == "ledger clean"
    shot(browser, "06-audit")
    browser.get(f"{server.url}/health")
    assert len(browser.find_elements(By.CSS_SELECTOR, "svg.chart")) == 2
    shot(browser, "07-health")


def test_a_read_only_operator_sees_no_action_and_a_forged_post_is_refused(
        browser: Any, served: tuple[World, Served]) -> None:
    from selenium.webdriver.common.by import By

    w, server = served
    job_id, upstream = uncertain_with_webhook(w)
    login(browser, server.url, "bob")
    browser.get(f"{server.url}/jobs/{job_id}")
    assert "read only" in browser.find_element(By.ID, "who").text
    assert browser.find_elements(By.CSS_SELECTOR, "form[method=post]") == []
    assert browser.find_elements(By.TAG_NAME, "button") == []
    shot(browser, "08-story-read-only")

    # a forged form, posted from bob's own browser session
    browser.execute_script(
        "const f = document.createElement('form'); f.method = 'post';"
        "f.action = arguments[0];"
        "for (const [k, v] of Object.entries(arguments[1])) {"
        "  const i = document.createElement('input'); i.name = k; i.value = v; f.append(i); }"
        "document.body.append(f); f.submit();",
        f"{server.url}/jobs/{job_id}/resolve_upstream",
        {"reason": "forged", "upstream_id": upstream, "csrf": "0" * 64})
    said = outcome(browser)
    assert said.get_attribute("data-outcome") == "forbidden"
    assert "may read the console but not act" in said.text
    shot(browser, "09-forged-post-refused")

    # even with a CSRF token valid for bob's own cookie: 403, nothing written
    cookie = browser.get_cookie("reconcile_console_csrf")["value"]
    token = server.server.config.app.state.console.csrf.token(cookie, "bob@ops.test")
    for action in ("resolve_upstream", "resolve_not_submitted", "fail"):
        r = httpx.post(f"{server.url}/jobs/{job_id}/{action}",
                       cookies={"operator": "bob", "reconcile_console_csrf": cookie},
                       data={"csrf": token, "reason": "forged", "upstream_id": upstream})
        assert r.status_code == 403, r.text[:300]
    job = w.job(job_id)
    assert (job.status, job.submission_state, job.provider_task_id) == ("pending", "uncertain",
                                                                       None)
    assert w.log_status(job_id) == "reserved" and _records(w) == []


def test_a_post_without_the_csrf_token_is_refused(
        browser: Any, served: tuple[World, Served]) -> None:
    from selenium.webdriver.common.by import By

    w, server = served
    job_id = w.submit("kie-standard")
    login(browser, server.url, "alice")
    browser.get(f"{server.url}/jobs/{job_id}")
    assert browser.find_elements(By.ID, "form-fail")  # alice may act: the form is there
    browser.execute_script(  # the same form without its token
        "const f = document.getElementById('form-fail');"
        "f.querySelector('input[name=csrf]').remove();"
        "f.querySelector('input[name=reason]').value = 'no token'; f.submit();")
    said = outcome(browser)
    assert said.get_attribute("data-outcome") == "forbidden"
    assert "CSRF token is missing" in said.text
    shot(browser, "10-csrf-less-post-refused")
    assert w.job(job_id).status == "pending" and _records(w) == []
    # with its token the same form works
    browser.get(f"{server.url}/jobs/{job_id}")
    browser.find_element(By.ID, "reason-fail").send_keys("customer asked; provider never ran it")
    browser.find_element(By.ID, "do-fail").click()
    assert outcome(browser).get_attribute("data-outcome") == "done"
    assert w.job(job_id).status == "failed"
