"""The reference pages in ``docs/reference/`` say what the code does: each table below is
compared with the code it documents, so a change to the code fails here until the page follows.

* ``kinds.md`` holds exactly :func:`kinds_markdown`, rendered from the kind registry;
* ``simulator.md`` has a row for every field of the simulator's ``Script``, every state and
  every create mode it accepts;
* ``cli.md`` has a heading for every command of ``reconcile`` (the surface pinned in
  ``test_operator_modules.COMMANDS``; ``scripts/cli_reference.py`` prints the section);
* ``configuration.md`` has a row for every setting (``RECONCILE_<NAME>``), a provider family's
  own settings included under their ``{KIE,REPLICATE,…}`` rows;
* ``error-codes.md`` has a row for every :class:`~reconcile.errors.ErrorCode`.
"""

from __future__ import annotations

import dataclasses
import re
from datetime import timedelta
from pathlib import Path

from reconcile import Settings
from reconcile.errors import ErrorCode
from reconcile.kinds import BUILTIN_KINDS, BUILTIN_PROVIDERS, get_kind
from reconcile.testing.sim_core import CREATE_MODES, STATES, Script
from tests.unit.test_operator_modules import COMMANDS

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _duration(value: timedelta | None) -> str:
    if value is None:
        return "—"
    seconds = int(value.total_seconds())
    if seconds % 3600 == 0:
        return f"{seconds // 3600} h"
    if seconds % 60 == 0:
        return f"{seconds // 60} min"
    return f"{seconds} s"


def kinds_markdown() -> str:
    """The built-in kinds as the table of ``docs/reference/kinds.md``."""
    lines = ["| kind | family | sync | stale threshold | poll interval | result URLs live | "
             "job id planted in | client |",
             "|---|---|---|---|---|---|---|---|"]
    for name in BUILTIN_KINDS:
        kind = get_kind(name)
        assert kind is not None
        lines.append(
            f"| `{kind.name}` | `{kind.provider}` | {'yes' if kind.sync else 'no'} | "
            f"{_duration(kind.stale_threshold)} | {_duration(kind.poll_interval)} | "
            f"{_duration(kind.result_url_lifetime)} | {kind.plant or '—'} | `{kind.client}` |")
    return "\n".join(lines)


def _page(name: str) -> str:
    return (DOCS / "reference" / name).read_text(encoding="utf-8")


def _first_cells(text: str) -> set[str]:
    """The first cell of every table row, without its code marks (``a`` / ``b`` splits)."""
    cells: set[str] = set()
    for line in text.splitlines():
        if line.startswith("|") and not line.startswith("|---"):
            first = line.strip("|").split("|")[0].strip()
            cells.update(part.strip().strip("`") for part in first.split(" / "))
    return cells


def test_the_kinds_page_holds_the_registry() -> None:
    assert kinds_markdown() in _page("kinds.md")


def test_the_simulator_page_lists_every_script_field_state_and_create_mode() -> None:
    cells = _first_cells(_page("simulator.md"))
    fields = {f.name for f in dataclasses.fields(Script)}
    assert fields - cells == set(), "document each Script field in docs/reference/simulator.md"
    assert STATES - cells == set()
    assert CREATE_MODES - cells == set()
    assert {"unknown:<raw>", "kie_200_error:<code>"} <= cells


def test_the_cli_page_has_a_heading_for_every_command() -> None:
    headings = set(re.findall(r"^### `(reconcile[^`]*)`$", _page("cli.md"), re.MULTILINE))
    commands = {" ".join(("reconcile", path)).strip() for path in COMMANDS}
    assert commands - headings == set(), "run scripts/cli_reference.py into docs/reference/cli.md"
    assert headings - commands == set(), "a heading of docs/reference/cli.md names no command"


def test_the_configuration_page_lists_every_setting() -> None:
    cells = _first_cells(_page("configuration.md"))
    documented = set()
    for cell in cells:
        # "{KIE,REPLICATE,…}_BASE_URL" names one setting per family
        match = re.fullmatch(r"\{([A-Z_,]+)\}_(\w+)", cell)
        if match:
            documented.update(f"{family}_{match[2]}" for family in match[1].split(","))
        documented.add(cell)
    settings = {name.upper() for name in Settings.with_families().model_fields}
    missing = sorted(settings - documented)
    assert missing == [], f"add each setting to docs/reference/configuration.md: {missing}"
    assert {f.upper() for f in BUILTIN_PROVIDERS} <= {
        name.split("_")[0] for name in settings}  # the families' settings are in the scan


def test_the_error_codes_page_lists_every_code() -> None:
    cells = _first_cells(_page("error-codes.md"))
    missing = sorted(code.value for code in ErrorCode if code.value not in cells)
    assert missing == [], f"add each code to docs/reference/error-codes.md: {missing}"
