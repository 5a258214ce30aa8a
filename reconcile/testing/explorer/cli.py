"""Internal: the library's own mechanics, not an import path for platforms (may move).

The explorer's command (``python -m reconcile.testing.explorer``), its output (a violating
schedule, replayable; the writers' prints dropped) and the scratch database it runs in.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import sys
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from .engine import Explorer
from .model import PG_ADMIN_DEFAULT, Bounds, Scenario, ScenarioReport, ScheduleResult

# ----------------------------------------------------------------------------- output


class _ThreadStdout(io.TextIOBase):
    """stdout for the main thread; what writer threads print (the CLI's echo) is dropped."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.main = threading.main_thread()

    def write(self, text: str) -> int:
        if threading.current_thread() is self.main:
            return int(self.real.write(text))
        return len(text)

    def flush(self) -> None:
        self.real.flush()


@contextlib.contextmanager
def quiet_writers() -> Iterator[None]:
    real_out, real_err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _ThreadStdout(real_out), _ThreadStdout(real_err)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = real_out, real_err


def describe(result: ScheduleResult, scenario: Scenario) -> str:
    """A violating schedule, replayable: the choice string, the trace and what broke."""
    lines = [f"scenario {scenario.name}: {', '.join(result.violations)}",
             f"  replay: python -m reconcile.testing.explorer --scenario {scenario.name} "
             f"--replay \"{result.replay()}\"",
             f"  outcomes: {', '.join(result.outcomes)}", "  trace:"]
    lines += [f"    {n:>3}. {step}" for n, step in enumerate(result.trace)]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the database


@contextlib.contextmanager
def scratch_database(admin_url: str = PG_ADMIN_DEFAULT) -> Iterator[str]:
    """A throwaway migrated PostgreSQL database, dropped at the end."""
    import os

    import psycopg

    from ...db.migrate import upgrade

    name = f"explore_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = admin_url.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1) + "/" + name
    try:
        upgrade(url)
        yield url
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def explore_all(scenarios: Sequence[Scenario], bounds: Bounds, *, admin_url: str = PG_ADMIN_DEFAULT,
                out: Callable[[str], None] = print, workdir: Path | None = None
                ) -> list[ScenarioReport]:
    """Explore every scenario in a scratch database; prints one line each and each violation."""
    import tempfile

    reports = []
    with scratch_database(admin_url) as url, tempfile.TemporaryDirectory() as tmp, \
            Explorer(url, workdir=workdir or Path(tmp)) as explorer, quiet_writers():
        for scenario in scenarios:
            report = explorer.explore(scenario, bounds)
            out(report.line())
            if report.first_violation is not None:
                out(describe(report.first_violation, scenario))
            reports.append(report)
    return reports


def main(argv: list[str] | None = None) -> int:
    from . import scenarios as sc

    parser = argparse.ArgumentParser(prog="python -m reconcile.testing.explorer",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", action="append", help="a scenario name (repeatable)")
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    parser.add_argument("--preemptions", type=int, default=2)
    parser.add_argument("--jumps", type=int, default=1)
    parser.add_argument("--max-schedules", type=int, default=5000, help="per scenario")
    parser.add_argument("--replay", help="run one schedule (its choice string) and print it")
    parser.add_argument("--pg-admin", default=PG_ADMIN_DEFAULT)
    parser.add_argument("--verbose", action="store_true", help="keep the library's log output")
    args = parser.parse_args(argv)
    scenarios = sc.scenarios_named(args.scenario)
    if args.list:  # lists only: the process's logging is left as it was
        for s in scenarios:
            print(f"{s.name:<40} {s.note}")
        return 0
    if not args.verbose:
        logging.getLogger("reconcile").setLevel(logging.CRITICAL)
    if args.replay is not None:
        if len(scenarios) != 1:
            parser.error("--replay needs exactly one --scenario")
        return _replay(scenarios[0], args.replay.split(), args.pg_admin)
    bounds = Bounds(args.preemptions, args.jumps, args.max_schedules)
    print(f"explorer: {len(scenarios)} scenarios, preemption bound {bounds.preemptions}, "
          f"clock-jump bound {bounds.jumps}")
    reports = explore_all(scenarios, bounds, admin_url=args.pg_admin)
    total = sum(r.schedules for r in reports)
    bad = [r for r in reports if r.violating]
    print(f"explorer: {total} schedules, {len(bad)} scenario(s) with violations")
    return 1 if bad else 0


def _replay(scenario: Scenario, choices: list[str], admin_url: str) -> int:
    import tempfile

    with scratch_database(admin_url) as url, tempfile.TemporaryDirectory() as tmp, \
            Explorer(url, workdir=Path(tmp)) as explorer, quiet_writers():
        result = explorer.run_schedule(scenario, choices)
        print(describe(result, scenario) if result.violations else
              f"scenario {scenario.name}: no violation\n  outcomes: {', '.join(result.outcomes)}\n"
              + "\n".join(f"    {n:>3}. {s}" for n, s in enumerate(result.trace)))
        if result.diverged:
            print("  (the replay diverged from the given choices)")
    return 1 if result.violations else 0
