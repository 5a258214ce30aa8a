"""Every import inside ``reconcile/`` names a module or a name that exists — including the
imports inside function bodies, which only run on the path that reaches them.

The layout split of issue 17 moved modules one package level down; twice a function-local
``from .ledger import …`` kept its old depth and pointed at a module that does not exist
(``reconcile.sweep.ledger``), and no test on the common paths ran it. This test resolves each
one statically (``importlib.util.resolve_name`` + ``find_spec``) and then checks the imported
name exists on the target module.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "reconcile"


def _module_name(path: Path) -> tuple[str, str]:
    """(the module's dotted name, the package its relative imports resolve against)."""
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
        return ".".join(parts), ".".join(parts)
    return ".".join(parts), ".".join(parts[:-1])


def _imports() -> list[tuple[str, int, str, str | None]]:
    """(file, line, absolute module, imported name or None) for every reconcile import."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "migrations/versions" in path.as_posix():
            continue
        _, package = _module_name(path)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                base = ("." * node.level) + (node.module or "")
                target = importlib.util.resolve_name(base, package) if node.level else base
                if not target.startswith("reconcile"):
                    continue
                for alias in node.names:
                    found.append((path.relative_to(PACKAGE.parent).as_posix(), node.lineno,
                                  target, alias.name))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("reconcile"):
                        found.append((path.relative_to(PACKAGE.parent).as_posix(), node.lineno,
                                      alias.name, None))
    return found


IMPORTS = _imports()


def test_the_scan_sees_function_local_relative_imports() -> None:
    assert len(IMPORTS) > 300
    locals_ = [i for i in IMPORTS if i[0] == "reconcile/sweep/tick.py" and i[2] == "reconcile.ledger"]
    assert locals_, "the sweep tick's function-local ledger import is scanned"


def _top_level_names(module: str) -> set[str]:
    """The names a module binds at its top level, read from its source (not imported)."""
    origin = importlib.util.find_spec(module).origin  # type: ignore[union-attr]
    names: set[str] = set()
    for node in ast.parse(Path(str(origin)).read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def _has(module: str, name: str) -> bool:
    try:
        return hasattr(importlib.import_module(module), name)
    except Exception:
        # a Django models module imports only inside a configured project (the admin's models
        # of the library's tables; ImproperlyConfigured, AppRegistryNotReady, or a RuntimeError
        # where another test configured Django without the app): read its names from the source
        if not module.startswith("reconcile.contrib.django."):
            raise
        return name in _top_level_names(module)


def _unresolved(imports: list[tuple[str, int, str, str | None]]) -> list[str]:
    problems = []
    for where, line, module, name in imports:
        if importlib.util.find_spec(module) is None:
            problems.append(f"{where}:{line} imports {module}, which does not exist")
            continue
        if name is None or name == "*" or _has(module, name):
            continue
        target = importlib.import_module(module)
        is_submodule = hasattr(target, "__path__") and \
            importlib.util.find_spec(f"{module}.{name}") is not None  # from pkg import submodule
        if not is_submodule:
            problems.append(f"{where}:{line} imports {name} from {module}, which has no such name")
    return problems


def test_every_import_resolves() -> None:
    assert _unresolved(IMPORTS) == []


def test_a_relative_import_one_level_too_shallow_is_caught() -> None:
    # the bug the split made: ``from .ledger import ledger_of`` left in reconcile/sweep/tick.py
    planted = [("reconcile/sweep/tick.py", 1, importlib.util.resolve_name(".ledger", "reconcile.sweep"),
                "ledger_of"),
               ("reconcile/sweep/tick.py", 2, "reconcile.ledger", "no_such_function")]
    assert len(_unresolved(planted)) == 2
