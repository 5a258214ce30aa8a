"""Internal: The one place the environment is read.

Every setting is ``RECONCILE_<NAME>``; build a :class:`Settings` at the edge (worker start,
CLI, request handler) and pass it in. Durations in the library are ``timedelta`` and are
multiplied by ``TIME_SCALE`` (demo and tests only) through :meth:`Settings.scaled`.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from functools import lru_cache
from typing import TYPE_CHECKING, Annotated, Any, Literal, Self, cast

from pydantic import Field, PlainValidator, create_model, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from .core import family_settings
from .core.redact import remember_secrets
from .settlement import SettlementPolicy

__all__ = [
    "DEFAULT_SQLITE_URL", "LegacySweep", "PollMode", "QueueLayout", "Settings", "get_settings",
]

DEFAULT_SQLITE_URL = "sqlite:///reconcile.db"
# the longest duration any seconds setting may name (about 3 years), and the largest time
# scale: a duration past them overflows once it is scaled or added to now (Python's timedelta
# ends at 999,999,999 days), which a process would meet at start-up without the setting's name
MAX_SECONDS = 1e8
MAX_TIME_SCALE = 100.0
# the smallest time scale (the tests' fastest): below it a scaled lease or interval is a few
# microseconds and rounds to zero (a timedelta's resolution), so every claim ends as it is taken
MIN_TIME_SCALE = 1e-4
# the shortest heartbeat (0 turns it off): each beat is a write per worker process, so an
# interval of a microsecond is a renewal loop that spins one core against the database
MIN_HEARTBEAT_INTERVAL = 0.1
# the longest retention a day count may name (about 2,700 years; None keeps everything)
MAX_RETENTION_DAYS = 1_000_000
# the shortest retention of job events and webhook deliveries (the settings' and the prune's
# bound, reconcile.jobstore.retention): deliveries also dedupe replays, and a replay older than
# a day fails the providers' timestamp checks anyway
MIN_RETENTION = timedelta(days=1)
LegacySweep = Literal["observe", "enforce", "off"]
PollMode = Literal["chain", "batch"]
QueueLayout = Literal["split", "single"]


def _share(value: object) -> Fraction:
    """A refund share as an exact fraction: ``"1/2"``, ``"1"``, ``"0"``, ``"0.25"`` (an exact
    decimal), an int, a Fraction or a Decimal — never a float (its binary value is not the
    decimal written) nor NaN or infinity. The range and the denominator bound are
    :class:`~reconcile.settlement.SettlementPolicy`'s own checks, applied by
    :attr:`Settings.settlement_policy` and at construction (:meth:`Settings._policy`)."""
    if isinstance(value, bool) or isinstance(value, float):
        raise ValueError(f"a refund share is an exact fraction such as 1/2 or 0.25, not {value!r}")
    if isinstance(value, (int, Fraction)):
        return Fraction(value.numerator, value.denominator)
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise ValueError(f"a refund share is a fraction between 0 and 1, not {value}")
        return Fraction(value)
    if isinstance(value, str):
        text = value.strip()
        try:
            if "/" in text:
                num, _, den = text.partition("/")
                if not (num.strip().isdigit() and den.strip().isdigit()):
                    raise ValueError(text)
                return Fraction(int(num), int(den))
            number = Decimal(text)
        except (ValueError, ZeroDivisionError, InvalidOperation):
            raise ValueError(f"a refund share is an exact fraction such as 1/2, 1, 0 or 0.25, "
                             f"not {value!r}") from None
        if not number.is_finite() or not -18 <= int(number.as_tuple().exponent) <= 18:
            raise ValueError(f"a refund share is a fraction between 0 and 1, not {value!r}")
        return Fraction(number)
    raise ValueError(f"a refund share is an exact fraction such as 1/2 or 0.25, not {value!r}")


_Share = Annotated[Fraction, PlainValidator(_share)]


class _Redacted:
    """Marks a field whose value is redacted wherever the library logs or stores text
    (:func:`reconcile.core.redact.text`): a credential or a webhook secret."""

    def __repr__(self) -> str:
        return "REDACTED"


# a retention in days, as both retention settings declare it (reconcile prune's own bound)
_RetentionDays = Annotated[float, Field(ge=MIN_RETENTION / timedelta(days=1),
                                        le=MAX_RETENTION_DAYS)]
_REDACTED = _Redacted()
_Secret = Annotated[str, _REDACTED]
_OptionalSecret = Annotated[str | None, _REDACTED]


class Settings(BaseSettings):
    """The library's settings, ``RECONCILE_<FIELD>`` each.

    A provider family's own fields (``kie_base_url``, ``kie_api_key``, ``fal_webhook_user_id``…,
    read from ``RECONCILE_KIE_BASE_URL``…) are not written here: each family declares them in its
    ``FAMILY`` (``urls``, ``secrets``, ``settings``, with their defaults;
    :mod:`reconcile.providers.family`), and ``Settings(...)`` builds an instance of
    :meth:`with_families`, this class with those fields added — a ``secrets`` field redacted
    like every ``_Secret`` here. ``Settings.model_fields`` holds the library's own fields,
    ``Settings.with_families().model_fields`` every field.
    """

    # every number setting is finite: a timeout, interval, budget or scale of NaN or infinity is
    # refused at start-up (each also has its own lower bound below), never found at a call
    model_config = SettingsConfigDict(env_prefix="RECONCILE_", extra="ignore",
                                      allow_inf_nan=False)

    if TYPE_CHECKING:
        # a provider family's field (with_families): a str, or None where it is declared with
        # the default None and left unset
        def __getattr__(self, name: str) -> str: ...

    def __new__(cls, *args: Any, **kwargs: Any) -> Self:
        return cast(Self, super().__new__(cls.with_families() if cls is Settings else cls))

    @classmethod
    def model_construct(cls, _fields_set: set[str] | None = None, **values: Any) -> Self:
        if cls is Settings:  # the families' fields get their defaults too
            return cast(Self, cls.with_families().model_construct(_fields_set, **values))
        return super().model_construct(_fields_set, **values)

    @classmethod
    def with_families(cls) -> type[Settings]:
        """This class with every built-in provider family's fields (built once, on the first
        call: the families' packages are imported then, never when this module is; the fields
        come through :mod:`reconcile.core.family_settings`, this layer being below theirs)."""
        global _WITH_FAMILIES
        with _DERIVING:
            if _WITH_FAMILIES is None:
                fields: dict[str, Any] = {}
                for declared in family_settings.declared():
                    kind: Any = str if declared.default is not None else str | None
                    fields[declared.name] = (Annotated[kind, _REDACTED] if declared.secret
                                             else kind, declared.default)
                _WITH_FAMILIES = create_model("Settings", __base__=Settings,
                                              __module__=__name__, **fields)
        return _WITH_FAMILIES

    # Storage and plumbing
    database_url: str = DEFAULT_SQLITE_URL
    broker_url: str = "filesystem://"
    broker_folder: str = ".reconcile-broker"
    # must exceed the longest task (600 s) plus the longest poll countdown; tests shorten it
    broker_visibility_timeout: int = Field(default=3600, gt=0, le=MAX_SECONDS)
    # RabbitMQ's consumer_timeout as the server enforces it (server default 30 min): declare a
    # lower one here and workers refuse to start if a delivery could outlive it
    broker_consumer_timeout: float = Field(default=1800.0, gt=0, le=MAX_SECONDS)
    # the longest countdown any published message carries (seconds, never scaled); longer
    # waits ride on create_not_before + the sweep. max_countdown + task_time_limit must stay
    # below the visibility timeout / consumer_timeout (checked at worker start)
    max_countdown: float = Field(default=300.0, ge=0, le=MAX_SECONDS)
    task_time_limit: int = Field(default=600, gt=0, le=MAX_SECONDS)
    # SIGQUIT (or SIGTERM with REMAP_SIGTERM=SIGQUIT): running tasks get this long, then held
    # messages are requeued at once; keep it below the supervisor's stop grace period
    worker_soft_shutdown_timeout: float = Field(default=30.0, ge=0, le=MAX_SECONDS)
    storage_url: str = "file://./reconcile-media"
    s3_endpoint_url: str | None = None
    s3_region: str = "us-east-1"
    media_public_base_url: str | None = None
    media_allowed_hosts: list[str] = Field(default_factory=list)
    media_max_bytes: int = Field(default=512 * 1024 * 1024, gt=0)
    # the whole exchange of one output fetch, redirects included (at most a day: a success's
    # storing mark, lifecycle.storing_hold, is this per output, times max_outputs_per_job)
    media_timeout: float = Field(default=120.0, gt=0, le=86_400)
    # more fails the job UPSTREAM_OUTPUT_LIMIT (refunded)
    max_outputs_per_job: int = Field(default=64, ge=1, le=10_000)
    # refused with 413 before parsing
    webhook_max_body_bytes: int = Field(default=1024 * 1024, gt=0)
    max_input_bytes: int = Field(default=1024 * 1024, gt=0)  # a job's input, as compact JSON
    max_job_type_length: int = Field(default=200, ge=1)
    webhook_base_url: str | None = None
    events_redis_url: str | None = None

    # Sweep
    sweep_interval: float = Field(default=300.0, gt=0, le=MAX_SECONDS)  # seconds
    # rows without provider_kind or submission_state (README, Design notes: Legacy rows): "observe"
    # logs and counts what it would fail; "enforce" fails + refunds; "off"
    legacy_sweep: LegacySweep = "observe"
    # only rows created before it are legacy candidates (default: reconcile_meta.adopted_at)
    legacy_cutoff: datetime | None = None
    # a candidate's age before it is failed (default: the registry's longest exhaustion horizon)
    legacy_age: timedelta | None = None
    legacy_job_types: list[str] = Field(default_factory=list)  # allow-list; empty: every type
    legacy_exclude_job_types: list[str] = Field(default_factory=list)
    # kinds the sweep only logs; "legacy" names the rows without a kind, "*" every row
    observe_only_kinds: list[str] = Field(default_factory=list)
    # kinds every process must have registered (checked at start-up): the kinds your rows carry
    required_kinds: list[str] = Field(default_factory=list)
    # seconds of rows a tick carries out inline, on its one process; past it the rest fans out
    # to every worker process (a backlog is drained by all of them, not by the tick's alone:
    # bench figure 2, 10,000 rows on 2 cores, 20 s inline 128 jobs/s, 5 s 146)
    sweep_time_budget: float = Field(default=5.0, ge=0, le=MAX_SECONDS)
    # rows the sweep task carries out at once per process (status reads, media, each row's own
    # transactions), inline and in each fanned-out chunk (reconcile.reconcile_jobs is sent
    # tasks.CHUNK_ROWS_PER_THREAD times this many and carries them out this many at a time).
    # Keep it within the engine's pool (5): each row holds a connection, and an overflow
    # connection is closed when it is returned (bench figure 2 on 2 cores: 4 threads 89 jobs/s,
    # 1 thread 76, 8 threads 62)
    sweep_threads: int = Field(default=4, ge=1, le=64)

    # The settlement policy (reconcile.settlement): the share of what a failed / a user-
    # cancelled job holds that goes back to the user, exact ("1/2", "0.25", "1"). Deployment
    # configuration: every process (worker, beat, gateway, the reconcile command, the audit)
    # reads the same one; Runtime refuses a policy that differs from it
    failure_refund: _Share = Fraction(1)
    cancel_refund: _Share = Fraction(1)

    # Polling (reconcile.lifecycle.batch): "batch" (the default) — the due time lives on the
    # row (jobs.poll_due_at) and reconcile.poll_due (beat, and each worker's fallback tick)
    # claims due rows in batches (FOR UPDATE SKIP LOCKED) and reads them concurrently;
    # "chain" — one broker message per poll
    poll_mode: PollMode = "batch"
    # rows claimed per statement; the default equals poll_batch_threads: one round of reads,
    # each inside the claim lease (a larger size reads in rounds: README, Batch polling)
    poll_batch_size: int = Field(default=32, ge=1, le=5000)
    poll_batch_threads: int = Field(default=32, ge=1, le=256)  # concurrent status reads
    # per-job outcomes of one round (completions: media download + upload, the completion's
    # CAS and ledger commit; failures; errors) finalized at once per process, each in its own
    # transactions; bounded below the engine's pool (5 + 5 overflow connections)
    poll_batch_finalize_threads: int = Field(default=8, ge=1, le=64)
    # s between beat's poll_due ticks (scaled)
    poll_batch_interval: float = Field(default=1.0, gt=0, le=MAX_SECONDS)
    # seconds one poll_due run keeps claiming while rows are due (scaled); then it ends and
    # re-enqueues itself at the queue's tail, so create messages queued meanwhile wait at most
    # about this long for a pool process
    poll_batch_time_budget: float = Field(default=5.0, gt=0, le=MAX_SECONDS)
    # "split": creates, polls and the sweep on queues of their own (reconcile.create,
    # reconcile.poll, reconcile.sweep; the rest on reconcile), so a burst of submissions never
    # delays the in-flight jobs' reads; "single": every task but the sweep on reconcile (the
    # layout before the split; for a rolling upgrade whose old workers consume only reconcile)
    queue_layout: QueueLayout = "split"
    # worker liveness (reconcile.worker.heartbeat): each worker process renews its row in
    # reconcile_workers every heartbeat_interval seconds (0: no heartbeat, claims end at their
    # lease only); a row not renewed for heartbeat_timeout seconds is a dead process, whose
    # create claims become uncertain and whose poll turns and batch claims are released at once.
    # Wall-clock seconds, never scaled: worker hosts' clocks must agree (NTP), as leases need
    heartbeat_interval: float = Field(default=2.0, ge=0, le=MAX_SECONDS)
    heartbeat_timeout: float = Field(default=6.0, gt=0, le=MAX_SECONDS)
    time_scale: float = Field(default=1.0, ge=MIN_TIME_SCALE, le=MAX_TIME_SCALE)
    # retention (`reconcile prune`, and the beat's prune entry when either is set); None: keep
    job_events_retention_days: _RetentionDays | None = None
    webhook_deliveries_retention_days: _RetentionDays | None = None

    # Providers: each family's fields (<family>_base_url, <family>_api_key, …) are declared by
    # the family (its FAMILY's urls, secrets, settings: reconcile.providers.family) and added by
    # with_families(), the class every Settings(...) is; these are the ones they all share
    connect_timeout: float = Field(default=5.0, gt=0, le=MAX_SECONDS)
    read_timeout: float = Field(default=30.0, gt=0, le=MAX_SECONDS)
    sync_read_timeout: float = Field(default=300.0, gt=0, le=MAX_SECONDS)
    # a sync call's TOTAL deadline (connect + every read), ≤ each sync kind's threshold − 60 s:
    # checked at start-up (reconcile.sync.check_sync_deadline); scaled by TIME_SCALE
    sync_deadline: float = Field(default=240.0, gt=0, le=MAX_SECONDS)

    @field_validator("legacy_sweep", mode="before")
    @classmethod
    def _legacy_mode(cls, value: object) -> object:
        # the former boolean switch: true meant "sweep legacy rows", false "leave them"
        if isinstance(value, bool):
            return "enforce" if value else "off"
        if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0"):
            return "enforce" if value.strip().lower() in ("true", "1") else "off"
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("poll_mode", "queue_layout", mode="before")
    @classmethod
    def _poll_mode(cls, value: object) -> object:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("legacy_age", mode="before")
    @classmethod
    def _seconds(cls, value: object) -> object:
        # like every other duration setting, a plain number is seconds (ISO 8601 also works)
        if isinstance(value, str):
            try:
                return timedelta(seconds=float(value))
            except (ValueError, OverflowError):  # not a number, or no duration: pydantic says
                return value
        return value

    @field_validator("legacy_cutoff")
    @classmethod
    def _aware(cls, value: datetime | None) -> datetime | None:
        return value.replace(tzinfo=UTC) if value is not None and value.tzinfo is None else value

    @field_validator("legacy_age")
    @classmethod
    def _positive_age(cls, value: timedelta | None) -> timedelta | None:
        # an age of zero or less would make every legacy row old enough to fail at once
        if value is not None and value <= timedelta(0):
            raise ValueError(f"must be a positive duration, not {value}")
        return value

    @field_validator("heartbeat_interval")
    @classmethod
    def _beat_floor(cls, value: float) -> float:
        if 0 < value < MIN_HEARTBEAT_INTERVAL:
            raise ValueError(f"must be 0 (no heartbeat) or at least {MIN_HEARTBEAT_INTERVAL} s, "
                             f"not {value}")
        return value

    @model_validator(mode="after")
    def _heartbeat(self) -> Settings:
        # a lapse needs at least two missed beats: one late beat on a busy host is not a death
        if self.heartbeat_interval and self.heartbeat_timeout < 2 * self.heartbeat_interval:
            raise ValueError(f"HEARTBEAT_TIMEOUT ({self.heartbeat_timeout} s) must be at least "
                             f"twice HEARTBEAT_INTERVAL ({self.heartbeat_interval} s)")
        return self

    def model_post_init(self, context: object) -> None:
        """The configured secrets' values (every ``_Secret`` field) are redacted wherever the
        library logs or stores text (:func:`reconcile.core.redact.text`)."""
        remember_secrets(*(getattr(self, name) for name in self.secret_fields()))

    @classmethod
    def env_name(cls, field: str) -> str:
        """The environment variable that sets ``field`` (``RECONCILE_<FIELD>``)."""
        return f"{cls.model_config.get('env_prefix', '')}{field}".upper()

    @classmethod
    def secret_fields(cls) -> tuple[str, ...]:
        """The fields whose values are redacted (credentials and webhook secrets)."""
        return tuple(name for name, info in cls.with_families().model_fields.items()
                     if any(isinstance(m, _Redacted) for m in info.metadata))

    @field_validator("failure_refund", "cancel_refund", mode="after")
    @classmethod
    def _policy_share(cls, value: Fraction, info: object) -> Fraction:
        # SettlementPolicy's own checks (range, denominator bound), for this one share
        name = getattr(info, "field_name", "failure_refund")
        share: Fraction = getattr(SettlementPolicy(**{name: value}), name)
        return share

    @property
    def settlement_policy(self) -> SettlementPolicy:
        """THE settlement policy of this deployment (``FAILURE_REFUND``, ``CANCEL_REFUND``):
        every Runtime built on these settings settles with it, and the audit checks with it."""
        return SettlementPolicy(failure_refund=self.failure_refund,
                                cancel_refund=self.cancel_refund)

    def scaled(self, duration: timedelta) -> timedelta:
        """``duration`` multiplied by ``TIME_SCALE`` (1.0 in production)."""
        return duration * self.time_scale

    @property
    def poll_due_tick(self) -> tuple[float, float]:
        """Batch mode's beat tick: ``(every, expires)`` in seconds — ``reconcile.poll_due`` every
        ``POLL_BATCH_INTERVAL`` (scaled, at least 0.05 s), each tick expiring when not picked up
        within its interval (at least 1 s): a worker that receives it later drops it unrun,
        so a busy worker never runs a backlog of ticks (on Redis an expired tick stays queued
        until a worker receives it)."""
        every = max(0.05, self.poll_batch_interval * self.time_scale)
        return every, max(1.0, every)


_DERIVING = threading.RLock()  # a Settings() built while the families load fails, never hangs
_WITH_FAMILIES: type[Settings] | None = None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings read from the environment (edges only)."""
    return Settings()


from .core.facade import names_moved as _names_moved  # noqa: E402

_names_moved(__name__)
