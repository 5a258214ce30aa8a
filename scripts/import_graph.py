"""Measure the import graph of ``reconcile/``: cycles, function-local imports, private names.

Every import of a ``reconcile`` module from another is classified as ``top`` (runs when the
module loads), ``typecheck`` (under ``if TYPE_CHECKING:``) or ``local`` (inside a function).
The tool prints the edge counts by kind, the strongly connected components (cycles) for three
graphs (top; top + typecheck; all three kinds), and the ``_private`` names imported from
another top-level package. ``lint-imports`` and ``tests/unit/test_layers.py`` enforce the
same rules; this tool shows the figures and, with ``--cycles``, the edges inside each cycle.

    python scripts/import_graph.py [--cycles] [--private] [--local]
"""

from __future__ import annotations

import argparse
import ast
from collections import Counter, defaultdict
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "reconcile"


class Edge(NamedTuple):
    importer: str
    imported: str
    kind: str  # top | typecheck | local
    line: int


class PrivateName(NamedTuple):
    importer: str
    imported: str
    name: str
    line: int


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve(importer: str, node: ast.Import | ast.ImportFrom, is_package: bool) -> list[str]:
    """The ``reconcile`` modules ``node`` loads, each the longest existing module prefix."""
    names: list[str] = []
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        if node.level:
            base = importer.split(".")
            if not is_package:
                base = base[:-1]
            base = base[: len(base) - (node.level - 1)]
            prefix = ".".join(base + ([node.module] if node.module else []))
        else:
            prefix = node.module or ""
        for alias in node.names:  # `from . import x` loads the submodule x when there is one
            sub = f"{prefix}.{alias.name}"
            names.append(sub if sub in MODULES else prefix)
    out = []
    for name in names:
        while name and name not in MODULES:
            name = name.rpartition(".")[0]
        if name.split(".")[0] == "reconcile" and name != importer:
            out.append(name)
    return out


def scan() -> tuple[list[Edge], list[PrivateName]]:
    edges: list[Edge] = []
    private: list[PrivateName] = []
    for name, path in MODULES.items():
        is_package = path.name == "__init__.py"

        def visit(node: ast.AST, kind: str, name: str = name, is_package: bool = is_package) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                    for stmt in child.body:
                        visit(ast.Module(body=[stmt], type_ignores=[]), "typecheck")
                    for stmt in child.orelse:
                        visit(ast.Module(body=[stmt], type_ignores=[]), kind)
                    continue
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    for target in _resolve(name, child, is_package):
                        edges.append(Edge(name, target, kind, child.lineno))
                    if isinstance(child, ast.ImportFrom):
                        for alias in child.names:
                            if alias.name.startswith("_") and not alias.name.startswith("__"):
                                one = ast.ImportFrom(module=child.module, names=[alias],
                                                     level=child.level)
                                for target in _resolve(name, one, is_package):
                                    private.append(PrivateName(name, target, alias.name,
                                                               child.lineno))
                    continue
                inner = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                visit(child, "local" if inner else kind)

        visit(ast.parse(path.read_text()), "top")
    return edges, private


def cycles(edges: list[Edge]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for e in edges:
        graph[e.importer].add(e.imported)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in MODULES:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
    return found


def top_package(name: str) -> str:
    """``reconcile.x`` for any module under ``reconcile.x`` (the facade is its own)."""
    return ".".join(name.split(".")[:2])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cycles", action="store_true", help="print the edges in each cycle")
    parser.add_argument("--private", "-v", action="store_true",
                        help="print the private names imported across packages")
    parser.add_argument("--local", action="store_true",
                        help="print the function-local import count per module")
    args = parser.parse_args()
    edges, private = scan()
    kinds = Counter(e.kind for e in edges)
    local_modules = Counter(e.importer for e in edges if e.kind == "local")
    print("edges by kind:", dict(sorted(kinds.items())))
    print(f"function-local imports: {kinds['local']} edges in {len(local_modules)} modules")
    for label, allowed in [("top", {"top"}), ("top+typecheck", {"top", "typecheck"}),
                           ("all", {"top", "typecheck", "local"})]:
        comps = cycles([e for e in edges if e.kind in allowed])
        print(f"cycles ({label}): {len(comps)} {[len(c) for c in comps]}")
        if args.cycles and label == "all":
            for comp in comps:
                members = set(comp)
                print(f"  == {len(comp)}: {', '.join(comp)}")
                for e in sorted(set(edges)):
                    if e.importer in members and e.imported in members:
                        print(f"     {e.importer} -> {e.imported}  [{e.kind} line {e.line}]")
    across = [p for p in private if top_package(p.importer) != top_package(p.imported)]
    print(f"private names imported across packages: {len(across)} (across modules: "
          f"{len(private)})")
    if args.private:
        for p in across:
            print(f"  {p.importer}:{p.line} imports {p.name} from {p.imported}")
    if args.local:
        for name, count in local_modules.most_common():
            print(f"  {count:4} {name}")


if __name__ == "__main__":
    main()
