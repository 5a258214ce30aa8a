"""Attack on ProviderSession's per-origin cache of ``merge_environment_settings``.

Differential: for each input, a fresh plain ``requests.Session`` under the same environment is
the oracle. No request leaves the process: ``merge_environment_settings`` is called directly.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import requests

from reconcile.providers.http import ProviderSession

ENV = {
    "HTTP_PROXY": "http://127.0.0.1:3128",
    "HTTPS_PROXY": "http://127.0.0.1:3129",
    "NO_PROXY": "127.0.0.2,localhost:8443,10.0.0.0/8,.internal.example,[::1]",
    "REQUESTS_CA_BUNDLE": "/etc/ssl/atk-bundle.pem",
}


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "https_proxy", "no_proxy", "all_proxy", "ALL_PROXY",
                 "CURL_CA_BUNDLE", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "REQUESTS_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)


def _oracle(url: str, proxies: Any, stream: Any, verify: Any, cert: Any) -> dict[str, Any]:
    copy = dict(proxies) if isinstance(proxies, dict) else proxies
    return requests.Session().merge_environment_settings(url, copy, stream, verify, cert)


URLS = [
    "http://127.0.0.2/x", "http://127.0.0.3/x", "https://localhost:8443/", "https://localhost/",
    "https://LOCALHOST:8443/", "HTTPS://LocalHost:8443/a", "http://user:pw@127.0.0.2/x",
    "http://user:pw@127.0.0.3:81/x", "http://10.1.2.3:9000/", "http://11.1.2.3:9000/",
    "http://[::1]:8080/", "http://[::2]:8080/", "https://a.internal.example/",
    "https://internal.example.evil/", "http://127.0.0.2:80/x", "http:///nohost",
]
CALLS: list[tuple[Any, Any, Any, Any]] = [
    (None, None, True, None),
    ({}, False, None, None),
    ({"https": None, "http": "http://127.0.0.1:1"}, None, "/tmp/ca.pem", ["c.pem", "k.pem"]),
    ({"no_proxy": "127.0.0.3"}, None, False, ("c.pem", "k.pem")),
    ({"all": "http://127.0.0.1:2"}, True, True, "c.pem"),
]


def test_cached_result_equals_plain_requests_for_odd_inputs() -> None:
    session = ProviderSession()
    for _ in range(2):  # second pass is served from the cache
        for url in URLS:
            for proxies, stream, verify, cert in CALLS:
                got = session.merge_environment_settings(
                    url, dict(proxies) if proxies is not None else None, stream, verify,
                    list(cert) if isinstance(cert, list) else cert)
                want = _oracle(url, proxies, stream, verify, cert)
                assert got == want, (url, proxies, verify, cert)


def test_mutating_a_returned_value_does_not_poison_the_cache() -> None:
    session = ProviderSession()
    first = session.merge_environment_settings("http://127.0.0.3/", None, None, True, None)
    first["proxies"]["http"] = "http://127.0.0.1:6666"
    first["verify"] = False
    again = session.merge_environment_settings("http://127.0.0.3/", None, None, True, None)
    assert again == _oracle("http://127.0.0.3/", None, None, True, None)


def test_caller_mutating_its_cert_list_does_not_poison_the_cache() -> None:
    session = ProviderSession()
    cert = ["a.pem", "a.key"]
    session.merge_environment_settings("https://127.0.0.3/", None, None, True, cert)
    cert[0] = "b.pem"
    got = session.merge_environment_settings("https://127.0.0.3/", None, None, True,
                                             ["a.pem", "a.key"])
    assert list(got["cert"]) == ["a.pem", "a.key"]


def test_session_attributes_changed_after_first_request_are_honoured() -> None:
    session = ProviderSession()
    session.merge_environment_settings("https://127.0.0.3/", None, None, None, None)
    session.cert = "/etc/ssl/client.pem"  # e.g. a platform adding mTLS to its session
    session.proxies.update({"ftp": "http://127.0.0.1:4444"})
    got = session.merge_environment_settings("https://127.0.0.3/", None, None, None, None)
    plain = requests.Session()
    plain.cert = "/etc/ssl/client.pem"
    plain.proxies.update({"ftp": "http://127.0.0.1:4444"})
    want = plain.merge_environment_settings("https://127.0.0.3/", None, None, None, None)
    assert want["cert"] == "/etc/ssl/client.pem"
    assert got == want


def test_trust_env_off_bypasses_the_cache() -> None:
    session = ProviderSession()
    session.merge_environment_settings("http://127.0.0.3/", None, None, True, None)
    session.trust_env = False
    got = session.merge_environment_settings("http://127.0.0.3/", None, None, True, None)
    assert got["proxies"] == {} and got["verify"] is True


def test_many_threads_many_origins_past_the_bound() -> None:
    session = ProviderSession()
    session.MAX_ORIGINS = 8  # force clears while other threads read and write
    start = threading.Barrier(32)
    wrong: list[Any] = []
    oracle = {(h, p): _oracle(f"http://127.0.0.{h}:{p}/", None, None, True, None)
              for h in (2, 3) for p in range(8000, 8020)}

    def run(n: int) -> None:
        start.wait()
        for i in range(400):
            key = (2 + (n + i) % 2, 8000 + (n * 7 + i) % 20)
            got = session.merge_environment_settings(f"http://127.0.0.{key[0]}:{key[1]}/", None,
                                                     None, True, None)
            if got != oracle[key]:
                wrong.append((key, got))
            got["proxies"]["http"] = "poison"  # must not leak to other threads

    threads = [threading.Thread(target=run, args=(n,)) for n in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []
    assert len(session._environment) <= session.MAX_ORIGINS
