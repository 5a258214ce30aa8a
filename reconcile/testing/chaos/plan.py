"""The seeded plan of a chaos run: every job (id, kind, script, price, submit time) and the whole
fault schedule, derived in one deterministic pass of one ``random.Random(seed)``."""

from __future__ import annotations

import json
import random
import uuid
from dataclasses import asdict, dataclass
from typing import Any

# --------------------------------------------------------------------------- the seeded plan


def _mix() -> tuple[dict[str, tuple[str, dict[str, Any]]], dict[str, int], dict[str, int]]:
    """The run's kinds, from the provider families: each family's simulator route names the
    kinds the run submits and their weights (``SimRoute.chaos``), and its example request of
    each. A family whose simulator module did not load is left out (its tests say why)."""
    from ...kinds import get_kind
    from ...providers.family import families
    from .. import sim_registry

    sim_registry.load_builtin(strict=False)
    examples: dict[str, tuple[str, dict[str, Any]]] = {}
    async_weights: dict[str, int] = {}
    sync_weights: dict[str, int] = {}
    for family in families():
        route = sim_registry.route(family.name)
        if route is None:
            continue
        for kind, weight in route.chaos.items():
            model, inp = route.examples[kind]
            examples[kind] = (model, dict(inp))
            spec = get_kind(kind)
            (sync_weights if spec is not None and spec.sync else async_weights)[kind] = weight
    return examples, async_weights, sync_weights


# (kind, model, input) per provider family; a sync kind is run by the platform's request
FAMILIES, ASYNC_WEIGHTS, _SYNC_WEIGHTS = _mix()
SYNC_KINDS = tuple(_SYNC_WEIGHTS)
# the kind every process of the run lists in OBSERVE_ONLY_KINDS: its library jobs still complete
# and settle (observe-only governs decisions about the upstream, never a settlement owed)
OBSERVED_KIND = "elevenlabs-async"
# a provider kind no process registers: the platform's own rows of it are left alone
UNKNOWN_KIND = "unregistered-video"
# the fractions of the plan that are platform rows (no submission_state): of the unknown kind,
# and of the observe-only kind
PLATFORM_SHARES = {UNKNOWN_KIND: 0.03, OBSERVED_KIND: 0.02}


@dataclass(frozen=True)
class JobSpec:
    index: int
    job_id: str
    kind: str
    user: int
    credits: int
    submit_at: float  # seconds after the start
    script: dict[str, Any]  # Script fields (sync kinds: create mode only)
    platform: bool = False  # the platform's own row (chaos.platform_rows), not submitted


@dataclass(frozen=True)
class Fault:
    at: float  # seconds after the start
    action: str  # kill_worker | redis_restart | pg_terminate
    target: int = 0  # the worker index (kill_worker)
    down_for: float = 0.0  # seconds until the restart (kill_worker, redis_restart)


@dataclass(frozen=True)
class Plan:
    seed: int
    window: float  # seconds over which jobs are submitted and faults happen
    jobs: tuple[JobSpec, ...]
    faults: tuple[Fault, ...]
    sim_knobs: dict[str, Any]
    sweep_intervals: tuple[float, float]
    users: int

    def digest(self) -> str:
        """A short fingerprint: the same seed (and N) always prints the same one."""
        import hashlib

        text = json.dumps([asdict(j) for j in self.jobs] + [asdict(f) for f in self.faults]
                          + [self.sim_knobs, list(self.sweep_intervals)], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]


def _script(rng: random.Random, kind: str) -> dict[str, Any]:
    """One upstream behaviour: mostly success, some failures, odd states, 429s, lost answers.

    A sync call carries no job id upstream, so sync kinds follow the simulator's default script
    (their failures come from its ``fail_rate``)."""
    if kind in SYNC_KINDS:
        return {}
    start = round(rng.uniform(0.05, 0.6), 3)
    done = round(start + rng.uniform(0.2, 2.5), 3)
    end = rng.choices(["succeeded", "failed", "canceled", "empty"], [78, 15, 3, 4])[0]
    outputs = 0 if end == "empty" else rng.randint(1, 3)
    timeline: list[tuple[float, str]] = [(0.0, "queued"), (start, "running")]
    if rng.random() < 0.05:  # a status the adapters do not know, then a real ending
        timeline.append((round((start + done) / 2, 3), "unknown:mystery"))
    timeline.append((done, "succeeded" if end == "empty" else end))
    create = rng.choices(["accept", "rate_limit", "reject_invalid", "reject_auth",
                          "server_error", "drop_after_accept", "garbage_2xx"],
                         [84, 5, 2, 1, 2, 4, 2])[0]
    return {"timeline": timeline, "outputs": outputs, "create": create,
            "rate_limit_times": rng.randint(1, 2) if create == "rate_limit" else None,
            "retry_after": 1.0, "webhook": rng.random() < 0.5,
            "kie_msg_key": rng.choice(["msg", "message"])}


def make_plan(seed: int, jobs: int, *, rate: float = 12.0, workers: int = 2) -> Plan:
    """Everything the seed decides, in one deterministic pass of one ``random.Random(seed)``."""
    rng = random.Random(seed)
    window = max(8.0, jobs / rate)
    users = max(3, jobs // 50)
    kinds = list(ASYNC_WEIGHTS) + list(SYNC_KINDS)
    weights = list(ASYNC_WEIGHTS.values()) + list(_SYNC_WEIGHTS.values())
    specs = []
    platform_kinds = list(PLATFORM_SHARES)
    platform_cumulative = [sum(list(PLATFORM_SHARES.values())[:i + 1])
                           for i in range(len(platform_kinds))]
    for index in range(jobs):
        draw = rng.random()
        platform = next((k for k, c in zip(platform_kinds, platform_cumulative, strict=True)
                         if draw < c), None)
        kind = platform or rng.choices(kinds, weights)[0]
        specs.append(JobSpec(
            index=index, job_id=str(uuid.UUID(int=rng.getrandbits(128), version=4)), kind=kind,
            user=rng.randrange(users), credits=rng.randint(1, 60),
            submit_at=round(rng.uniform(0.0, window), 3),
            script={} if platform else _script(rng, kind), platform=platform is not None))
    specs.sort(key=lambda s: (s.submit_at, s.index))
    faults: list[Fault] = []
    kills = max(2, round(jobs / 150))
    for n in range(kills):  # each worker is killed at least once
        faults.append(Fault(round(rng.uniform(0.1, 0.9) * window, 3), "kill_worker",
                            target=n % workers, down_for=round(rng.uniform(0.2, 2.0), 3)))
    for _ in range(1 + jobs // 2500):  # down for seconds, as a real restart: a worker must
        # ride out a broker that stays away while it holds unacked messages (issue 18)
        faults.append(Fault(round(rng.uniform(0.3, 0.8) * window, 3), "redis_restart",
                            down_for=round(rng.uniform(2.0, 5.0), 3)))
    for _ in range(2 + jobs // 200):
        faults.append(Fault(round(rng.uniform(0.05, 0.95) * window, 3), "pg_terminate"))
    faults.sort(key=lambda f: (f.at, f.action, f.target))
    knobs = {"fail_rate": round(rng.uniform(0.0, 0.02), 4),
             "read_fail_rate": round(rng.uniform(0.02, 0.08), 4),
             "latency_range": (0.0, round(rng.uniform(0.005, 0.05), 4))}
    sweeps = (round(rng.uniform(0.4, 1.2), 3), round(rng.uniform(0.4, 1.2), 3))
    return Plan(seed, window, tuple(specs), tuple(faults), knobs, sweeps, users)
