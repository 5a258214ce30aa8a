"""The provider-kind registry (``reconcile/kinds.py``; README, Configuration)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from reconcile import Kind, Settings, register_kind
from reconcile.kinds import BUILTIN_KINDS, BUILTIN_PROVIDERS, all_kinds, get_kind, unregister_kind
from reconcile.providers import AsyncProvider, SyncProvider

EXPECTED = {  # name: (sync, threshold minutes, poll seconds, url lifetime hours)
    "anthropic-sync": (True, 5, None, None), "elevenlabs-async": (False, 15, 10, None),
    "elevenlabs-sync": (True, 5, None, None), "fal-queue": (False, 20, 3, 1),
    "kie-standard": (False, 10, 5, 24), "kie-veo": (False, 25, 10, 24),
    "kie-suno": (False, 30, 10, 24), "kie-kontext": (False, 10, 5, 24),
    "kie-luma": (False, 25, 15, 24), "kie-kling3": (False, 25, 10, 24),
    "kie-runway": (False, 25, 10, 24), "kie-lip-sync": (False, 75, 15, 24),
    "kie-llm": (True, 5, None, None), "replicate-prediction": (False, 20, 3, 1),
    "replicate-training": (False, 30, 15, 1),
}


def test_registry_holds_the_builtin_kinds_of_the_design() -> None:
    """Every built-in kind with its sync flag, threshold, interval and URL lifetime."""
    assert set(BUILTIN_KINDS) == set(EXPECTED)
    for name, (sync, threshold, poll, lifetime) in EXPECTED.items():
        kind = get_kind(name)
        assert kind is not None
        assert kind.sync is sync
        assert kind.stale_threshold == timedelta(minutes=threshold)
        assert kind.poll_interval == (timedelta(seconds=poll) if poll else None)
        assert kind.result_url_lifetime == (timedelta(hours=lifetime) if lifetime else None)
        assert (kind.plant is None) is sync
    # the families (their packages' names, in order), as their first kinds appear: what every
    # plug-in list derives from
    assert BUILTIN_PROVIDERS == tuple(dict.fromkeys(n.split("-")[0] for n in EXPECTED))


def test_every_stale_threshold_is_at_most_half_its_result_url_lifetime() -> None:
    """README, Design notes: Thresholds and URL lifetimes, over the whole registry."""
    for kind in all_kinds():
        if kind.result_url_lifetime is not None:
            assert kind.stale_threshold <= kind.result_url_lifetime / 2, kind.name


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_kind_builds_a_client_of_the_right_shape(name: str) -> None:
    """Each kind resolves its client factory: async kinds poll, sync kinds call."""
    kind = get_kind(name)
    assert kind is not None
    client = kind.build(Settings())
    assert isinstance(client, SyncProvider if kind.sync else AsyncProvider)


def test_a_platform_registers_its_own_kind_and_cannot_shadow_by_accident() -> None:
    """register_kind adds a kind; re-registering a name needs replace=True."""
    custom = Kind("testfam-async", False, timedelta(minutes=7), timedelta(seconds=2),
                  timedelta(hours=2), "webhook query", "reconcile.providers.replicate:prediction_client")
    register_kind(custom)
    try:
        assert get_kind("testfam-async") is custom
        with pytest.raises(ValueError):
            register_kind(custom)
        with pytest.raises(ValueError):
            register_kind(Kind("kie-standard", True, timedelta(1), None, None, None, "x:y"))
    finally:
        unregister_kind("testfam-async")
    assert get_kind("testfam-async") is None and get_kind(None) is None


def test_kie_polls_back_off_as_a_job_ages() -> None:
    """KIE suggests 2–3 s early and 15–30 s later: the interval grows after 2 minutes."""
    kind = get_kind("kie-standard")
    assert kind is not None
    assert kind.interval_at(timedelta(seconds=10)) == timedelta(seconds=5)
    assert kind.interval_at(timedelta(minutes=3)) == timedelta(seconds=15)
