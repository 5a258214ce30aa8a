"""Test helpers for a Django platform's own test suite (``manage.py test`` or pytest-django).

The library's tables reach the test database through ``manage.py migrate`` (its Django
migration runs for test databases too), and the library follows the connection's database at
each use, so under either runner it reads and writes the test database. It keeps a connection
pool of its own: these helpers close it before the test database is dropped (PostgreSQL
refuses to drop a database someone is connected to).

The library commits on its own connection, so a test that submits jobs sees the library's rows
only outside Django's per-test transaction: use ``TransactionTestCase`` (pytest-django:
``transactional_db`` / ``django_db(transaction=True)``), never ``TestCase``. Its flush empties
the platform's tables; :func:`flush` empties the library's.

Django's test runner, in the settings::

    TEST_RUNNER = "reconcile.contrib.django.testing.ReconcileTestRunner"

pytest-django, in ``conftest.py``::

    pytest_plugins = ["reconcile.contrib.django.testing"]

    def test_submit(reconcile_db, reconcile_simulator, client):  # reconcile_db: the runtime
        ...

:func:`simulated` points the library at the shipped provider simulator for a block (a test
class's, or the ``reconcile_simulator`` fixture's); with ``RECONCILE = {..., "eager": True}``
a submit then runs its create and polls inline, in the request.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.test.runner import DiscoverRunner

from ...runtime import Runtime
from ...testing.simulator import Simulator
from . import close_connections, runtime

__all__ = ["ReconcileTestRunner", "flush", "simulated"]

# the library's own tables it keeps across a flush: the adoption time and what it created
_KEPT = frozenset({"reconcile_meta", "reconcile_created_objects"})


class ReconcileTestRunner(DiscoverRunner):
    """Django's test runner, closing the library's connections before the test databases are
    dropped (and after the run, whatever the outcome)."""

    def teardown_databases(self, old_config: Any, **kwargs: Any) -> None:
        close_connections()
        super().teardown_databases(old_config, **kwargs)


def flush(rt: Runtime | None = None) -> None:
    """Delete every row of the library's own tables (ledger, events, anomalies, assets, webhook
    deliveries, idempotency keys, the operator record) in the test database; the platform's
    tables are Django's flush's. For the end of a test that used the library."""
    from sqlalchemy import delete

    from ...db.contract import LIBRARY_TABLES
    from ...db.models import Base

    rt = rt or runtime()
    with rt.sessions.begin() as session:
        for name in LIBRARY_TABLES:
            if name not in _KEPT:
                session.execute(delete(Base.metadata.tables[name]))


@contextmanager
def simulated(**options: Any) -> Iterator[Simulator]:
    """A started provider simulator (:class:`reconcile.testing.simulator.Simulator`, given
    ``options``) that the library uses for the block: its base URLs, keys and secrets in the
    ``RECONCILE_*`` environment (:func:`~reconcile.contrib.django.runtime` follows it)."""
    with Simulator(**options) as sim:
        wanted = sim.env()
        saved = {name: os.environ.get(name) for name in wanted}
        os.environ.update(wanted)
        try:
            yield sim
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


try:
    import pytest
except ImportError:  # Django's runner only: the fixtures need pytest (and pytest-django)
    pass
else:
    @pytest.fixture(scope="session")
    def reconcile_engines(django_db_setup: Any) -> Iterator[None]:
        """Session: after the test databases exist; closes the library's connections before
        pytest-django drops them."""
        yield
        close_connections()

    @pytest.fixture
    def reconcile_db(reconcile_engines: None, transactional_db: None) -> Iterator[Runtime]:
        """The library's runtime on the test database, for a test whose rows the library must
        see (pytest-django's ``transactional_db``); the library's rows are deleted after."""
        rt = runtime()
        yield rt
        flush(rt)

    @pytest.fixture
    def reconcile_simulator() -> Iterator[Simulator]:
        """The provider simulator the library uses for this test (:func:`simulated`)."""
        with simulated() as sim:
            yield sim
