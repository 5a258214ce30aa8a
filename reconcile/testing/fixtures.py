"""Pytest fixtures for the provider simulator. In a ``conftest.py``::

    from reconcile.testing.fixtures import simulator, simulator_session  # noqa: F401

``simulator`` is a fresh started simulator per test; ``simulator_session`` one shared by the
session (call ``.reset()`` between uses); ``simulator_env`` also points ``RECONCILE_*`` at the
per-test simulator for code that reads :func:`reconcile.settings.get_settings`.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ..settings import get_settings
from .simulator import Simulator

__all__ = [
    "simulator", "simulator_env", "simulator_session",
]


@pytest.fixture
def simulator() -> Iterator[Simulator]:
    """A started simulator of this test's own, stopped afterwards."""
    with Simulator() as sim:
        yield sim


@pytest.fixture(scope="session")
def simulator_session() -> Iterator[Simulator]:
    """One started simulator for the whole session, reset when the session ends."""
    with Simulator() as sim:
        yield sim
        sim.reset()


@pytest.fixture
def simulator_env(simulator: Simulator, monkeypatch: pytest.MonkeyPatch) -> Iterator[Simulator]:
    """``simulator`` with the settings environment (base URLs, keys, secrets) pointing at it."""
    for name, value in simulator.env().items():
        monkeypatch.setenv(name, value)
    get_settings.cache_clear()
    yield simulator
    get_settings.cache_clear()
