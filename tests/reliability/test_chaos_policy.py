"""The chaos run's settlement policy and platform rows (issue 24, section 3): ``--policy``
(``make chaos POLICY=1/2,1/3``; drawn from the seed when not given) reaches the config and the
replay line, the plan mixes in platform rows of an unknown and of the observe-only kind, and the
checks hold every settled job to the one share rule and every platform row to "left alone".

The full runs are ``make chaos``'s; these check the pieces without workers."""

from __future__ import annotations

import importlib
import uuid
from collections import Counter
from fractions import Fraction
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from reconcile.kinds import get_kind
from reconcile.settlement import SettlementPolicy
from reconcile.testing.chaos import ChaosConfig, ChaosReport, make_plan
from reconcile.testing.chaos.plan import OBSERVED_KIND, UNKNOWN_KIND
from reconcile.testing.chaos.platform_rows import check_platform_rows
from reconcile.testing.chaos.policy import (
    POLICY_CHOICES,
    check_kept,
    choose_policy,
    parse_policy,
    policy_env,
    policy_text,
)

chaos_run = importlib.import_module("reconcile.testing.chaos.run")  # the package's run() shadows it
HALF_THIRD = SettlementPolicy(failure_refund=Fraction(1, 2), cancel_refund=Fraction(1, 3))


@pytest.mark.parametrize(("text", "policy"), [
    ("1/2,1/3", HALF_THIRD), (" 1/2 , 1/3 ", HALF_THIRD),
    ("0.5", SettlementPolicy(failure_refund=Fraction(1, 2), cancel_refund=Fraction(1, 2))),
    ("1,0", SettlementPolicy(failure_refund=Fraction(1), cancel_refund=Fraction(0))),
])
def test_a_policy_is_read_exactly(text: str, policy: SettlementPolicy) -> None:
    assert parse_policy(text) == policy
    assert parse_policy(policy_text(policy)) == policy  # the replay line's text reads back


@pytest.mark.parametrize("bad", ["", "1/2,", "1/2,1/3,1", "half", "3/2,1", "1/0,1", "-1/2,1"])
def test_a_bad_policy_is_refused_by_the_command_line(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_policy(bad)
    with pytest.raises(SystemExit) as exit_:
        chaos_run.main(["--jobs", "5", "--policy", bad, "--quiet"])
    assert exit_.value.code == 2


def test_without_a_policy_the_seed_draws_one_and_replays_it() -> None:
    drawn = {choose_policy(seed, None) for seed in range(40)}
    assert len(drawn) > 5  # not one fixed policy
    for policy in drawn:
        assert {policy.failure_refund, policy.cancel_refund} <= set(POLICY_CHOICES)
    assert choose_policy(123, None) == choose_policy(123, None)
    assert choose_policy(123, "1/2,1/3") == HALF_THIRD
    assert policy_env(HALF_THIRD) == {"RECONCILE_FAILURE_REFUND": "1/2",
                                      "RECONCILE_CANCEL_REFUND": "1/3"}


def test_the_policy_reaches_the_config_and_the_replay_line(
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[ChaosConfig] = []

    def fake_run(config: ChaosConfig) -> ChaosReport:
        seen.append(config)
        return ChaosReport(seed=7, plan_digest="d", jobs=config.jobs, by_kind={}, kills=0,
                           worker_restarts=0, unplanned_worker_exits=0, redis_restarts=0,
                           pg_terminations=0, submit_failed=0, pg_backends_terminated=0,
                           sweeps=0, sweep_errors=0, recovered=0, completed=0, failed=0,
                           refunded=0, uncertain=[], orphans=0, lost_publishes=0,
                           webhook_answers={}, violations=[], seconds=1.0, throughput=0.0,
                           options=config.shape_options(), policy=config.policy or "")

    monkeypatch.setattr(chaos_run, "run", fake_run)
    assert chaos_run.main(["--jobs", "5", "--seed", "7", "--policy", "1/2,1/3", "--quiet"]) == 0
    report = fake_run(seen[-1])
    assert report.text().endswith("--jobs 5 --seed 7 --policy 1/2,1/3")
    assert "policy (failure,cancel refund): 1/2,1/3" in report.text()
    # the poll mode too, and only when not the default (batch)
    assert seen[-1].poll_mode == "batch"
    assert chaos_run.main(["--jobs", "5", "--seed", "7", "--poll-mode", "chain", "--quiet"]) == 0
    assert seen[-1].poll_mode == "chain"
    assert fake_run(seen[-1]).text().endswith("--jobs 5 --seed 7 --poll-mode chain")
    with pytest.raises(SystemExit):
        chaos_run.main(["--jobs", "5", "--poll-mode", "webhook", "--quiet"])


def test_the_plan_mixes_in_a_few_platform_rows_of_each_kind() -> None:
    plan = make_plan(11, 2000)
    platform = Counter(s.kind for s in plan.jobs if s.platform)
    assert set(platform) == {UNKNOWN_KIND, OBSERVED_KIND}
    assert 30 <= platform[UNKNOWN_KIND] <= 100 and 15 <= platform[OBSERVED_KIND] <= 70
    assert all(s.script == {} for s in plan.jobs if s.platform)
    assert get_kind(UNKNOWN_KIND) is None and get_kind(OBSERVED_KIND) is not None
    assert make_plan(11, 2000).digest() == plan.digest()


def _job(status: str, kept: int | None, *, task_id: str | None = "t-1",
         submission: str = "accepted", code: str | None = "UPSTREAM_FAILED") -> Any:
    return SimpleNamespace(id=uuid.uuid4(), status=status, credits_actual=kept,
                           provider_kind="kie-standard", provider_task_id=task_id,
                           submission_state=submission, error_code=code, error_detail=None)


def test_every_settled_job_is_held_to_the_one_share_rule(db: sessionmaker[Session]) -> None:
    """Under 1/2, 1/3: an accepted failure keeps 20 of 40 and a cancel 26; a job never accepted
    keeps nothing; a completed one everything. Any other amount is a ``share_kept`` violation,
    and a runtime under another policy is ``policy_not_applied``."""
    rt = SimpleNamespace(settlement_policy=HALF_THIRD, sessions=db, kind=get_kind)
    right = [_job("failed", 20), _job("cancelled", 26, code="CANCELED"),
             _job("failed", 0, task_id=None, submission="submitting"),
             _job("failed", 0, task_id=None, submission="rejected", code="UPSTREAM_INVALID_INPUT"),
             _job("completed", 40, code=None), _job("failed", None)]  # not settled: not judged
    wrong = [_job("failed", 0), _job("cancelled", 20, code="CANCELED"),
             _job("failed", 20, task_id=None, submission="submitting"),
             _job("completed", 39, code=None)]
    held = {job.id: 40 for job in right + wrong}
    found, partial = check_kept(rt, HALF_THIRD, right, held)
    assert (found, partial) == ([], 2)
    found, _ = check_kept(rt, HALF_THIRD, wrong, held)
    assert len(found) == len(wrong) and all(f.startswith("share_kept ") for f in found)
    default = SimpleNamespace(settlement_policy=SettlementPolicy(), sessions=db, kind=get_kind)
    found, _ = check_kept(default, HALF_THIRD, [], held)
    assert [f.split(":")[0] for f in found] == ["policy_not_applied"]


def test_a_platform_row_the_library_touched_is_a_violation(db: sessionmaker[Session]) -> None:
    from reconcile import credits
    from reconcile.db.models import Job

    user = uuid.uuid4()
    ids = [uuid.uuid4(), uuid.uuid4()]
    with db.begin() as s:
        credits.grant(s, user, "sub", 100, f"grant-{user}")
        for job_id in ids:
            s.add(Job(id=job_id, user_id=user, job_type="chaos-platform", status="processing",
                      provider_kind=UNKNOWN_KIND))
            s.flush()
            credits.reserve(s, user, job_id, 10)
    specs = [SimpleNamespace(job_id=str(job_id), platform=True) for job_id in ids]
    rt = SimpleNamespace(sessions=db)
    with db() as s:
        jobs = {job_id: s.get(Job, job_id) for job_id in ids}
    assert check_platform_rows(rt, specs, jobs, Counter()) == []
    with db.begin() as s:  # the library fails and refunds one (finding 2's old behaviour)
        s.get(Job, ids[1]).status = "failed"  # type: ignore[union-attr]
        credits.refund(s, ids[1])
    with db() as s:
        jobs = {job_id: s.get(Job, job_id) for job_id in ids}
    found = check_platform_rows(rt, specs, jobs, Counter({ids[1]: 1}))
    assert len(found) == 1 and found[0].startswith(f"platform_row_touched {ids[1]}")
