"""Internal: Everything a lifecycle step needs, built once per process and passed in.

A :class:`Runtime` carries the settings, the session factory, storage, the HTTP session, the
clock, the platform's hooks and the two enqueue functions (set by the Celery tasks module; a
test can pass plain callables). Nothing here reads the environment except
:func:`Runtime.from_settings`.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import requests
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import UnboundExecutionError
from sqlalchemy.orm import Session, scoped_session, sessionmaker

from .db.contract import require as require_contract
from .db.session import engine_for, make_sessionmaker
from .jobstore.adoption import SettingsError, check_observe_only, check_required_kinds
from .kinds import Kind, check_sync_deadline, get_kind
from .ledger import DEFAULT as DEFAULT_LEDGER, Ledger
from .settings import Settings
from .settlement import SettlementPolicy

if TYPE_CHECKING:
    from .db.models import Job
    from .providers.base import AsyncProvider, PollResult, SyncProvider
    from .storage import Storage

__all__ = [
    "CompletionHook", "EventHook", "PricingHook", "Runtime", "Validator", "WatermarkHook",
]


def utcnow() -> datetime:
    return datetime.now(UTC)


# (job) -> credits to commit (≤ reserved) or None for all of it
PricingHook = Callable[["Job", "PollResult | None"], "int | None"]
# (data, media_type, job) -> watermarked data
WatermarkHook = Callable[[bytes, "str | None", "Job"], bytes]
# (session, job, result) -> None, inside the completion transaction (e.g. a LoRA row)
CompletionHook = Callable[[Session, "Job", "PollResult | None"], None]
# (provider_kind, model, input) -> None or raise InvalidParam
Validator = Callable[[str, str, Mapping[str, Any]], None]
EventHook = Callable[[dict[str, Any]], None]


def _settings_policy(settings: Settings, given: SettlementPolicy | None) -> SettlementPolicy:
    """The settings' settlement policy; ``given`` must be it (or None). Money rules must not
    depend on which process got there first: a Runtime never settles under a policy other
    than its deployment's (``RECONCILE_FAILURE_REFUND`` / ``RECONCILE_CANCEL_REFUND``)."""
    policy = settings.settlement_policy
    if given is not None and given.checked() != policy:
        raise ValueError(
            f"settlement policy {given} differs from the settings' {policy}: the policy is "
            "deployment configuration, set RECONCILE_FAILURE_REFUND and RECONCILE_CANCEL_REFUND "
            "(or Settings(failure_refund=..., cancel_refund=...)) so that every process "
            "settles and audits alike")
    return policy


def _noop_create(job_id: uuid.UUID, countdown: float = 0.0) -> None:
    return None


def check_sessions(factory: object) -> None:
    """Start-up check of ``Runtime(sessions=...)``: raise :class:`SettingsError` for a factory
    the library cannot open its own units of work from. Every step opens sessions with
    ``factory()`` and ``factory.begin()`` (a ``scoped_session``'s ``begin()`` gives the
    thread's transaction, not a session) and asks one for its bind without naming a mapper
    (the dialect; a one-statement transaction's engine): a sessionmaker with only ``binds=``
    and no default ``bind`` answers that with ``UnboundExecutionError``, which the default poll
    mode would first meet at its first round, in a worker. A ``get_bind()`` that fails in another
    way is not judged here (Flask-SQLAlchemy's needs an application context, which a Runtime
    built at import time does not have). A bind that is no ``Engine`` or ``Connection`` (a URL
    string, an ``AsyncEngine``, a ``get_bind()`` answering None) is refused. Nothing is
    connected here."""
    if isinstance(factory, scoped_session):
        raise SettingsError("Runtime(sessions=...) takes a sessionmaker, not a scoped_session: "
                            "pass its session_factory (the library opens and closes its own "
                            "sessions, never the thread's)")
    if not isinstance(factory, sessionmaker):
        raise SettingsError(f"Runtime(sessions=...) takes a sqlalchemy.orm.sessionmaker, not "
                            f"{type(factory).__name__}")
    if not (isinstance(factory.class_, type) and issubclass(factory.class_, Session)):
        raise SettingsError(f"Runtime(sessions=...) takes a sessionmaker of (synchronous) "
                            f"sqlalchemy.orm.Session, not of {getattr(factory.class_, '__name__', '?')}")
    try:
        session = factory()
    except Exception:  # a Session class that needs what only a request has: not judged here
        return
    try:
        bind = session.get_bind()
    except UnboundExecutionError as exc:
        raise SettingsError(
            "Runtime(sessions=...): the sessionmaker has no default bind (only binds=, or a "
            "get_bind() that needs a mapper); give it bind=<the engine of the jobs table>, "
            f"or a Session class whose get_bind() answers without a mapper ({exc})") from exc
    except Exception:  # another failure (no app context yet): not judged here
        return
    finally:
        session.close()
    if not isinstance(bind, (Engine, Connection)):
        raise SettingsError(f"Runtime(sessions=...): the sessionmaker's bind is "
                            f"{type(bind).__name__}, not a SQLAlchemy Engine or Connection"
                            f"{_async_hint(bind)}")


def _async_hint(bind: object) -> str:
    """What to pass instead of an asyncio engine or connection (none where SQLAlchemy's asyncio
    extension cannot load: it needs greenlet, and no asyncio engine exists without it)."""
    try:
        from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
    except ImportError:
        return ""
    return " (pass its .sync_engine)" if isinstance(bind, AsyncEngine) else \
        " (pass its .sync_connection)" if isinstance(bind, AsyncConnection) else ""


def _noop_poll(job_id: uuid.UUID, generation: int, seq: int, countdown: float,
               status: str | None = None) -> None:
    return None


@dataclass
class Runtime:
    settings: Settings
    sessions: sessionmaker[Session]
    storage: Storage
    http: requests.Session | None = None
    clock: Callable[[], datetime] = utcnow
    enqueue_create: Callable[..., None] = _noop_create
    # (job_id, generation, seq, countdown[, status=]): ``status`` is the provider's status the
    # chain's last read saw, for the next turn to store; a callable without a ``status``
    # keyword still works (the status is then not carried: README, The provider's last status)
    enqueue_poll: Callable[..., None] = _noop_poll
    pricing_hook: PricingHook | None = None
    watermark_hook: WatermarkHook | None = None
    completion_hooks: dict[str, CompletionHook] = field(default_factory=dict)  # by provider_kind
    event_hooks: list[EventHook] = field(default_factory=list)
    # named crash points for the reliability harness (None in production)
    crash_hook: Callable[[str], None] | None = None
    # this process's live worker id (reconcile.worker.heartbeat), recorded on every claim it
    # writes (jobs.claimed_by); None: no heartbeat here, claims end at their lease only
    worker_id: str | None = None
    # the credit backend (the ledger seam); the library's own ledger by default
    ledger: Ledger = field(default_factory=lambda: DEFAULT_LEDGER)
    # what a finished job commits and refunds (reconcile.settlement); the ledger executes it.
    # Always the settings' (RECONCILE_FAILURE_REFUND / CANCEL_REFUND): a different one given
    # here, or assigned later, is refused (ValueError) — every process settles alike
    # (None given: the settings' policy, set by __post_init__; never None after it)
    settlement_policy: SettlementPolicy = None  # type: ignore[assignment]
    # values read once from the database and never changed (the adoption time)
    adoption_cache: dict[str, Any] = field(default_factory=dict, repr=False)
    _clients: dict[str, Any] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        check_sessions(self.sessions)  # a factory every step can open its own sessions from
        # a name that protects nothing must stop the process, not be a silent no-op
        check_observe_only(self.settings.observe_only_kinds)
        # every process registers every kind its rows may carry (README, Design notes: Legacy
        # rows): an unknown kind is never settled by a guess, so a missing one stops the process
        check_required_kinds(self.settings.required_kinds)
        check_required_kinds(self.completion_hooks, "completion_hooks")
        # set through __setattr__'s check: None takes the settings' policy
        self.settlement_policy = self.settlement_policy

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "settlement_policy":
            value = _settings_policy(self.settings, value)
        elif name == "settings" and "settlement_policy" in self.__dict__:
            # new settings bring their own policy (the one every process reads from them)
            super().__setattr__("settings", value)
            super().__setattr__("settlement_policy", _settings_policy(value, None))
            return
        super().__setattr__(name, value)

    @classmethod
    def from_settings(cls, settings: Settings, **kwargs: Any) -> Runtime:
        from .storage import storage_from_settings

        check_sync_deadline(settings)  # start-up: a sync call's deadline fits its kind
        engine = engine_for(settings.database_url)
        # start-up: a table that breaks the contract refuses here, not at a customer's submit
        require_contract(engine)
        sessions = make_sessionmaker(engine)
        return cls(settings=settings, sessions=sessions,
                   storage=kwargs.pop("storage", None) or storage_from_settings(settings), **kwargs)

    def now(self) -> datetime:
        return self.clock()

    def kind(self, name: str | None) -> Kind | None:
        return get_kind(name)

    def client(self, kind: Kind) -> AsyncProvider | SyncProvider:
        """The (cached) provider client for ``kind``."""
        with self._lock:
            client = self._clients.get(kind.name)
            if client is None:
                client = self._clients[kind.name] = kind.build(self.settings, self.http)
            return client

    def crash_point(self, name: str) -> None:
        if self.crash_hook is not None:
            self.crash_hook(name)

    def webhook_url(self, provider: str, job_id: uuid.UUID) -> str | None:
        """The callback URL planted in a create, carrying the job id in its query string."""
        base = self.settings.webhook_base_url
        if not base:
            return None
        return f"{base.rstrip('/')}/webhooks/{provider}?job_id={job_id}"


from .core.facade import names_moved as _names_moved  # noqa: E402

_names_moved(__name__)
