"""``reconcile.jobstore`` is the only writer of ``jobs`` (and of ``credit_anomalies``).

An AST scan of every module under ``reconcile/``: outside the ``jobstore`` package (its
``__init__`` and every submodule, ``reconcile/jobstore/*.py``) none may build
``update(Job)`` / ``insert(Job)`` / ``delete(Job)`` (or of ``Job.__table__``), add a new ``Job``
or ``CreditAnomaly`` to a session (``session.add(Job(…))``, directly or through a name), insert
into the anomaly table, or hold SQL text that mutates ``jobs``
(``UPDATE jobs`` / ``INSERT INTO jobs`` / ``DELETE FROM jobs``). Migrations are schema, not
writers, and are not scanned.

On main before issue 17 it caught: sync.py ``update(Job)`` (the platform call mark),
lifecycle.py ``add(Job(…))`` (submit) and ``update(Job)`` (adopt_upstream_id) and five
``CreditAnomaly(``, sweep.py two ``update(Job)`` (re-enqueue and settlement claims) and one
``CreditAnomaly(``, credits.py ``update(Job)`` (re-charge), two ``CreditAnomaly(`` and one
``insert(_A)`` of the anomaly table, testing/explorer_scenarios.py ``update(Job)`` and ``add(Job(…))``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "reconcile"
WRITER = PACKAGE / "jobstore"  # the package: its modules may write...
# ...except its side-table modules, which share the jobs layer but never write jobs themselves:
# they are scanned like every other module
NOT_WRITERS = {"adoption.py", "events.py", "evidence.py", "horizon.py", "retention.py"}
# nothing is allowed beside jobstore; an entry here needs a reason
ALLOWED: dict[tuple[str, str], str] = {}

_MUTATING_SQL = re.compile(r"\b(UPDATE\s+jobs\b|INSERT\s+INTO\s+jobs\b|DELETE\s+FROM\s+jobs\b)",
                           re.IGNORECASE)


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py")
                  if "migrations" not in p.relative_to(PACKAGE).parts and not _is_writer(p))


def _is_writer(path: Path) -> bool:
    """A module of the ``jobstore`` package (directly in it: a nested package would be named),
    other than its side-table modules."""
    return path.parent == WRITER and path.name not in NOT_WRITERS


def _names_table(node: ast.expr, table_aliases: set[str]) -> str | None:
    """``Job`` / ``Job.__table__`` / ``CreditAnomaly…`` / an alias of their tables."""
    if isinstance(node, ast.Name) and node.id in ("Job", "CreditAnomaly"):
        return node.id
    if isinstance(node, ast.Name) and node.id in table_aliases:
        return node.id
    if isinstance(node, ast.Attribute) and node.attr == "__table__" \
            and isinstance(node.value, ast.Name) and node.value.id in ("Job", "CreditAnomaly"):
        return f"{node.value.id}.__table__"
    return None


def _aliases(tree: ast.AST) -> set[str]:
    """Module names bound to ``Job.__table__`` / ``CreditAnomaly.__table__`` (``_A = …``)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Attribute) \
                and node.value.attr == "__table__" and isinstance(node.value.value, ast.Name) \
                and node.value.value.id in ("Job", "CreditAnomaly"):
            found.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return found


def _row_class(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
            and node.func.id in ("Job", "CreditAnomaly"):
        return node.func.id
    return None


def _built(tree: ast.AST) -> dict[str, str]:
    """Names bound to a new ``Job(…)`` / ``CreditAnomaly(…)`` (``row = Job(…)``)."""
    found: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            cls = _row_class(node.value)
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if cls is not None:
                found.update({t.id: cls for t in targets if isinstance(t, ast.Name)})
    return found


def _rows_in(arg: ast.AST, built: dict[str, str]) -> list[str]:
    """The new rows an ``add``/``add_all``/``merge`` argument holds (a list of them too). A
    transient ``Job(…)`` never added (an event's stub) is no write."""
    rows = []
    for node in ast.walk(arg):
        cls = _row_class(node)
        if cls is None and isinstance(node, ast.Name):
            cls = built.get(node.id)
        if cls is not None:
            rows.append(cls)
    return rows


def _callee(node: ast.Call) -> str | None:
    if isinstance(node.func, ast.Name):
        return node.func.id
    if isinstance(node.func, ast.Attribute):
        return node.func.attr
    return None


def writes(source: str) -> list[tuple[int, str]]:
    """(line, what) for every write of ``jobs`` / ``credit_anomalies`` in a module's source."""
    tree = ast.parse(source)
    aliases = _aliases(tree)
    built = _built(tree)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _callee(node)
            if name in ("update", "insert", "delete") and node.args:
                table = _names_table(node.args[0], aliases)
                if table is not None:
                    found.append((node.lineno, f"{name}({table})"))
            if name in ("add", "add_all", "merge") and isinstance(node.func, ast.Attribute):
                for arg in node.args:
                    for row in _rows_in(arg, built):
                        found.append((node.lineno, f"{name}({row}(…))"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and _MUTATING_SQL.search(node.value):
            found.append((node.lineno, f"SQL {_MUTATING_SQL.search(node.value).group(0)!r}"))
    return sorted(found)


def test_only_jobstore_writes_jobs() -> None:
    offenders = []
    for path in _modules():
        rel = str(path.relative_to(PACKAGE.parent))
        for line, what in writes(path.read_text()):
            if (rel, what) not in ALLOWED:
                offenders.append(f"{rel}:{line}: {what}")
    assert not offenders, "only reconcile/jobstore/ may write jobs:\n" + "\n".join(offenders)


def test_the_writer_itself_is_seen() -> None:
    """The scan is not blind: jobstore's own writes are found by it, in its submodules."""
    kinds = {what for path in sorted(WRITER.glob("*.py")) if _is_writer(path)
             for _, what in writes(path.read_text())}
    assert {"update(Job)", "add(Job(…))", "add(CreditAnomaly(…))"} <= kinds, kinds
    assert any(k.startswith("SQL") for k in kinds), kinds


def test_the_allowance_is_the_jobstore_package_only(tmp_path: Path) -> None:
    """Every jobstore submodule but the side-table ones is allowed; a module beside it, or named
    like it elsewhere, is not — and a write planted in a real module outside jobstore is an
    offender."""
    assert all(_is_writer(p) for p in WRITER.glob("*.py") if p.name not in NOT_WRITERS)
    assert NOT_WRITERS <= {p.name for p in WRITER.glob("*.py")}
    assert not any(_is_writer(WRITER / name) for name in NOT_WRITERS)
    assert {p.name for p in WRITER.glob("*.py")} >= {"__init__.py", "terminal.py", "create.py"}
    assert not _is_writer(PACKAGE / "jobstore_extra.py")
    assert not _is_writer(PACKAGE / "sweep" / "claims.py")
    assert not _is_writer(PACKAGE / "testing" / "jobstore" / "x.py")
    scanned = {p.relative_to(PACKAGE).as_posix() for p in _modules()}
    assert "sweep/claims.py" in scanned and "lifecycle/poll.py" in scanned
    assert {name for name in scanned if name.startswith("jobstore/")} == {
        f"jobstore/{name}" for name in NOT_WRITERS}
    planted = (PACKAGE / "sweep" / "claims.py").read_text() + (
        "\n\ndef _planted(session):\n"
        "    session.execute(update(Job).where(Job.id == 1).values(progress=2))\n")
    assert writes(planted)[-1][1] == "update(Job)"


@pytest.mark.parametrize(("source", "what"), [
    ("session.execute(update(Job).where(Job.id == 1).values(progress=2))", "update(Job)"),
    ("sa.insert(Job).values(id=1)", "insert(Job)"),
    ("delete(Job.__table__)", "delete(Job.__table__)"),
    ("session.add(Job(id=1))", "add(Job(…))"),
    ("row = Job(id=1)\nsession.add(row)", "add(Job(…))"),
    ("session.add_all([Job(id=1)])", "add_all(Job(…))"),
    ("session.add(CreditAnomaly(kind='x'))", "add(CreditAnomaly(…))"),
    ("_A = CreditAnomaly.__table__\nconn.execute(insert(_A).values(kind='x'))", "insert(_A)"),
    ("conn.execute(text('UPDATE jobs SET progress = 1'))", "SQL 'UPDATE jobs'"),
    ("S = '''\n  insert into jobs (id) values (1)'''", "SQL 'insert into jobs'"),
    ("conn.exec_driver_sql('DELETE FROM jobs')", "SQL 'DELETE FROM jobs'"),
])
def test_each_kind_of_write_is_caught(source: str, what: str) -> None:
    assert [w for _, w in writes(source)] == [what]


@pytest.mark.parametrize("source", [
    "select(Job).where(Job.id == 1)",
    "stub = Job(id=1)\nadd_event(session, stub, 'queued')",
    "session.execute(update(JobEvent).values(published_at=now))",
    "text('SELECT * FROM jobs WHERE status = 1')",
    "text('UPDATE jobs_archive SET x = 1')",
])
def test_reads_and_other_tables_pass(source: str) -> None:
    assert writes(source) == []
