"""A client's own session reads the proxy environment once per origin, and still honours it.

Nothing here sends a request: ``merge_environment_settings`` is what ``Session.request`` calls
before it sends, so the tests call it directly.
"""

from __future__ import annotations

import pytest
import requests
import requests.sessions

from reconcile.providers.http import HttpClient, ProviderSession


def _counted(monkeypatch, name: str, *modules) -> list[str]:
    """Log each call of requests' function ``name`` (its URL) in each of ``modules``."""
    seen: list[str] = []
    real = getattr(modules[0], name)

    def counted(url, *args, **kwargs):
        seen.append(url)
        return real(url, *args, **kwargs)

    for module in modules:
        monkeypatch.setattr(module, name, counted)
    return seen


def _counting(monkeypatch) -> list[str]:
    return _counted(monkeypatch, "get_environ_proxies", requests.sessions)


def test_environment_proxies_are_honoured_and_read_once_per_origin(monkeypatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:3128")
    monkeypatch.setenv("NO_PROXY", "internal.example")
    seen = _counting(monkeypatch)
    session = ProviderSession()

    first = session.merge_environment_settings("https://api.example/v1/a", {}, None, None, None)
    second = session.merge_environment_settings("https://api.example/v1/b?x=1", {}, None, None, None)
    assert first["proxies"]["https"] == second["proxies"]["https"] == "http://127.0.0.1:3128"
    assert len(seen) == 1  # the second request to the same origin read nothing

    bypass = session.merge_environment_settings("https://internal.example/x", {}, None, None, None)
    assert "https" not in bypass["proxies"]  # NO_PROXY still applies per origin
    assert len(seen) == 2

    # what a caller does to the returned mapping does not leak into the next request
    first["proxies"]["https"] = "http://127.0.0.1:1"
    again = session.merge_environment_settings("https://api.example/v1/c", {}, None, None, None)
    assert again["proxies"]["https"] == "http://127.0.0.1:3128"


def test_a_call_with_its_own_proxies_is_its_own_entry(monkeypatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:3128")
    session = ProviderSession()
    plain = session.merge_environment_settings("https://api.example/", {}, None, None, None)
    own = session.merge_environment_settings(
        "https://api.example/", {"https": "http://127.0.0.1:8080"}, None, None, None)
    assert plain["proxies"]["https"] == "http://127.0.0.1:3128"
    assert own["proxies"]["https"] == "http://127.0.0.1:8080"


def test_without_trust_env_the_environment_is_ignored(monkeypatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:3128")
    seen = _counting(monkeypatch)
    session = ProviderSession()
    session.trust_env = False
    settings = session.merge_environment_settings("https://api.example/", {}, None, None, None)
    assert "https" not in settings["proxies"] and seen == []


def test_the_cache_is_bounded(monkeypatch) -> None:
    seen = _counting(monkeypatch)
    session = ProviderSession()
    for n in range(ProviderSession.MAX_ORIGINS + 10):
        session.merge_environment_settings(f"https://h{n}.example/", {}, None, None, None)
    assert len(session._environment) <= ProviderSession.MAX_ORIGINS
    assert len(seen) == ProviderSession.MAX_ORIGINS + 10


def test_a_client_without_an_injected_session_uses_one_and_keeps_an_injected_one() -> None:
    assert isinstance(HttpClient("https://api.example").session, ProviderSession)
    mine = requests.Session()
    assert HttpClient("https://api.example", session=mine).session is mine


def _netrc(tmp_path, monkeypatch) -> list[str]:
    """A netrc file with one entry (``127.0.0.2``), and a log of requests' netrc lookups."""
    path = tmp_path / "netrc"
    path.write_text("machine 127.0.0.2 login alice password s3cret\n")
    monkeypatch.setenv("NETRC", str(path))
    return _counted(monkeypatch, "get_netrc_auth", requests.utils, requests.sessions)


URLS = ["http://127.0.0.2/v1/a", "http://127.0.0.2:81/b?x=1", "http://127.0.0.3/v1/a",
        "https://api.example/v1", "http://user:pw@127.0.0.2/x", "http://user:pw@127.0.0.3/x",
        "http://127.0.0.3/v1/b"]


def test_netrc_credentials_are_what_a_plain_session_sends_and_read_once_per_host(
        tmp_path, monkeypatch) -> None:
    seen = _netrc(tmp_path, monkeypatch)
    session = ProviderSession()
    for _ in range(3):  # the second and third passes are served from the cache
        for url in URLS:
            request = requests.Request("GET", url, headers={"X-Key": "k"})
            got = session.prepare_request(request).headers
            want = requests.Session().prepare_request(
                requests.Request("GET", url, headers={"X-Key": "k"})).headers
            assert dict(got) == dict(want), url
    assert session.prepare_request(requests.Request("GET", URLS[0])).headers[
        "Authorization"] == requests.auth._basic_auth_str("alice", "s3cret")
    # the oracle looks up every URL; ours once per host (127.0.0.2, .3, api.example), and
    # every time for a URL with credentials of its own (left to requests)
    ours = len(seen) - 3 * len(URLS)
    assert ours == 3 + 3 * 2


def test_a_request_with_its_own_auth_or_without_trust_env_never_reads_netrc(
        tmp_path, monkeypatch) -> None:
    seen = _netrc(tmp_path, monkeypatch)
    session = ProviderSession()
    own = session.prepare_request(requests.Request("GET", URLS[0], auth=("bob", "pw")))
    assert own.headers["Authorization"] == requests.auth._basic_auth_str("bob", "pw")
    session.trust_env = False
    plain = session.prepare_request(requests.Request("GET", URLS[0]))
    assert "Authorization" not in plain.headers
    assert seen == []


def test_the_netrc_cache_is_bounded(tmp_path, monkeypatch) -> None:
    _netrc(tmp_path, monkeypatch)
    session = ProviderSession()
    for i in range(ProviderSession.MAX_ORIGINS * 2 + 3):
        session.prepare_request(requests.Request("GET", f"http://h{i}.example/"))
        assert len(session._netrc) <= ProviderSession.MAX_ORIGINS


def test_prepare_request_leaves_the_callers_request_as_it_was(tmp_path, monkeypatch) -> None:
    _netrc(tmp_path, monkeypatch)
    session = ProviderSession()
    request = requests.Request("GET", URLS[0])
    session.prepare_request(request)
    assert request.auth is None
    session.trust_env = False  # the same request, prepared again: no netrc credentials now
    assert "Authorization" not in session.prepare_request(request).headers


@pytest.mark.parametrize("url", ["\u00a0http://u:p@127.0.0.3/x", "\u3000http://u:p@127.0.0.3/x",
                                 " http://127.0.0.2/x", "http://[::1/bad", "http://a\uff20b/"])
def test_an_odd_url_prepares_or_fails_as_with_a_plain_session(tmp_path, monkeypatch,
                                                              url) -> None:
    """Leading Unicode whitespace (requests strips it, ``urlsplit`` does not), a host that does
    not parse: left to requests, whose answer or error ours must be."""
    def prepared(session: requests.Session) -> object:
        try:
            return dict(session.prepare_request(requests.Request("GET", url)).headers)
        except Exception as exc:  # noqa: BLE001 - the error is what is compared
            return type(exc)

    monkeypatch.setenv("NETRC", str(tmp_path / "none"))  # no netrc file, the usual case
    assert prepared(ProviderSession()) == prepared(requests.Session())
    _netrc(tmp_path, monkeypatch)
    assert prepared(ProviderSession()) == prepared(requests.Session())
