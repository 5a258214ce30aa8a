"""A chaos run's report: the counts, the uncertain jobs (grouped), the violations, the replay line."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ChaosReport:
    seed: int
    plan_digest: str
    jobs: int
    by_kind: dict[str, int]
    kills: int
    worker_restarts: int
    unplanned_worker_exits: int
    redis_restarts: int
    pg_terminations: int
    submit_failed: int
    pg_backends_terminated: int
    sweeps: int
    sweep_errors: int
    recovered: int
    completed: int
    failed: int
    refunded: int
    uncertain: list[str]
    orphans: int
    lost_publishes: int
    webhook_answers: dict[str, int]
    violations: list[str]
    seconds: float
    throughput: float  # jobs settled per second of the whole run
    outcomes: dict[str, int] = field(default_factory=dict)
    settle_seconds: float = 0.0  # after the window, until every job settled (run._settle)
    # the sweep's resumes (a dead chain's new generation, or a lost first turn sent again; many
    # on a slow host is the sweep outpacing the poll queue), and the generations past each
    # job's first (chains that had polled, then were resumed)
    sweep_resumes: int = 0
    extra_generations: int = 0
    # the options that shaped the run (ChaosConfig.shape_options): repeated in the replay line
    options: list[str] = field(default_factory=list)
    database: str = ""  # the database's shape: its TimeZone, the platform's timestamp type
    policy: str = ""  # the settlement policy, "FAILURE,CANCEL" refund shares
    partly_kept: int = 0  # failed/cancelled jobs that kept a part of their reservation
    # library jobs of the observe-only kind left in flight (nothing resumes them: not a violation)
    observed_in_flight: list[str] = field(default_factory=list)
    observed_settled: int = 0  # library jobs of the observe-only kind settled (terminal)
    platform_rows: int = 0  # the platform's own rows mixed in (unknown and observe-only kinds)
    # batch mode (--poll-mode batch): the poll_due ticks sent to the workers, and lost (broker down)
    poll_due_ticks: int = 0
    poll_due_ticks_lost: int = 0

    def ok(self) -> bool:
        return not self.violations

    def _uncertain_groups(self) -> list[tuple[str, list[str]]]:
        groups: dict[str, list[str]] = {}
        for entry in self.uncertain:  # "<job id> (<kind>, <created upstream|never created>)"
            job_id, _, rest = entry.partition(" ")
            groups.setdefault(rest.strip("()"), []).append(job_id)
        return sorted(groups.items())

    def text(self) -> str:
        lines = [
            f"chaos seed={self.seed} plan={self.plan_digest} jobs={self.jobs} "
            f"({', '.join(f'{k}={v}' for k, v in sorted(self.by_kind.items()))})",
            f"  faults: kills={self.kills} worker_restarts={self.worker_restarts} "
            f"unplanned_worker_exits={self.unplanned_worker_exits} "
            f"redis_restarts={self.redis_restarts} pg_terminations={self.pg_terminations} "
            f"(backends terminated={self.pg_backends_terminated}) "
            f"lost_publishes={self.lost_publishes} submit_failed={self.submit_failed}",
            f"  sweeps={self.sweeps} sweep_errors={self.sweep_errors} "
            f"resumes={self.sweep_resumes} extra_generations={self.extra_generations} "
            f"webhooks={dict(sorted(self.webhook_answers.items()))}"
            + (f" poll_due_ticks={self.poll_due_ticks} (lost {self.poll_due_ticks_lost})"
               if self.poll_due_ticks else ""),
            f"  outcomes: completed={self.completed} failed={self.failed} "
            f"recovered={self.recovered} refunded={self.refunded} "
            f"uncertain={len(self.uncertain)} orphans={self.orphans}",
            f"  by code: {dict(sorted(self.outcomes.items()))}",
            *([f"  database: {self.database}"] if self.database else []),
            f"  policy (failure,cancel refund): {self.policy or '?'} partly_kept={self.partly_kept} "
            f"platform_rows={self.platform_rows} (left alone) observe-only jobs settled="
            f"{self.observed_settled} left in flight={len(self.observed_in_flight)}",
            *[f"    {entry}" for entry in self.observed_in_flight[:20]],
            f"  uncertain (never refunded automatically; reservation kept for an operator): "
            f"{len(self.uncertain)}{':' if self.uncertain else ''}",
            *[f"    {group}: {', '.join(ids)}" for group, ids in self._uncertain_groups()],
            f"  time={self.seconds:.1f}s (settling {self.settle_seconds:.1f}s) "
            f"throughput={self.throughput:.1f} jobs/s",
            f"  invariant violations: {len(self.violations)}",
        ]
        lines += [f"    - {v}" for v in self.violations[:50]]
        if len(self.violations) > 50:
            lines.append(f"    … and {len(self.violations) - 50} more")
        lines.append(f"  replay: python -m reconcile.testing.chaos --jobs {self.jobs} "
                     f"--seed {self.seed}" + "".join(f" {o}" for o in self.options))
        return "\n".join(lines)
