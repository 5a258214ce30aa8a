"""Internal: a chaos run's settlement policy (``--policy FAILURE,CANCEL``; drawn from the seed
when not given) and the check that every settled job kept exactly what the one share rule gives
(:func:`reconcile.settlement.refund_share`, from :func:`~reconcile.settlement.settlement_cause`,
applied by :func:`~reconcile.settlement.kept_of`): called, never copied."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterable, Mapping
from fractions import Fraction
from typing import Any

from ...settlement import SettlementPolicy

# the shares a run draws from when ``--policy`` is not given (failure and cancel independently)
POLICY_CHOICES = (Fraction(1), Fraction(1, 2), Fraction(1, 3), Fraction(0), Fraction(2, 3))


def parse_policy(text: str) -> SettlementPolicy:
    """``"1/2,1/3"`` (failure, cancel; exact fractions or decimals) or one share for both: a
    :class:`SettlementPolicy` (``ValueError`` for anything else, with what was given)."""
    parts = [part.strip() for part in text.split(",")]
    if len(parts) == 1:
        parts *= 2
    if len(parts) != 2 or not all(parts):
        raise ValueError(f"--policy takes FAILURE,CANCEL refund shares such as 1/2,1/3, "
                         f"not {text!r}")
    try:
        failure, cancel = (Fraction(part) for part in parts)
    except (ValueError, ZeroDivisionError) as exc:
        raise ValueError(f"--policy {text!r}: {exc}") from exc
    return SettlementPolicy(failure_refund=failure, cancel_refund=cancel)


def choose_policy(seed: int, given: str | None) -> SettlementPolicy:
    """The run's policy: ``given`` parsed, else drawn from :data:`POLICY_CHOICES` by the seed
    alone (its own stream: the plan's draws are unchanged, and a replay draws the same)."""
    if given is not None:
        return parse_policy(given)
    rng = random.Random(f"chaos-policy-{seed}")
    return SettlementPolicy(failure_refund=rng.choice(POLICY_CHOICES),
                            cancel_refund=rng.choice(POLICY_CHOICES))


def policy_text(policy: SettlementPolicy) -> str:
    """The policy as ``--policy`` takes it: ``"1/2,1/3"``."""
    return f"{policy.failure_refund},{policy.cancel_refund}"


def policy_env(policy: SettlementPolicy) -> dict[str, str]:
    """The environment every worker process reads the policy from (deployment configuration)."""
    return {"RECONCILE_FAILURE_REFUND": str(policy.failure_refund),
            "RECONCILE_CANCEL_REFUND": str(policy.cancel_refund)}


def check_kept(rt: Any, policy: SettlementPolicy, jobs: Iterable[Any],
               reserved: Mapping[uuid.UUID, int]) -> tuple[list[str], int]:
    """Violations where a settled library job kept (``credits_actual``) other than the rule's
    share of what it reserved (``reserved``: the plan's price, what its submit reserved), and
    how many jobs kept a part without keeping everything. A completed job (no pricing hook)
    keeps everything it reserved; a failed or cancelled one ``kept_of(held, refund_share(cause,
    accepted, policy))`` with the cause read from its row by ``settlement_cause``. Also a
    runtime whose policy is not the run's (it did not reach this process)."""
    from ...jobstore.events import cancel_requested
    from ...settlement import kept_of, refund_share, settlement_cause

    found: list[str] = []
    if rt.settlement_policy != policy:
        found.append(f"policy_not_applied: the runtime settles under {rt.settlement_policy}, "
                     f"the run's policy is {policy}")
    partial = 0
    with rt.sessions() as session:
        for job in jobs:
            held = reserved.get(job.id)
            if held is None or job.credits_actual is None:
                continue
            if job.status == "completed":
                expected, why = held, "completed keeps all"
            else:
                cause, accepted = settlement_cause(
                    job, kind=rt.kind(job.provider_kind),
                    cancel_requested=cancel_requested(session, job.id))
                share = refund_share(cause, accepted, policy)
                expected = kept_of(held, share)
                why = f"cause={cause} accepted={accepted} refund_share={share}"
                partial += 0 < expected
            if job.credits_actual != expected:
                found.append(f"share_kept {job.id} ({job.provider_kind}) {job.status}:"
                             f"{job.error_code or 'ok'} kept {job.credits_actual} of {held}, the "
                             f"rule keeps {expected} ({why})")
    return found, partial
