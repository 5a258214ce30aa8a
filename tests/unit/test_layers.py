"""The layer contract (README "Architecture"): no module imports a higher layer.

``LAYERS`` maps a module-name prefix (whole dotted components; the longest prefix wins) to a
rank. An AST scan of every module in ``reconcile/`` checks its top-level imports **and** its
function-local imports (both run). Imports under ``if TYPE_CHECKING:`` are not checked: they
exist only for annotations and never run. A module that no prefix places fails the test, so a
new module has to be given a layer. ``ALLOWED_UPWARD`` lists the genuine upward imports of
today, each with its reason; any other upward import fails.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "reconcile"

CORE, DB, GATEWAY, KINDS, JOBS, LEDGER, RUNTIME, LIFECYCLE, FLOWS, CELERY, EDGE, OPS, TESTING, DEMO = \
    range(14)

LAYERS = {
    # 0 core: pure types, constants, errors, settings (no I/O of their own); core/ holds the
    # private helpers (redact)
    "reconcile.settings": CORE, "reconcile.states": CORE, "reconcile.errors": CORE,
    "reconcile.settlement": CORE, "reconcile.core": CORE, "reconcile.media.types": CORE,
    "reconcile.db.types": CORE, "reconcile.providers.base": CORE,
    "reconcile.providers.deadline": CORE,
    # 1 db: schema, engines, migrations
    "reconcile.db": DB, "reconcile.migrations": DB,
    # 2 gateway: provider HTTP clients, the media fetch and its guard, storage, webhook schemes.
    # A provider family is one package here (clients, webhook scheme, its FAMILY declaration);
    # the declaration's type and registry (providers.family: Kind, ProviderFamily) and the
    # schemes' toolkit (providers.scheme) sit in this layer too, below the kinds registry and
    # the webhooks facade that derive from them
    "reconcile.providers": GATEWAY, "reconcile.media": GATEWAY, "reconcile.storage": GATEWAY,
    "reconcile.webhooks": GATEWAY,
    # 3 kinds: the provider-kind registry (thresholds, client factories, webhook schemes)
    "reconcile.kinds": KINDS,
    # 4 jobs: guarded writes and reads of jobs and its side tables (jobstore: predicates, CAS,
    # writers by seam; events, evidence, retention, the legacy-row rules) and idempotency keys.
    # The sweep's pure decision table sits here too: it may import the predicates, the adoption
    # rules and the kinds, never the runtime, the lifecycle or its own executor.
    "reconcile.jobstore": JOBS, "reconcile.idempotency": JOBS, "reconcile.sweep.table": JOBS,
    # 5 ledger: credits (and the platform-balance import), its audit, the seam
    "reconcile.credits": LEDGER, "reconcile.audit": LEDGER, "reconcile.ledger": LEDGER,
    # 6 runtime: what every step is handed (sessions, clients, ledger, hooks)
    "reconcile.runtime": RUNTIME,
    # 7 lifecycle: submit, create, poll (chain and batch), finalize, fail, settle, cancel; the
    # package's submodules import one another and never a flow above them
    "reconcile.lifecycle": LIFECYCLE,
    # 8 flows built on the lifecycle: sync calls, the sweep, orchestrator waits
    "reconcile.sync": FLOWS, "reconcile.sweep": FLOWS, "reconcile.orchestrator": FLOWS,
    # the operator actions (fail, resolve, retry a settlement, release an orphan) every
    # surface calls: the CLI, the console, the Django admin
    "reconcile.operator": FLOWS,
    # 9 celery: tasks, install, the standalone app, its settings; worker/ holds the broker patch
    "reconcile.tasks": CELERY, "reconcile.celery_install": CELERY, "reconcile.celery_app": CELERY,
    "reconcile.celery_settings": CELERY, "reconcile.worker": CELERY,
    # 10 edge: the gateway helpers and webhook ingestion a platform's web layer calls
    "reconcile.api": EDGE, "reconcile.webhook_ingest": EDGE,
    # 11 ops: the operator command (its reports, metrics), the package facade (install)
    "reconcile": OPS, "reconcile.ops": OPS, "reconcile.cli": OPS, "reconcile.__main__": OPS,
    # the operator console: a mountable ASGI app over the operator reads and actions
    "reconcile.console": OPS,
    # the Django integration: settings from Django's, the CLI as a management command
    "reconcile.contrib": OPS,
    # 12 testing: simulator, fixtures, chaos, explorer;  13 demo
    "reconcile.testing": TESTING, "reconcile.demo": DEMO,
    # a Django platform's test helpers (its runner, fixtures, the simulator in its settings)
    "reconcile.contrib.django.testing": TESTING,
}

# (importer, imported): the upward imports that exist today, all function-local.
ALLOWED_UPWARD = {
    # Runtime.from_settings checks at start-up that SYNC_DEADLINE fits every sync kind; the
    # check lives with the sync helper (it owns the deadline). Candidate: move the check down.
    ("reconcile.runtime", "reconcile.sync"),
    # `reconcile simulator` and `reconcile demo` are commands of the operator CLI that start
    # the top-layer tools; imported inside the command so the CLI never loads them otherwise.
    ("reconcile.ops.tools", "reconcile.testing.simulator"),
    ("reconcile.ops.tools", "reconcile.demo"),
    # a provider family declares its own settings fields (FAMILY.urls, secrets, settings):
    # Settings.with_families() adds them, importing the families when the first Settings is
    # built, never when reconcile.settings is imported (the families' clients import it)
    ("reconcile.settings", "reconcile.providers.family"),
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))
           if "versions" not in p.relative_to(PACKAGE).parts}


def layer_of(name: str) -> int | None:
    parts = name.split(".")
    if name == "reconcile":  # the package facade is placed alone, never as a prefix
        return LAYERS[name]
    for n in range(len(parts), 1, -1):
        rank = LAYERS.get(".".join(parts[:n]))
        if rank is not None:
            return rank
    return None


def _imports(name: str, path: Path) -> set[str]:
    """The reconcile modules ``name`` imports at top level or inside functions (not under
    ``if TYPE_CHECKING:``), each resolved to the module it loads."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for other in child.orelse:
                    visit(other)
                continue
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names if a.name.split(".")[0] == "reconcile")
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = ".".join(package[: len(package) - child.level + 1]
                                    + ([child.module] if child.module else []))
                else:
                    base = child.module or ""
                if base.split(".")[0] == "reconcile":
                    for alias in child.names:  # `from . import x` loads the module x
                        sub = f"{base}.{alias.name}"
                        found.add(sub if sub in MODULES else base)
            visit(child)

    visit(ast.parse(path.read_text()))
    resolved = set()
    for target in found:
        while target not in MODULES and "." in target:
            target = target.rsplit(".", 1)[0]
        if target != name:
            resolved.add(target)
    return resolved


def upward_imports() -> set[tuple[str, str]]:
    out = set()
    for name, path in MODULES.items():
        for target in _imports(name, path):
            low, high = layer_of(name), layer_of(target)
            if low is not None and high is not None and high > low:
                out.add((name, target))
    return out


def test_every_module_has_a_layer() -> None:
    unplaced = sorted(name for name in MODULES if layer_of(name) is None)
    assert unplaced == [], f"add each new module to LAYERS: {unplaced}"


def test_no_module_imports_a_higher_layer() -> None:
    upward = upward_imports()
    assert sorted(upward - ALLOWED_UPWARD) == [], "a lower layer imports a higher one"
    assert sorted(ALLOWED_UPWARD - upward) == [], "an allowed upward import is gone: drop it"


def test_the_scan_sees_local_imports_and_skips_type_checking(tmp_path: Path) -> None:
    source = ("from typing import TYPE_CHECKING\nfrom .states import Status\n"
              "if TYPE_CHECKING:\n    from .sweep import sweep\n"
              "def f():\n    from . import api\n    import reconcile.tasks\n")
    fake = tmp_path / "errors.py"
    fake.write_text(source)
    imports = _imports("reconcile.errors", fake)
    assert imports == {"reconcile.states", "reconcile.api", "reconcile.tasks"}
    assert layer_of("reconcile.providers.kie.market") == GATEWAY
    assert layer_of("reconcile.providers.kie.webhook") == GATEWAY
    assert layer_of("reconcile.providers.family") == GATEWAY < layer_of("reconcile.kinds")  # type: ignore[operator]
    assert layer_of("reconcile.providers.base") == CORE
    assert layer_of("reconcile.unknown_module") is None
