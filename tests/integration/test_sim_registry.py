"""The simulator is what its provider modules register (reconcile/testing/sim_registry.py): its
settings environment comes from their registrations, and a provider without webhooks costs no
other task its delivery."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest

from reconcile import Settings
from reconcile.errors import CreateRejected
from reconcile.kinds import BUILTIN_KINDS, BUILTIN_PROVIDERS, get_kind
from reconcile.providers import CreateRequest
from reconcile.providers.family import Kind, ProviderFamily
from reconcile.testing import sim_registry
from reconcile.testing.sim_registry import SimWebhooks
from reconcile.testing.simulator import PROVIDER_MODULES, Script, SimSecrets, Simulator
from reconcile.webhooks import PROVIDERS

# the Settings fields that point a built-in family's client somewhere, hold its credential, or
# make its webhooks verifiable: the simulator's environment must set every one of them
_FAMILY = re.compile(r"^(?P<family>[a-z0-9]+)_(\w+_)?(base_url|api_key|jwks_url)$|"
                     r"^(?P<hooks>[a-z0-9]+)_webhook_\w+$")


def _provider_fields() -> set[str]:
    found = set()
    for name in Settings.with_families().model_fields:
        match = _FAMILY.match(name)
        if match and (match["family"] or match["hooks"]) in BUILTIN_PROVIDERS:
            found.add(name)
    return found


def test_every_builtin_family_has_its_simulator_module() -> None:
    assert [m.__name__.rsplit(".sim_", 1)[1] for m in PROVIDER_MODULES] == list(BUILTIN_PROVIDERS)
    examples = sim_registry.examples()
    assert set(examples) >= set(BUILTIN_KINDS)  # every built-in kind has a request it accepts
    for provider in PROVIDERS:  # every shipped webhook scheme is simulated, and signed
        hooks = sim_registry.webhooks_for(provider)
        assert hooks is not None and hooks.sign is not None and hooks.secret_setting, provider
    for name in BUILTIN_KINDS:
        kind = get_kind(name)
        assert kind is not None and sim_registry.route(kind.provider) is not None, name


def test_the_environment_comes_from_the_registrations(simulator: Simulator) -> None:
    env = simulator.env()
    declared = {s for r in sim_registry.routes() for s in (*r.url_settings, *r.api_key_settings)}
    declared |= {h.secret_setting for h in sim_registry.registered_webhooks() if h.secret_setting}
    assert declared <= set(Settings.with_families().model_fields)  # no registration names a setting that is not
    assert {sim_registry.env_name(s) for s in _provider_fields()} <= set(env)
    assert env["RECONCILE_FAL_JWKS_URL"] == simulator.url + "/fal/.well-known/jwks.json"
    assert env["RECONCILE_KIE_WEBHOOK_HMAC_KEY"] == simulator.secrets.kie_webhook_hmac_key
    assert env["RECONCILE_FAL_WEBHOOK_USER_ID"] == simulator.secrets.fal_user_id
    settings = simulator.settings()
    assert settings.kie_base_url == simulator.url + "/kie" and settings.kie_api_key == "sim-key"


def test_a_registered_family_brings_its_own_secret() -> None:
    hooks = SimWebhooks("probe", lambda *a: None, lambda *a: {}, secret_setting="probe_secret",
                        secret="sim-probe-secret",
                        sign=lambda sim, body, ts: {"X-Probe": sim.secrets.webhook_secret("probe")})
    sim_registry.register_webhooks(hooks)
    try:
        assert SimSecrets().webhook_secret("probe") == "sim-probe-secret"
        custom = SimSecrets(webhook_secrets={"probe": "mine"})
        assert custom.settings_env()["RECONCILE_PROBE_SECRET"] == "mine"
        sim = Simulator(secrets=custom)
        assert sim_registry.sign("probe", sim, b"{}", 0) == {"X-Probe": "mine"}
        assert sim_registry.verify_key("probe", sim) == "mine"
    finally:
        sim_registry.unregister(provider="probe")
    with pytest.raises(LookupError):
        sim_registry.sign("probe", Simulator(), b"{}", 0)


def test_a_provider_without_webhooks_costs_no_other_delivery() -> None:
    """Regression: the delivery tick called the callback of a provider with no registered
    webhooks (None) and raised AttributeError, losing the tick's other due deliveries (each
    already marked sent). Now that task sends nothing, a broken callback costs only its own
    delivery, and the others are made."""
    seen: list[str] = []

    def callback(sim, task, state, since):  # type: ignore[no-untyped-def]
        seen.append(task.task_id)

    def broken(sim, task, state, since):  # type: ignore[no-untyped-def]
        raise RuntimeError("a broken callback (simulated)")

    sim_registry.register_webhooks(SimWebhooks("probe-hooks", callback, lambda *a: {}))
    sim_registry.register_webhooks(SimWebhooks("probe-broken", broken, lambda *a: {}))
    now = [0.0]
    sim = Simulator(clock=lambda: now[0])
    sim.script_default(Script(timeline=((0.0, "succeeded"),), webhook=True))
    try:
        for provider in ("probe-none", "probe-broken", "probe-hooks"):
            sim.create(provider=provider, api=provider, model="m", task_id=f"{provider}-1",
                       callback_url=None, body={})
        now[0] = 1.0
        sim._tick()
        assert seen == ["probe-hooks-1"]
        assert all(task.webhook_sent for task in sim.tasks.values())
        sim._tick()  # sent once only
        assert seen == ["probe-hooks-1"]
    finally:
        sim_registry.unregister(provider="probe-hooks")
        sim_registry.unregister(provider="probe-broken")


def test_a_builtin_family_without_its_simulator_module_fails_loudly(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """atk2: an install missing ``sim_<family>`` of a built-in family (a packaging slip, a
    vendored copy) must not load quietly: the simulator would serve nothing for it and its
    settings would leave that family's base URL at the real provider's default (``sim_kie``
    removed from an installed wheel: ``Simulator.settings().kie_base_url`` was
    https://api.kie.ai, 14 variables instead of 17). Before the registry, simulator.py imported
    each module by name and an absent one raised; load_builtin swallowed the
    ModuleNotFoundError. The strict load (the default) raises."""
    from reconcile.providers import family as registry

    ghost = ProviderFamily("atk2nosuchfamily", kinds=(
        Kind("atk2nosuchfamily-x", False, timedelta(minutes=1), None, None, None, "x:y"),),
        simulator="reconcile.testing.sim_atk2nosuchfamily")
    monkeypatch.setattr(registry, "_LOADED", (ghost, *registry.families()))
    monkeypatch.setattr(sim_registry, "_MISSING", {})
    with pytest.raises(ModuleNotFoundError, match="sim_atk2nosuchfamily"):
        sim_registry.load_builtin()


def test_a_missing_simulator_module_costs_only_its_family(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulator loads the families' modules leniently: a missing one no longer breaks every
    test's import, only its own family — which it records with a clear reason, serves nothing
    for, and points at a path of its own that answers 404: never at the real provider (the
    hazard above). Here KIE's module is "lost": the other families still load and run."""
    import dataclasses

    from reconcile.providers import family as registry

    sim_registry.load_builtin(strict=False)
    already = set(sim_registry.missing())  # none, unless another family's module is broken too
    lost = tuple(dataclasses.replace(f, simulator="reconcile.testing.sim_atk2lost")
                 if f.name == "kie" else f for f in registry.families())
    monkeypatch.setattr(registry, "_LOADED", lost)
    monkeypatch.setattr(sim_registry, "_MISSING", {})
    monkeypatch.setattr(sim_registry, "_ROUTES",
                        {p: r for p, r in sim_registry._ROUTES.items() if p != "kie"})
    loaded = sim_registry.load_builtin(strict=False)
    assert [m.__name__.rsplit(".sim_", 1)[1] for m in loaded] == \
        [f for f in BUILTIN_PROVIDERS if f != "kie" and f not in already]
    assert set(sim_registry.missing()) == {"kie"} | already
    assert "reconcile.testing.sim_atk2lost" in sim_registry.missing()["kie"]
    with Simulator() as sim:
        settings = sim.settings()
        assert settings.kie_base_url == sim.url + "/kie"  # never https://api.kie.ai
        assert settings.replicate_base_url == sim.url + "/replicate"
        client = get_kind("kie-standard").build(settings)  # type: ignore[union-attr]
        with pytest.raises(CreateRejected):  # the simulator's bare 404
            client.create(CreateRequest("seedream/4.5-edit", {"prompt": "x"}, "j"))  # type: ignore[union-attr]
        assert sim.unrouted and sim.unrouted[0][1].startswith("/kie/")
