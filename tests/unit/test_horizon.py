"""The one home of the exhaustion horizon (``reconcile.jobstore.horizon``): the sweep's table and
the audit read the same deadline for a sync call, and the kind horizon is what the legacy age and
a fresh job's deadline say."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

from reconcile import Settings
from reconcile.audit._jobs import _past_horizon
from reconcile.jobstore import horizon
from reconcile.jobstore.adoption import default_legacy_age
from reconcile.kinds import all_kinds, get_kind
from reconcile.sweep.table import Action, decide

T = datetime(2026, 12, 2, 3, 0, tzinfo=UTC)


def _row(**values: Any) -> Any:
    base = dict(id=None, user_id=None, status="pending", submission_state="submitting",
                provider_kind="anthropic-sync", provider_task_id=None,
                provider_call_started_at=T, started_at=T, created_at=T, claim_expires_at=None,
                reconcile_attempts=0, reconcile_last_attempt_at=None, poll_lease_expires_at=None,
                poll_due_at=None, job_type="writer", storing_until=None, storing_count=None)
    base.update(values)
    return SimpleNamespace(**base)


def test_the_audit_holds_a_sync_call_until_its_claim_ends_as_the_sweep_does() -> None:
    """A sync call's claim (360 s: SYNC_DEADLINE + 2 min) outlives its kind's threshold (300 s).
    The sweep leaves the call until the claim ends; the audit called it late at the threshold
    plus its slack (on main, with a 30 s sweep interval and no grace: at 331 s, while the sweep
    still rightly left it). Both now read ``horizon.call_deadline``."""
    settings = Settings.model_construct(sweep_interval=30.0)
    kind = get_kind("anthropic-sync")
    assert kind is not None
    row = _row(claim_expires_at=T + timedelta(seconds=360))

    def audit_late(at: datetime) -> bool:
        a = SimpleNamespace(settings=settings, grace=timedelta(0), now=at)
        return _past_horizon(a, row) is not None  # type: ignore[arg-type]

    at = T + timedelta(seconds=340)
    assert decide(settings, row, kind, at).action is Action.LEAVE
    assert not audit_late(at)
    assert horizon.exhaustion_deadline(settings, row) == T + timedelta(seconds=360)
    later = T + timedelta(seconds=360)
    assert decide(settings, row, kind, later).action is Action.FAIL
    assert audit_late(later + timedelta(seconds=31))


def test_a_platform_row_with_a_live_call_claim_is_left_and_without_one_failed_at_its_threshold() -> None:
    settings = Settings.model_construct()
    kind = get_kind("anthropic-sync")
    assert kind is not None
    claimed = _row(submission_state=None, status="processing",
                   claim_expires_at=T + timedelta(seconds=360))
    plumbed = _row(submission_state=None, status="processing")
    at = T + timedelta(seconds=302)
    assert decide(settings, claimed, kind, at).action is Action.LEAVE
    assert decide(settings, plumbed, kind, at).action is Action.FAIL
    assert decide(settings, claimed, kind, T + timedelta(seconds=360)).action is Action.FAIL


def test_a_fresh_async_jobs_deadline_is_its_kind_horizon_and_the_legacy_age_the_longest() -> None:
    settings = Settings.model_construct(time_scale=0.5)
    for kind in all_kinds():
        if kind.sync:
            continue
        row = _row(provider_kind=kind.name, submission_state="accepted", status="processing")
        assert horizon.exhaustion_deadline(settings, row) == \
            T + settings.scaled(horizon.kind_horizon(kind))
    assert default_legacy_age() == max(horizon.kind_horizon(k) for k in all_kinds())


def test_a_success_still_being_stored_moves_the_deadline_to_its_mark_and_the_audit_with_it() -> None:
    """A counted storer under a mark later than the deadline: no failure at the horizon before
    the mark ends (``lifecycle.exhaust``), so the deadline is the mark's end and the audit does
    not report the job before it. A mark whose storers all failed (count 0), or an earlier one,
    moves nothing."""
    settings = Settings()
    row = _row(provider_kind="replicate-prediction", submission_state="accepted",
               status="processing", provider_task_id="t")
    plain = horizon.exhaustion_deadline(settings, row)
    assert plain is not None
    later = plain + timedelta(minutes=7)
    marked = _row(**{**vars(row), "storing_until": later, "storing_count": 2})
    assert horizon.exhaustion_deadline(settings, marked) == later
    for moves_nothing in ({"storing_until": later, "storing_count": 0},
                          {"storing_until": plain - timedelta(minutes=1), "storing_count": 1}):
        assert horizon.exhaustion_deadline(settings, _row(**{**vars(row), **moves_nothing})) == plain
    grace = timedelta(minutes=10) - timedelta(seconds=settings.sweep_interval)
    for at, reported in ((plain + timedelta(minutes=11), False), (later + timedelta(minutes=11), True)):
        a = SimpleNamespace(settings=settings, grace=grace, now=at)
        assert (_past_horizon(a, marked) is not None) is reported, at


class _Only:
    """A row holding only ``names`` of ``row``: reading any other column raises."""

    def __init__(self, row: Any, names: tuple[str, ...]) -> None:
        self._values = {name: getattr(row, name) for name in names}

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["_values"][name]
        except KeyError:
            raise AttributeError(f"the deadline read {name!r}, not in DEADLINE_COLUMNS") from None


def test_the_exhaustion_deadline_reads_only_its_declared_columns() -> None:
    """The create step's claim returns only ``DEADLINE_COLUMNS`` (with the request's columns),
    and a 429 computes the job's horizon from that row: a column the deadline reads beyond them
    would fail that path only."""
    settings = Settings()
    rows = [_row(provider_kind=kind.name, submission_state=state, claim_expires_at=claim,
                 reconcile_attempts=attempts, reconcile_last_attempt_at=last,
                 poll_lease_expires_at=lease, storing_until=storing, storing_count=count)
            for kind in all_kinds()[:40]
            for state in ("submitting", "uncertain", "accepted")
            for claim, attempts, last, lease, storing, count in [
                (None, 0, None, None, None, None),
                (T + timedelta(minutes=9), 2, T + timedelta(minutes=1), None, None, None),
                (None, 0, None, T + timedelta(minutes=3), T + timedelta(days=2), 1)]]
    rows.append(_row(provider_kind="no-such-kind"))
    for row in rows:
        assert horizon.exhaustion_deadline(settings, _Only(row, horizon.DEADLINE_COLUMNS)) == \
            horizon.exhaustion_deadline(settings, row)
