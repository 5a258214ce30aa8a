"""The settlement rule as deployment configuration and as one function (issue 24, section 1):
the documented path × cause × credits-kept table (README, The share of a failed or cancelled
job: ``docs/explanation/lifecycle.md``) is checked against ``refund_share`` and
``settlement_cause`` cell by cell, the settings parse exact shares only, and a Runtime never
settles under a policy other than its settings'."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import ValidationError
from sqlalchemy import create_engine
from sqlalchemy.orm import sessionmaker

from reconcile import Runtime, Settings
from reconcile.kinds import get_kind
from reconcile.settlement import (
    MAX_SHARE_DENOMINATOR,
    Cause,
    SettlementPolicy,
    kept_of,
    refund_share,
    settlement_cause,
)

PAGE = Path(__file__).resolve().parents[2] / "docs" / "explanation" / "lifecycle.md"
F, C = Fraction(1, 2), Fraction(1, 3)
POLICY = SettlementPolicy(failure_refund=F, cancel_refund=C)

# each column of the documented table: a representative row of that path, accepted or not
COLUMNS: dict[str, dict[str, Any]] = {
    "async, task id": dict(submission_state="accepted", provider_kind="kie-standard",
                           provider_task_id="t-1", error_code="UPSTREAM_FAILED"),
    "async, no task id": dict(submission_state="submitting", provider_kind="kie-standard",
                              provider_task_id=None, error_code="UPSTREAM_FAILED"),
    "sync, answered": dict(submission_state="submitting", provider_kind="kie-llm",
                           provider_task_id=None, error_code="UPSTREAM_EMPTY_RESULT"),
    "sync, not answered": dict(submission_state="submitting", provider_kind="kie-llm",
                               provider_task_id=None, error_code="UPSTREAM_FAILED"),
    "platform row, task id": dict(submission_state=None, provider_kind="kie-standard",
                                  provider_task_id="t-1", error_code="UPSTREAM_FAILED"),
    "platform row, no task id": dict(submission_state=None, provider_kind="kie-llm",
                                     provider_task_id=None, error_code="UPSTREAM_FAILED"),
}


def _table() -> tuple[list[str], dict[str, list[str]]]:
    lines = PAGE.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| cause | async, task id"))
    header = [cell.strip() for cell in lines[start].strip("|").split("|")]
    rows: dict[str, list[str]] = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows[cells[0].strip("`")] = cells[1:]
    return header[1:], rows


def _share_of(cell: str) -> Fraction:
    return {"keeps F": F, "keeps C": C, "0": Fraction(1)}[cell]


def test_the_readme_table_is_the_rule_for_every_cause_and_path() -> None:
    """Every cause has a row, every column is a path the code reads, and every cell is the
    share ``refund_share`` gives; the column's "accepted" is what ``settlement_cause`` reads
    from a row of that path."""
    columns, rows = _table()
    assert columns == list(COLUMNS)
    assert set(rows) == {cause.value for cause in Cause}
    sync_kind = get_kind("kie-llm")
    assert sync_kind is not None and sync_kind.sync
    for name, cells in rows.items():
        for column, cell in zip(columns, cells, strict=True):
            accepted = "no task id" not in column and "not answered" not in column
            row = SimpleNamespace(status="failed", error_detail=None, **COLUMNS[column])
            _, read = settlement_cause(row, kind=get_kind(row.provider_kind))
            assert read is accepted, column
            assert refund_share(Cause(name), accepted, POLICY) == _share_of(cell), (name, column)
            assert kept_of(40, _share_of(cell)) == {"keeps F": 20, "keeps C": 26, "0": 0}[cell]


@pytest.mark.parametrize(("row", "cancel", "expected"), [
    (dict(status="cancelled", error_code="CANCELED", provider_task_id="t"), False,
     (Cause.USER_CANCEL, True)),
    # a poll read the provider's "canceled" after the user asked: still the user's cancel
    (dict(status="failed", error_code="UPSTREAM_FAILED", provider_task_id="t"), True,
     (Cause.USER_CANCEL, True)),
    (dict(status="failed", error_code="UPSTREAM_FAILED", provider_task_id="t"), False,
     (Cause.UPSTREAM_FAILURE, True)),
    (dict(status="failed", error_code="INVALID_PARAM", submission_state="rejected"), False,
     (Cause.REJECTED_CREATE, False)),
    (dict(status="failed", error_code="RECONCILE_NO_RECOVERY", submission_state="rejected",
          error_detail={"resolved": "not_submitted"}), False, (Cause.NOT_SUBMITTED, False)),
    (dict(status="failed", error_code="RECONCILE_NO_RECOVERY", provider_task_id="t",
          error_detail={"by": "operator"}), False, (Cause.OPERATOR_FAIL, True)),
    (dict(status="failed", error_code="UPSTREAM_TIMEOUT", provider_task_id="t",
          error_detail={"attempts": 18}), False, (Cause.EXHAUSTION, True)),
])
def test_the_cause_is_read_from_the_row(row: dict[str, Any], cancel: bool,
                                        expected: tuple[Cause, bool]) -> None:
    values = dict(submission_state="accepted", provider_kind="kie-standard",
                  provider_task_id=None, error_detail=None)
    values.update(row)
    job = SimpleNamespace(**values)
    assert settlement_cause(job, kind=get_kind(job.provider_kind), cancel_requested=cancel) \
        == expected


@pytest.mark.parametrize(("text", "share"), [
    ("1/2", Fraction(1, 2)), ("1", Fraction(1)), ("0", Fraction(0)), ("0.25", Fraction(1, 4)),
    (" 1/3 ", Fraction(1, 3)), ("0.1", Fraction(1, 10)),
])
def test_a_share_is_read_exactly_from_the_environment(
        monkeypatch: pytest.MonkeyPatch, text: str, share: Fraction) -> None:
    monkeypatch.setenv("RECONCILE_FAILURE_REFUND", text)
    monkeypatch.setenv("RECONCILE_CANCEL_REFUND", "1/3")
    assert Settings().settlement_policy == SettlementPolicy(failure_refund=share,
                                                            cancel_refund=Fraction(1, 3))


@pytest.mark.parametrize("bad", [
    0.5, "nan", "NaN", "inf", "-1/2", "-0.5", "3/2", "1.5", "1/0", "abc", "", "1e-40", "1e400",
    f"1/{MAX_SHARE_DENOMINATOR + 1}", "0.0000000001", True,
])
def test_a_share_that_is_not_an_exact_fraction_between_0_and_1_is_refused(bad: Any) -> None:
    """Floats (their binary value is not the decimal written), NaN, infinities, negatives,
    shares above 1 and denominators past the bound stop the process at start-up."""
    with pytest.raises(ValidationError):
        Settings(failure_refund=bad)
    with pytest.raises(ValidationError):
        Settings(cancel_refund=bad)


def _runtime(settings: Settings, **kwargs: Any) -> Runtime:
    # a sessionmaker that never connects (the policy checks touch no database)
    return Runtime(settings=settings, sessions=sessionmaker(create_engine("sqlite://")),
                   storage=None, **kwargs)  # type: ignore[arg-type]


def test_a_runtime_takes_its_settings_policy_and_refuses_another() -> None:
    """Money rules must not depend on which process got there first: a Runtime's policy is its
    settings', a different one given or assigned raises, the same one is accepted."""
    settings = Settings(failure_refund="1/2", cancel_refund="1/3")
    rt = _runtime(settings)
    assert rt.settlement_policy == POLICY
    assert _runtime(settings, settlement_policy=POLICY).settlement_policy == POLICY
    with pytest.raises(ValueError, match="RECONCILE_FAILURE_REFUND"):
        _runtime(settings, settlement_policy=SettlementPolicy())
    with pytest.raises(ValueError, match="differs from the settings"):
        rt.settlement_policy = SettlementPolicy(cancel_refund=Fraction(1, 2))
    assert rt.settlement_policy == POLICY
    rt.settlement_policy = POLICY  # the same one: nothing changes
    rt.settings = Settings()  # a new configuration brings its own policy
    assert rt.settlement_policy == SettlementPolicy()
    with pytest.raises(ValueError):
        _runtime(Settings(), settlement_policy=POLICY)


def test_the_audit_refuses_a_policy_other_than_its_settings() -> None:
    from reconcile.audit import run

    with pytest.raises(ValueError, match="differs from the settings"):
        run(None, now=None, settings=Settings(failure_refund="1/2"),  # type: ignore[arg-type]
            policy=SettlementPolicy())
