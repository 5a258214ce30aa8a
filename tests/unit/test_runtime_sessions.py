"""``Runtime(sessions=...)`` is checked when the Runtime is built: a factory the library cannot
open its own units of work from (a ``scoped_session``, a sessionmaker with only ``binds=``, not
a sessionmaker at all, a bind that is no engine) stops the process with a message that says what to pass, instead of an
``AttributeError`` or ``UnboundExecutionError`` in a worker at the first poll round."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import Session, scoped_session, sessionmaker

from reconcile import Runtime, Settings
from reconcile.db.models import Base
from reconcile.jobstore.adoption import SettingsError

# nothing listens there: building a Runtime must not connect
UNREACHABLE = "postgresql+psycopg://reconcile@127.0.0.1:1/nowhere"


def _runtime(sessions: Any) -> Runtime:
    return Runtime(settings=Settings(), sessions=sessions, storage=None)  # type: ignore[arg-type]


def test_a_sessionmaker_with_a_default_bind_is_taken_without_connecting() -> None:
    rt = _runtime(sessionmaker(create_engine(UNREACHABLE)))
    assert rt.sessions().get_bind().url.port == 1


def test_a_scoped_session_is_refused_with_what_to_pass_instead() -> None:
    scoped = scoped_session(sessionmaker(create_engine(UNREACHABLE)))
    with pytest.raises(SettingsError, match="session_factory"):
        _runtime(scoped)
    _runtime(scoped.session_factory)  # what the message asks for


def test_a_sessionmaker_with_only_binds_is_refused() -> None:
    engine = create_engine(UNREACHABLE)
    with pytest.raises(SettingsError, match="no default bind"):
        _runtime(sessionmaker(binds={Base: engine}))
    # the same binds beside a default bind: taken
    _runtime(sessionmaker(bind=engine, binds={Base: engine}))


def test_a_routing_session_that_answers_without_a_mapper_is_taken() -> None:
    engine = create_engine(UNREACHABLE)

    class Routing(Session):
        def get_bind(self, mapper: Any = None, **kw: Any) -> Any:  # a platform's router
            return engine

    _runtime(sessionmaker(class_=Routing))


@pytest.mark.parametrize("factory", [None, "sqlite://", Session])
def test_what_is_no_sessionmaker_is_refused(factory: Any) -> None:
    with pytest.raises(SettingsError, match="takes a sqlalchemy.orm.sessionmaker"):
        _runtime(factory)


def test_a_session_that_needs_a_request_context_is_not_judged_at_import_time() -> None:
    # Flask-SQLAlchemy's get_bind() reads the application context: a Runtime built at import
    # time (an app factory's module) has none yet, and must still be built
    class NeedsAppContext(Session):
        def get_bind(self, mapper: Any = None, **kw: Any) -> Any:
            raise RuntimeError("Working outside of application context.")

    _runtime(sessionmaker(class_=NeedsAppContext))


class _NoBind(Session):
    def get_bind(self, *args: Any, **kwargs: Any) -> Any:  # a routing class that forgot a case
        return None


@pytest.mark.parametrize(("factory", "named"), [
    (lambda: sessionmaker(bind="postgresql+psycopg://app@db/app"), "str"),  # a URL, not an engine
    (lambda: sessionmaker(bind=42), "int"),
    (lambda: sessionmaker(class_=_NoBind), "NoneType"),
])
def test_a_bind_that_is_no_engine_is_refused_at_construction(factory: Any, named: str) -> None:
    # each of these passed the check and failed at the first statement, in a worker
    with pytest.raises(SettingsError, match=f"bind is {named}, not a SQLAlchemy Engine"):
        _runtime(factory())


def test_an_async_engine_is_refused_with_its_sync_engine_as_the_fix() -> None:
    from sqlalchemy.ext.asyncio import create_async_engine

    async_engine = create_async_engine(UNREACHABLE)  # connects to nothing until used
    with pytest.raises(SettingsError, match=r"bind is AsyncEngine.*pass its \.sync_engine"):
        _runtime(sessionmaker(bind=async_engine))
    _runtime(sessionmaker(bind=async_engine.sync_engine))  # what the message asks for


def test_a_sessionmaker_of_async_sessions_is_refused() -> None:
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    # AsyncSession.get_bind() answers the sync engine: only the class shows it
    factory = sessionmaker(class_=AsyncSession, bind=create_async_engine(UNREACHABLE))
    with pytest.raises(SettingsError, match="not of AsyncSession"):
        _runtime(factory)


def test_a_mock_bind_gets_no_async_hint() -> None:
    from unittest.mock import MagicMock

    with pytest.raises(SettingsError) as refused:
        _runtime(sessionmaker(bind=MagicMock()))
    assert "bind is MagicMock" in str(refused.value) and "sync_" not in str(refused.value)


def test_a_sessionmaker_bound_to_a_connection_is_taken() -> None:
    engine = create_engine("sqlite://")
    with engine.connect() as conn:
        assert _runtime(sessionmaker(bind=conn)).sessions().get_bind() is conn


def test_a_bind_that_is_no_engine_is_refused_where_the_asyncio_extension_cannot_load(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # without greenlet SQLAlchemy's asyncio extension raises ImportError: the refusal stays a
    # SettingsError (the hint is only for an asyncio engine, which cannot exist there)
    import sys

    monkeypatch.setitem(sys.modules, "sqlalchemy.ext.asyncio", None)
    with pytest.raises(SettingsError, match=r"bind is str, not a SQLAlchemy Engine or Connection$"):
        _runtime(sessionmaker(bind="postgresql+psycopg://app@db/app"))
