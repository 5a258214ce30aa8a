"""The public API: the modules ``docs/reference/api.md`` documents, each with an ``__all__``
that page lists in full; every other module of ``reconcile/`` says ``Internal:`` on its
docstring's first line; the documentation and the example platforms import only public names."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

from reconcile.core.facade import MOVED

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "reference" / "api.md").read_text()
PUBLIC = re.findall(r"^## `(reconcile(?:\.\w+)*)`", PAGE, re.M)
MODULES = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
           for p in sorted((ROOT / "reconcile").rglob("*.py"))}
ENTRY_POINTS = re.compile(r"(\.__main__$|^reconcile\.migrations\.(env|versions)\b)")


def _first_doc_line(name: str) -> str:
    return (ast.get_docstring(ast.parse(MODULES[name].read_text())) or "").partition("\n")[0]


def _section(module: str) -> str:
    return PAGE.split(f"## `{module}`", 1)[1].split("\n## ", 1)[0]


def test_the_page_names_the_public_modules() -> None:
    assert "reconcile" in PUBLIC and "reconcile.api" in PUBLIC
    assert len(PUBLIC) == len(set(PUBLIC)) and set(PUBLIC) <= set(MODULES)


@pytest.mark.parametrize("module", PUBLIC)
def test_a_public_module_exports_what_the_page_lists(module: str) -> None:
    names = importlib.import_module(module).__all__
    assert len(names) == len(set(names)), "a name listed twice in __all__"
    assert sorted(n for n in names if not hasattr(importlib.import_module(module), n)) == []
    listed = set(re.findall(r"`(\w+)`", _section(module)))
    assert sorted(set(names) - listed) == [], "document these in docs/reference/api.md"
    assert not _first_doc_line(module).startswith("Internal:")


def test_every_other_module_says_internal() -> None:
    namespaces = {m.rsplit(".", n)[0] for m in PUBLIC for n in range(1, m.count(".") + 1)}
    unmarked = [name for name in MODULES if name not in set(PUBLIC) | namespaces
                and not ENTRY_POINTS.search(name)
                and not any(_first_doc_line(".".join(name.split(".")[:n])).startswith("Internal:")
                            for n in range(2, name.count(".") + 2)
                            if ".".join(name.split(".")[:n]) in MODULES)]
    assert unmarked == [], "a module not in docs/reference/api.md must say Internal:"


_FROM = re.compile(r"\bfrom[ \t]+(reconcile(?:\.\w+)*)[ \t]+import[ \t]+([\w \t,]+)")  # one line
_IMPORT = re.compile(r"^\s*import\s+(reconcile(?:\.\w+)*)", re.M)


def imports_in(text: str) -> list[tuple[str, str | None]]:
    """``(module, name)`` for every ``from reconcile… import name`` and ``(module, None)`` for
    every ``import reconcile…`` in ``text`` (code blocks and inline code alike)."""
    found: list[tuple[str, str | None]] = []
    for module, names in _FROM.findall(text):
        found += [(module, name.split()[0]) for name in names.split(",") if name.split()]
    return found + [(module, None) for module in _IMPORT.findall(text)]


def not_public(imports: list[tuple[str, str | None]]) -> list[str]:
    bad = set()
    for module, name in imports:
        if name is not None and f"{module}.{name}" in PUBLIC:  # from reconcile import credits
            module, name = f"{module}.{name}", None
        if module not in PUBLIC:
            bad.add(module)
        elif name is not None and name not in importlib.import_module(module).__all__:
            bad.add(f"{module}.{name}")
    return sorted(bad)


def test_imports_in_finds_every_form() -> None:
    text = ("from reconcile import credits\nfrom reconcile import sync_call, run_sync as r\n"
            "use (`from reconcile.testing.fixtures import simulator`)\nimport reconcile\n")
    assert imports_in(text) == [("reconcile", "credits"), ("reconcile", "sync_call"),
                                ("reconcile", "run_sync"),
                                ("reconcile.testing.fixtures", "simulator"), ("reconcile", None)]
    assert not_public([("reconcile.jobstore", "load"), ("reconcile.sync", "sync_call"),
                       ("reconcile", "claim_lease"), ("reconcile", "api")]) == [
        "reconcile.claim_lease", "reconcile.jobstore", "reconcile.sync"]


def test_the_documentation_and_the_examples_import_only_public_names() -> None:
    texts = [p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")),
                                     *sorted((ROOT / "examples").rglob("*.py"))]]
    imports = [i for text in texts for i in imports_in(text)]
    assert len(imports) >= 20
    assert not_public(imports) == []


MOVED_NAMES = [(module, name, home) for module, names in MOVED.items()
               for name, home in names.items()]


@pytest.mark.parametrize(("module", "name", "home"), MOVED_NAMES)
def test_a_moved_name_keeps_working_from_its_old_module_and_warns(
        module: str, name: str, home: str) -> None:
    with pytest.warns(DeprecationWarning, match=f"import {name} from {home} "):
        old = getattr(importlib.import_module(module), name)
    assert old is getattr(importlib.import_module(home), name)
    assert name in importlib.import_module(home).__all__


def test_the_library_reads_its_own_modules_without_a_warning() -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        exec("from reconcile.sync import sync_call", {"__name__": "reconcile.lifecycle.x"})
        with pytest.raises(DeprecationWarning):
            exec("from reconcile.sync import sync_call", {"__name__": "acme.jobs"})
