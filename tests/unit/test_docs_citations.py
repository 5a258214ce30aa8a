"""Every pointer from the code into the user documentation lands on a heading, and the
documentation builds.

Code comments and docstrings cite the documentation by heading name:

* ``README, Design notes: Legacy rows`` — the heading "Legacy rows" of
  ``docs/explanation/design-notes.md`` (the design notes were a README section first, and the
  citations kept its wording). Any "Design notes: X" in a scanned file counts, with or without
  "README" before it, and the name may wrap onto the next comment line.
* ``README, Batch polling`` / ``README: The table contract`` / ``README "Security model"`` —
  a heading of any page under ``docs/`` (or of ``README.md`` while it still has the section).
  Unquoted, the text after the comma or colon must *start* with the heading's words; quoted, it
  must *be* a heading.

Any other mention of the README in code ("the README's table", "see the README") is flagged:
it cannot be followed, and it cannot be checked. ``README.md`` as a file name is not a
citation. Scanned: the ``.py`` files under ``reconcile/``, ``tests/``, ``examples/``,
``bench/``, ``alembic/`` and ``scripts/``, and the Markdown of ``docs/`` and ``CONTRIBUTING.md``
(for "Design notes: X").

``test_mkdocs_builds_strict`` runs ``mkdocs build --strict`` into a temporary folder: a broken
link, a missing anchor or a page outside the nav fails it (``mkdocs`` is in the ``test`` extra;
without it this test fails, it is never skipped).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
DESIGN_NOTES = DOCS / "explanation" / "design-notes.md"
SCANNED_DIRS = ("reconcile", "tests", "examples", "bench", "alembic", "scripts")
SKIPPED_PARTS = {"__pycache__", ".venv", ".pytest_cache", ".ruff_cache", ".mypy_cache"}
# the test files that must name the README as a file or spell the patterns out
NOT_CITING = {Path(__file__).resolve()}

_WRAP = re.compile(r"[ \t]*\n[ \t]*(?:#[ \t]*)?")  # a comment's or docstring's line break
_HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t]*#*[ \t]*$", re.MULTILINE)
_FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
_README = re.compile(r"\bREADME\b(?!\.md)")
_DESIGN = re.compile(r"Design\s+notes:\s+")


def _flat(text: str) -> str:
    return _WRAP.sub(" ", text)


def _norm(heading: str) -> str:
    """A heading as it is cited: no numbering (``3. The gateway``), code marks or links."""
    heading = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    heading = heading.replace("`", "").replace("*", "")
    heading = re.sub(r"^\d+\.\s+", "", heading)
    return " ".join(heading.split())


def headings(path: Path) -> list[str]:
    """A page's headings as they may be cited: whole, and without a trailing parenthesis
    ("Batch polling (RECONCILE_POLL_MODE=batch)" is cited as "Batch polling")."""
    text = _FENCE.sub("", path.read_text(encoding="utf-8"))
    found = []
    for match in _HEADING.finditer(text):
        name = _norm(match.group(2))
        found.append(name)
        short = re.sub(r"\s*\([^()]*\)$", "", name)
        if short and short != name:
            found.append(short)
    return found


def design_note_names() -> list[str]:
    """The entries of ``docs/explanation/design-notes.md``: its second-level headings."""
    text = _FENCE.sub("", DESIGN_NOTES.read_text(encoding="utf-8"))
    return [_norm(m.group(2)) for m in _HEADING.finditer(text) if m.group(1) == "##"]


def doc_headings() -> list[str]:
    found = [h for page in sorted(DOCS.rglob("*.md")) for h in headings(page)]
    readme = ROOT / "README.md"
    if readme.exists():
        found += headings(readme)
    return found


def _starts_with_name(text: str, name: str) -> bool:
    """``text`` starts with ``name`` as whole words (case-insensitive)."""
    if not text.lower().startswith(name.lower()):
        return False
    rest = text[len(name):]
    return not rest or not (rest[0].isalnum() or rest[0] == "_")


def readme_citations(text: str) -> list[tuple[str, str | None]]:
    """``(what follows "README", the cited heading or None)`` for every README mention in
    ``text``. None: not a citation a reader can follow ("the README's table"). A "Design
    notes" citation is returned with its heading ``Design notes: …`` (checked by name below)."""
    flat = re.sub(r'"\s+"', "", _flat(text))  # literals joined: "a (README: " "\"X\")"
    found: list[tuple[str, str | None]] = []
    for match in _README.finditer(flat):
        rest = flat[match.end():match.end() + 120]
        quoted = re.match(r'^[,:]?\s*\\?"([^"\\]+)\\?"', rest)
        if re.match(r"^,\s*Design\s+notes\b", rest):
            named = _DESIGN.match(rest[1:].lstrip())
            cited = rest[1:].lstrip()[named.end():] if named else None
            found.append((rest[:60], f"Design notes: {cited}" if cited else None))
        elif quoted:
            found.append((rest[:60], quoted.group(1)))
        elif re.match(r"^[,:]\s+\S", rest):
            found.append((rest[:60], rest[1:].lstrip()))
        else:
            found.append((rest[:60], None))
    return found


def resolves(cited: str, names: list[str], *, exact: bool = False) -> bool:
    cited = " ".join(cited.split())
    if exact:
        return any(cited.lower() == name.lower() for name in names)
    return any(_starts_with_name(cited, name) for name in names)


def _scanned() -> list[Path]:
    files = []
    for top in SCANNED_DIRS:
        for path in sorted((ROOT / top).rglob("*.py")):
            if SKIPPED_PARTS.intersection(path.parts) or path.resolve() in NOT_CITING:
                continue
            files.append(path)
    return files


def _markdown() -> list[Path]:
    return [*sorted(DOCS.rglob("*.md")), ROOT / "CONTRIBUTING.md"]


def test_the_design_notes_page_has_the_entries_the_code_cites() -> None:
    names = design_note_names()
    assert len(names) == 18, names
    assert {"Legacy rows", "Uncertain submissions", "The customer contract",
            "Sync calls and their deadline", "Text and JSON outputs"} <= set(names)


def test_every_design_notes_citation_names_an_entry() -> None:
    names = design_note_names()
    dangling = []
    cited = 0
    for path in [*_scanned(), *_markdown()]:
        flat = _flat(path.read_text(encoding="utf-8"))
        for match in _DESIGN.finditer(flat):
            cited += 1
            rest = flat[match.end():match.end() + 80]
            if not resolves(rest, names):
                dangling.append(f"{path.relative_to(ROOT).as_posix()}: {rest[:50]!r}")
    assert cited > 40  # the scan sees the citations
    assert not dangling, ("no heading of docs/explanation/design-notes.md has that name:\n"
                          + "\n".join(dangling))


def test_every_readme_citation_names_a_heading() -> None:
    names = doc_headings()
    notes = design_note_names()
    bad = []
    count = 0
    for path in _scanned():
        for rest, cited in readme_citations(path.read_text(encoding="utf-8")):
            count += 1
            where = f"{path.relative_to(ROOT).as_posix()}: README{rest[:50]!r}"
            if cited is None:
                bad.append(f"{where}: not a citation (write README, <heading>)")
            elif cited.startswith("Design notes: "):
                if not resolves(cited.removeprefix("Design notes: "), notes):
                    bad.append(f"{where}: no design note of that name")
            elif not resolves(cited, names, exact=rest.lstrip(",: ").startswith('"')):
                bad.append(f"{where}: no heading of that name in docs/")
    assert count > 40  # the scan sees the citations
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize(("text", "cited"), [
    ("(README, Design notes: Legacy\n    # rows)", "Design notes: Legacy rows)"),
    ('see README "Security model".', "Security model"),
    ('(README: "Adopting on a live platform")', "Adopting on a live platform"),
    ("(README, Batch polling)", "Batch polling)"),
    ("README: The table contract", "The table contract"),
    ("the README's provider notes", None),
    ("(README, Design notes)", None),
    ("see the README", None),
])
def test_each_form_of_citation_is_read(text: str, cited: str | None) -> None:
    [(_, found)] = readme_citations(text)
    assert found == cited
    assert readme_citations("ROOT / 'README.md'") == []


def test_a_citation_resolves_by_whole_words() -> None:
    assert resolves("Batch polling (`RECONCILE_POLL_MODE=batch`) says", ["Batch polling"])
    assert resolves("Completion).", ["Completion"])
    assert not resolves("Completions", ["Completion"])
    assert not resolves("The table", ["The table contract"])
    assert resolves("the table contract", ["The table contract"], exact=True)
    assert _norm("3. The gateway") == "The gateway"
    assert "Provider notes" in headings(DOCS / "explanation" / "provider-notes.md")
    assert _norm("Batch polling (`RECONCILE_POLL_MODE=batch`)") == \
        "Batch polling (RECONCILE_POLL_MODE=batch)"


def test_mkdocs_builds_strict(tmp_path: Path) -> None:
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent)) or shutil.which("mkdocs")
    assert mkdocs is not None, "mkdocs is missing: install the test extra (pip install -e '.[test]')"
    out = subprocess.run([mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert (tmp_path / "site" / "explanation" / "design-notes" / "index.html").exists()
