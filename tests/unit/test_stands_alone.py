"""The repository stands alone: nothing in it cites a document that is not in it.

The library was built from a design document and two specification "seeds" that live outside
the repository. A comment such as "see DESIGN §6" or "seed D2" tells a reader nothing; the code
states the decision itself, or points at a heading of the documentation ("README, Design notes:
Legacy rows"; ``tests/unit/test_docs_citations.py`` checks that each one resolves). This
test fails when a file cites the outside documents again: ``DESIGN.md`` (or ``DESIGN`` with a
section), ``PROVIDERS.md``, a seed by number (``seed 001``), decision (``seed D2``), section
(``seed §5.7``) or phase (``seed phase 2``), or any bare section sign with a number (``§6``).

Scanned: every tracked-looking text file under ``reconcile/``, ``tests/``, ``examples/``,
``bench/``, ``alembic/``, ``docs/`` and ``scripts/``, and ``README.md``, ``CONTRIBUTING.md`` and
``mkdocs.yml``. Excluded:

* ``reconcile/migrations/versions/``: an applied revision is never edited in place (a new
  revision is added instead), so its docstrings keep the citations they were written with;
* this file, which has to name the patterns.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCANNED_DIRS = ("reconcile", "tests", "examples", "bench", "alembic", "docs", "scripts")
SCANNED_FILES = ("README.md", "CONTRIBUTING.md", "mkdocs.yml")
SUFFIXES = {".py", ".md", ".txt", ".toml", ".cfg", ".ini", ".mako", ".sh", ".sql", ".json", ".yml"}
EXCLUDED_DIRS = (ROOT / "reconcile" / "migrations" / "versions",)
SKIPPED_PARTS = {"__pycache__", ".venv", ".pytest_cache", ".ruff_cache", ".mypy_cache"}

# Each pattern, and what it catches.
CITATIONS = {
    "the design document": re.compile(r"\bDESIGN\.md\b|\bDESIGN\b\s*(?:§|\d)"),
    "the provider facts document": re.compile(r"\bPROVIDERS\.md\b"),
    "a seed by number, decision, section or phase": re.compile(
        r"\bseeds?\s+(?:\d{3}\b|D\d+\b|§|phase\s*\d)", re.IGNORECASE),
    "a section sign with a number": re.compile(r"§\s*\d"),
}

# (path, text) pairs that match a pattern but cite nothing outside the repository.
ALLOWED = {
    # a string literal of the generated benchmark report pointing at that report's own
    # section "1. Sweep candidate query vs history size"
    ("bench/report.py", "; the walk is **not** flat, see §1"),
}


def scanned_files() -> list[Path]:
    files = [ROOT / name for name in SCANNED_FILES]
    for top in SCANNED_DIRS:
        for path in sorted((ROOT / top).rglob("*")):
            if not path.is_file() or path.suffix not in SUFFIXES:
                continue
            if SKIPPED_PARTS.intersection(path.parts):
                continue
            if any(path.is_relative_to(excluded) for excluded in EXCLUDED_DIRS):
                continue
            if path.resolve() == Path(__file__).resolve():
                continue
            files.append(path)
    return files


def citations(text: str) -> list[str]:
    """The names of the patterns ``text`` matches."""
    return [name for name, pattern in CITATIONS.items() if pattern.search(text)]


def test_the_scan_covers_the_code_the_tests_and_the_readme() -> None:
    files = {p.relative_to(ROOT).as_posix() for p in scanned_files()}
    assert "README.md" in files and "CONTRIBUTING.md" in files
    assert "docs/explanation/design-notes.md" in files
    assert "reconcile/sweep/table.py" in files
    assert "tests/unit/test_kinds.py" in files
    assert "examples/platform/acme/gateway.py" in files
    assert "bench/report.py" in files
    assert "tests/unit/test_stands_alone.py" not in files
    assert not any(f.startswith("reconcile/migrations/versions/") for f in files)


@pytest.mark.parametrize("line", [
    "see " + "DESIGN" + ".md",
    "(" + "DESIGN" + " §6)",
    "facts in " + "PROVIDERS" + ".md",
    "the contract of " + "seed" + " 001",
    "# " + "seed" + " D2",
    "Seed" + " §7's invariant",
    "enforce (" + "seed" + " phase 2)",
    "as §" + "5.7 says",
])
def test_each_kind_of_citation_is_caught(line: str) -> None:
    assert citations(line)


@pytest.mark.parametrize("line", [
    "README, Design notes: Legacy rows",
    'fal results carry {"images": [], "seed": 1}',
    "the same seed replays the same schedule",
    "--seed 42",
    "design notes",
])
def test_ordinary_text_is_not_a_citation(line: str) -> None:
    assert not citations(line)


def test_no_file_cites_a_document_outside_the_repository() -> None:
    found = []
    for path in scanned_files():
        rel = path.relative_to(ROOT).as_posix()
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            if any(rel == allowed_path and snippet in line for allowed_path, snippet in ALLOWED):
                continue
            names = citations(line)
            if names:
                found.append(f"{rel}:{number}: {', '.join(names)}: {line.strip()}")
    assert not found, (
        "state the decision where it is used, or point at a heading of the documentation by "
        "name (as in README, Design notes: Legacy rows), instead of citing a document "
        "outside the repository:\n" + "\n".join(found))

