"""Integration fixtures shared across files: ``ledger_backend`` (each ledger backend in turn),
``on_each_ledger`` (the same, installed for the test) and ``pg_and_sqlite`` (a sessionmaker on
PostgreSQL, then on a fresh SQLite file: the ledger's two paths)."""

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from reconcile.db.migrate import upgrade
from reconcile.db.session import make_engine, make_sessionmaker
from tests.integration.ledgers import ledger_backend, on_each_ledger  # noqa: F401


@pytest.fixture(params=["postgresql", "sqlite"])
def pg_and_sqlite(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    if request.param == "postgresql":
        yield request.getfixturevalue("db")
        return
    url = f"sqlite:///{tmp_path / 'l.db'}"
    upgrade(url)
    engine = make_engine(url)
    yield make_sessionmaker(engine)
    engine.dispose()
