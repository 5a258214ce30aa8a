"""The simulator driven from outside: ``SimulatorClient`` over the ``/_control`` API, the
session fixture and custom secrets, and ``python -m reconcile.testing.simulator`` serving until
SIGTERM.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys

import pytest
import requests

from reconcile.testing.simulator import Script, SimSecrets, Simulator, SimulatorClient
from tests.integration._sim_helpers import REPLICATE, http as http, replicate_create

# --- control API, fixtures, CLI --------------------------------------------------------------


def test_simulator_client_drives_the_control_api(simulator, http) -> None:
    """``SimulatorClient`` scripts, forces states, reads counters and resets over ``/_control``."""
    control = SimulatorClient(simulator.url)
    assert control.health()["ok"] and control.base_urls() == simulator.base_urls()
    control.script("job-cc", Script(timeline=[(0, "running")], outputs=3))
    prediction = replicate_create(http, simulator, "job-cc")
    assert simulator.tasks[prediction["id"]].script.outputs == 3
    control.set_state(prediction["id"], "succeeded")
    body = http.get(prediction["urls"]["get"], headers=REPLICATE).json()
    assert body["status"] == "succeeded" and len(body["output"]) == 3
    assert control.creates("job-cc") == 1 and control.creates(provider="kie") == 0
    assert control.tasks("job-cc")[0]["state"] == "succeeded"
    with pytest.raises(requests.HTTPError):
        control.set_state(prediction["id"], "bogus")
    control.reset()
    assert control.creates() == 0 and simulator.tasks == {}
    control.close()


def test_session_fixture_and_custom_secrets(simulator_session) -> None:
    """The session fixture is started, and SimSecrets feed the settings environment."""
    assert SimulatorClient(simulator_session.url).health()["ok"]
    secrets = SimSecrets(kie_webhook_hmac_key="k1")
    with Simulator(secrets=secrets) as custom:
        settings = custom.settings()
        assert settings.kie_base_url == custom.url + "/kie"
        assert settings.kie_webhook_hmac_key == "k1"
        assert settings.media_allowed_hosts == ["127.0.0.1:*"]


def test_cli_serves_until_sigterm() -> None:
    """``python -m reconcile.testing.simulator`` prints its URL, answers, and exits on SIGTERM."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, "-m", "reconcile.testing.simulator", "--port", str(port), "--seed", "3",
         "--time-scale", "0.5"], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip()
        assert url == f"http://127.0.0.1:{port}"
        assert SimulatorClient(url).health()["url"] == url
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
    finally:
        if process.poll() is None:
            process.kill()
