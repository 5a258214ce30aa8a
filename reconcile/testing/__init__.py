"""Test support shipped in the wheel. Platforms import :mod:`reconcile.testing.simulator`,
:mod:`reconcile.testing.fixtures` and :mod:`reconcile.testing.sim_registry`; the rest (chaos
run, explorer, process harness, each simulated provider) is internal.
"""

__all__: list[str] = []
