"""The layer contract and the import rules (CONTRIBUTING.md "The layer map").

The map is import-linter's configuration in ``pyproject.toml`` (``[tool.importlinter]``): the
``layers`` contract (a module imports its own layer and the layers below it, never a higher one;
highest layer first), ``package-facades`` (a package whose modules sit in different layers keeps
its ``__init__`` in its own layer), ``root-facade`` and ``private-modules`` (a ``_module`` is
imported only from within its package). Every import counts, direct or through others: top
level, inside a function, and under ``if TYPE_CHECKING:`` (an annotation of a higher layer's type
is a dependency on it too). ``make lint`` runs ``lint-imports``; this file runs the same
contracts, checks that every module has a layer, that no module imports itself through others
(no cycle in grimp's graph of every import), and that no ``_private`` name is imported from
another package.
"""

from __future__ import annotations

import ast
import functools
import textwrap
import tomllib
from pathlib import Path

import grimp
import pytest

import reconcile
from reconcile.providers.family import families

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "reconcile"
PYPROJECT = ROOT / "pyproject.toml"
CONFIG = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]
CONTRACTS = {contract["id"]: contract for contract in CONFIG["contracts"]}

CORE, DB, GATEWAY, KINDS, JOBS, LEDGER, RUNTIME, LIFECYCLE, FLOWS, CELERY, EDGE, OPS, TESTING, DEMO = \
    range(14)


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


# the migration revisions (0003_library.py) are files Alembic and Django load, not module names
MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))
           if all(part.isidentifier() for part in module_name(p).split("."))}


def layer_of(name: str, contract: str = "layers") -> int | None:
    """The rank of ``name`` in a layers contract (0: the lowest layer), or None: no layer's
    module is ``name`` or a package holding it."""
    layers = [[module.strip() for module in layer.split(":")]
              for layer in CONTRACTS[contract]["layers"]]
    for index, layer in enumerate(layers):
        if any(name == module or name.startswith(module + ".") for module in layer):
            return len(layers) - 1 - index
    return None


@functools.cache
def import_graph() -> grimp.ImportGraph:
    """grimp's graph of ``reconcile``: every import, TYPE_CHECKING ones included."""
    assert Path(reconcile.__file__).parent == PACKAGE  # the tree under test, not an installed copy
    return grimp.build_graph("reconcile", exclude_type_checking_imports=False, cache_dir=None)


def _lint(config: Path) -> bool:
    import importlinter.api  # noqa: F401 - configures import-linter, as its command does
    from importlinter.application.use_cases import lint_imports

    return lint_imports(str(config), cache_dir=None, no_logo=True)


def test_the_import_contracts_hold(capsys: pytest.CaptureFixture[str]) -> None:
    assert Path(reconcile.__file__).parent == PACKAGE
    passed = _lint(PYPROJECT)
    assert passed, capsys.readouterr().out


def test_every_import_counts() -> None:
    """No option leaves TYPE_CHECKING imports out, and the contract fails on an upward import
    that is only an annotation, or only inside a function (a probe package of two layers)."""
    assert not CONFIG.get("exclude_type_checking_imports", False)
    assert set(CONFIG) == {"root_package", "contracts"}


def test_an_upward_annotation_or_function_local_import_breaks_the_layers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    probe = tmp_path / "layered_probe"
    probe.mkdir()
    (probe / "__init__.py").write_text("")
    (probe / "high.py").write_text("class High:\n    pass\n")
    (probe / "low.py").write_text(textwrap.dedent("""
        from __future__ import annotations

        from typing import TYPE_CHECKING

        if TYPE_CHECKING:
            from .high import High


        def annotated(x: High) -> None:
            return None
        """))
    (probe / "lower.py").write_text("def later():\n    from . import high\n\n    return high\n")
    config = tmp_path / "pyproject.toml"
    session = {key: value for key, value in CONFIG.items() if key != "contracts"}
    session["root_package"] = "layered_probe"
    lines = [f"{key} = {value!r}" for key, value in session.items()]
    config.write_text("[tool.importlinter]\n" + "\n".join(lines).replace("'", '"') + "\n\n"
                      "[[tool.importlinter.contracts]]\nname = \"probe\"\ntype = \"layers\"\n"
                      "layers = [\"layered_probe.high\", \"layered_probe.low : layered_probe.lower\"]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _lint(config) is False
    out = capsys.readouterr().out
    assert "layered_probe.low is not allowed to import layered_probe.high" in out
    assert "layered_probe.lower is not allowed to import layered_probe.high" in out


def _split_package(name: str) -> bool:
    """A package whose modules the ``layers`` contract places one by one (in different layers):
    its ``__init__`` is held by ``package-facades`` (or, the root, by ``root-facade``)."""
    return MODULES[name].name == "__init__.py" and any(
        layer_of(other) is not None for other in MODULES if other.startswith(name + "."))


def test_every_module_has_a_layer() -> None:
    facades = sorted(name for name in MODULES if layer_of(name) is None and _split_package(name))
    unplaced = sorted(name for name in MODULES if layer_of(name) is None and name not in facades)
    assert unplaced == [], f"add each new module to a layer of [tool.importlinter]: {unplaced}"
    held = [name for name in facades if layer_of(name, "package-facades") is not None
            or name in CONTRACTS["root-facade"]["source_modules"]]
    assert facades == held, "a package split across layers goes whole into package-facades"
    assert "reconcile" in facades and "reconcile.sweep" in facades  # the scan sees them


def test_the_layers_read_as_the_map() -> None:
    """The ranks of CONTRIBUTING.md's table, highest layer listed first."""
    assert len(CONTRACTS["layers"]["layers"]) == DEMO + 1
    assert layer_of("reconcile.providers.kie.market") == GATEWAY
    assert layer_of("reconcile.providers.family") == GATEWAY < layer_of("reconcile.kinds")  # type: ignore[operator]
    assert layer_of("reconcile.media.types") == CORE
    # the providers package is gateway whole; its core modules are held by `providers-core`
    assert layer_of("reconcile.providers.base", "providers-core") == 0 == \
        layer_of("reconcile.providers.deadline", "providers-core")
    assert layer_of("reconcile.sweep.table") == JOBS < FLOWS == layer_of("reconcile.sweep.tick")
    assert layer_of("reconcile.runtime") == RUNTIME and layer_of("reconcile.lifecycle.poll") == LIFECYCLE
    assert layer_of("reconcile.contrib.django.testing") == TESTING > OPS == layer_of("reconcile.cli")
    assert layer_of("reconcile.tasks") == CELERY and layer_of("reconcile.api") == EDGE
    assert layer_of("reconcile.credits") == LEDGER and layer_of("reconcile.db.models") == DB
    assert layer_of("reconcile.demo.story") == DEMO
    assert layer_of("reconcile.sweep") is None and layer_of("reconcile.unknown_module") is None


# -- no cycle -------------------------------------------------------------------------------


def cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        while work:
            module, imported = work[-1]
            for other in imported:
                if other not in index:
                    index[other] = low[other] = len(index)
                    stack.append(other)
                    on_stack.add(other)
                    work.append((other, iter(sorted(graph.find_modules_directly_imported_by(other)))))
                    break
                if other in on_stack:
                    low[module] = min(low[module], index[other])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[module])
                if low[module] == index[module]:
                    component = []
                    while True:
                        other = stack.pop()
                        on_stack.discard(other)
                        component.append(other)
                        if other == module:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_no_module_imports_itself_through_others() -> None:
    """No import cycle between modules, counting function-local and TYPE_CHECKING imports: a
    package's ``__init__`` that re-exports its modules is not imported by them, a shared helper
    sits below both users, a type a lower module annotates with is a protocol at its level."""
    graph = import_graph()
    assert len(graph.modules) > 150
    assert graph.direct_import_exists(importer="reconcile.ops.tools", imported="reconcile.demo")
    assert cycles(graph) == []


def test_the_cycle_check_finds_every_cycle() -> None:
    graph = grimp.ImportGraph()
    for importer, imported in [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d"), ("d", "e"),
                               ("e", "d"), ("f", "a")]:
        graph.add_import(importer=importer, imported=imported)
    assert sorted(cycles(graph)) == [["a", "b", "c"], ["d", "e"]]


# -- no private name across packages --------------------------------------------------------


def top_package(name: str) -> str:
    """``reconcile.x`` for every module under ``reconcile.x`` (the root is its own)."""
    return ".".join(name.split(".")[:2])


def private_imports(name: str, source: str, is_package: bool) -> list[tuple[str, str]]:
    """``(module, _name)`` for each ``from module import _name`` of a name in ``source`` (the
    module ``name``), anywhere in it: inside functions and under TYPE_CHECKING too. A private
    module (``from . import _core``) is the ``private-modules`` contract's, not listed here."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = name.split(".") if is_package else name.split(".")[:-1]
            base = base[: len(base) - node.level + 1]
            module = ".".join(base + ([node.module] if node.module else []))
        else:
            module = node.module or ""
        found.extend((module, alias.name) for alias in node.names
                     if alias.name.startswith("_") and not alias.name.startswith("__")
                     and f"{module}.{alias.name}" not in MODULES)
    return found


def test_no_private_name_is_imported_from_another_package() -> None:
    """A ``_name`` is its module's own; a sibling in its package may use it, another package
    goes through a public name (``reconcile.providers.scheme.header``, ``reconcile.sync.claim``).
    Private modules (``reconcile.credits._core``) are the ``private-modules`` contract's."""
    across = sorted(f"{name} imports {private} from {module}"
                    for name, path in MODULES.items()
                    for module, private in private_imports(name, path.read_text(),
                                                           path.name == "__init__.py")
                    if module.split(".")[0] == "reconcile"
                    and top_package(module) != top_package(name))
    assert across == []


def test_the_private_name_scan_sees_every_import() -> None:
    source = textwrap.dedent("""
        from typing import TYPE_CHECKING
        from .predicates import _hidden
        from ..credits import _core
        if TYPE_CHECKING:
            from ..sync import _claim
        def f():
            from reconcile.providers.scheme import _header, header
        """)
    found = private_imports("reconcile.jobstore.events", source, is_package=False)
    assert found == [("reconcile.jobstore.predicates", "_hidden"), ("reconcile.sync", "_claim"),
                     ("reconcile.providers.scheme", "_header")]
    assert [top_package(module) for module, _ in found] == [
        "reconcile.jobstore", "reconcile.sync", "reconcile.providers"]


def test_the_providers_core_modules_sit_below_every_other_layer() -> None:
    """``providers.base`` and ``providers.deadline`` are core modules inside ``reconcile.providers``,
    which the ``layers`` contract places whole in the gateway (so that a new provider family needs
    no line in the map): ``providers-core`` holds them below every module above the core layer,
    each family package through ``providers.family``, which every family imports."""
    core = {"reconcile.providers.base", "reconcile.providers.deadline"}
    assert len(CONTRACTS["providers-core"]["layers"]) == 2
    assert {name for name in MODULES if layer_of(name, "providers-core") == 0} == core
    packages = {f"reconcile.providers.{family.name}" for family in families()}
    above = sorted(name for name in MODULES if name not in core and (layer_of(name) or CORE) > CORE
                   and name != "reconcile.providers"
                   and not any(name == p or name.startswith(p + ".") for p in packages))
    assert len(above) > 100 and "reconcile.providers.family" in above
    assert [name for name in above if layer_of(name, "providers-core") != 1] == []
    graph = import_graph()
    assert all(graph.direct_import_exists(importer=p, imported="reconcile.providers.family")
               for p in packages)
