"""The public API, pinned (issue 17 deliverable 5; the idea of httpx's tests/test_exported_members.py).

Every module of ``reconcile/`` is either **public** (listed in ``EXPORTED`` with its exact
``__all__``) or **private** (listed in ``PRIVATE`` / ``PRIVATE_PACKAGES``, or underscore-named, and
its docstring's first line starts with ``Internal:``). A public module's ``__all__`` must equal the
pinned set and name only things that exist; a public-looking name *defined* in a public module
(a top-level ``def``, ``class`` or assignment without a leading underscore) must be either exported
or listed in ``NOT_EXPORTED`` — so a new function has to be placed on one side on purpose. Every
``from reconcile… import …`` in the user documentation (``README.md`` and ``docs/``) and in
``examples/`` must name a public module or an exported name.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

from reconcile.providers.family import families

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "reconcile"

EXPORTED = {
    "reconcile": {"__version__", "install"},
    "reconcile.api": {
        "Response", "cancel", "credit_history", "error_response", "events_after", "follow",
        "snapshot", "snapshot_body", "submit",
    },
    "reconcile.celery_app": {"app"},
    "reconcile.celery_install": {
        "BEAT_ENTRY", "CREATE_QUEUE", "POLL_DUE_ENTRY", "POLL_QUEUE", "PRUNE_ENTRY", "QUEUE",
        "QUEUES", "SWEEP_QUEUE", "SWEEP_TASK", "SettingConflict", "check_broker_limits",
        "check_settings", "connect_worker_checks", "consume_split_queues", "fresh_engines",
        "install", "installed_app", "library_settings", "routes",
    },
    "reconcile.celery_settings": {
        "accept_content", "beat_max_loop_interval", "beat_schedule",
        "broker_connection_retry_on_startup", "broker_transport_options", "broker_url",
        "result_backend", "task_acks_late", "task_default_queue", "task_ignore_result",
        "task_reject_on_worker_lost", "task_routes", "task_send_sent_event",
        "task_serializer", "task_soft_time_limit", "task_time_limit",
        "worker_cancel_long_running_tasks_on_connection_loss",
        "worker_enable_soft_shutdown_on_idle", "worker_eta_task_limit",
        "worker_prefetch_multiplier", "worker_send_task_events",
        "worker_soft_shutdown_timeout",
    },
    "reconcile.cli": {"Cli", "Failed", "JOB_ID", "NO_DATABASE", "Refused", "main"},
    "reconcile.credits": {
        "POOLS", "Pools", "RESERVED_PREFIXES", "Reservation", "Settlement", "audit",
        "commit", "grant", "history", "import_legacy_refund", "recharge", "refund",
        "release_orphan", "repair_usage_metadata", "reserve", "split_pro_rata",
    },
    "reconcile.db": set(),
    "reconcile.db.contract": {
        "BREAKS", "DIFFERS", "FAMILIES", "LIBRARY_TABLES", "NOTE", "PLATFORM_COLUMNS",
        "PLATFORM_TABLES", "Finding", "SchemaMismatch", "at_head", "check", "contract_markdown",
        "require", "usage_log_ids_assigned",
    },
    "reconcile.db.migrate": {"alembic_config", "downgrade", "repair", "upgrade"},
    "reconcile.db.models": {
        "Asset", "Base", "CreatedObject", "CreditAnomaly", "CreditBalance", "CreditLot",
        "CreditTransaction", "Job", "JobEvent", "OperatorAction", "ReconcileMeta", "SweepTick", "UsageLog",
        "WebhookDelivery", "WorkflowExecution", "table_of",
    },
    "reconcile.db.session": {
        "dispose_engines", "engine_for", "make_engine", "make_sessionmaker",
        "normalise_url", "rowcount", "session_scope",
    },
    "reconcile.errors": {
        "BadUsageMetadata", "Conflict", "CreateRateLimited", "CreateRejected",
        "CreateUncertain", "ErrorCode", "InsufficientCredits", "InvalidParam",
        "JobNotFound", "LedgerError", "LegacyRefundRefused", "MalformedResponse",
        "MediaError", "MediaExpired", "MediaFetchFailed", "MediaTooLarge", "ProviderError",
        "RAW_BODY_LIMIT", "ReadFailed", "ReconcileError", "SyncCallFailed",
        "UnsafeMediaURL", "WebhookError", "WebhookPayloadError", "WebhookSignatureError",
        "WebhookTimestampError", "bounded",
    },
    "reconcile.idempotency": {"MAX_KEY_LENGTH", "RETENTION"},
    "reconcile.kinds": {
        "BUILTIN_KINDS", "BUILTIN_PROVIDERS", "ClientFactory", "Kind", "all_kinds", "binding_key",
        "family_of_name", "get_kind", "provider_of", "register_kind", "unregister_kind",
    },
    "reconcile.ledger": {
        "BuiltinLedger", "COMPLETED_AFTER_REFUND", "DEFAULT", "Ledger", "audit",
        "commit_settled", "completed_after_failure", "job_checks",
    },
    "reconcile.lifecycle": {
        "CreateOutcome", "Submitted", "adopt_upstream_id", "create_step", "fail_job",
        "observe", "on_task_created", "poll_step", "poll_step_deadline", "read_status",
        "resolve_not_submitted", "resume_chain", "settle", "submit_job",
    },
    "reconcile.migrations": {
        "IncludeObject", "LOCATION", "PLATFORM_TABLES", "VERSION_TABLE", "include_object",
        "is_library_object", "library_excluded",
    },
    "reconcile.orchestrator": {"NODE_TIMEOUT", "NodeTimeout", "POLL_INTERVAL", "wait_for_job"},
    "reconcile.providers": set(),
    "reconcile.providers.base": {
        "AsyncProvider", "CreateRequest", "Created", "ListedTask", "OnTaskCreated",
        "Output", "PollResult", "PollStatus", "SyncProvider", "SyncResult", "resume",
        "run",
    },
    "reconcile.providers.outputs": {
        "Expect", "OutputSpec", "data_uri_output", "declare_output", "declared_output",
        "document_output", "text_output",
    },
    "reconcile.settlement": {
        "CANCEL_READ_CODE", "CANCEL_REQUESTED_EVENT", "DEFAULT_POLICY", "MAX_SHARE_DENOMINATOR", "NEVER_ACCEPTED",
        "RECORD_KEY", "Cause", "Decision", "Finished", "Path", "SettleOutcome",
        "SettlementPolicy", "decide", "kept_of", "path_of", "refund_share", "settlement_cause",
        "share_text", "whole_credits",
    },
    "reconcile.runtime": {
        "CompletionHook", "EventHook", "PricingHook", "Runtime", "Validator",
        "WatermarkHook",
    },
    "reconcile.settings": {
        "DEFAULT_SQLITE_URL", "LegacySweep", "PollMode", "QueueLayout", "Settings",
        "get_settings",
    },
    "reconcile.states": {
        "ATTEMPT_SPACING", "CREATE_CLAIM_LEASE", "IN_FLIGHT", "LEGACY_AGE", "MAX_ATTEMPTS",
        "MAX_CREATE_REENQUEUES", "MAX_RATE_LIMITED_CREATES", "NOT_STARTED_AGE",
        "POLL_LEASE_SLACK", "POLL_READ_ATTEMPTS", "POLL_READ_BACKOFF_MAX", "PUBLIC_STATE",
        "SETTLE_BACKOFF_BASE", "SETTLE_BACKOFF_MAX", "Status", "Submission", "TERMINAL", "UNKNOWN_OUTCOME",
        "settle_backoff",
    },
    "reconcile.storage": {
        "LocalStorage", "S3Storage", "Storage", "object_key", "storage_from_settings",
    },
    "reconcile.sweep": {
        "Action", "Decision", "SweepAction", "SweepReport", "decide", "reconcile_job",
        "sweep",
    },
    "reconcile.operator": {
        "ACTIONS", "ActionLost", "ActionRefused", "Done", "Operator", "allowed", "clean_reason",
        "records", "refusal", "run",
    },
    "reconcile.sync": {"SyncCall", "check_sync_deadline", "run_sync", "sync_call"},
    "reconcile.tasks": {
        "create", "enqueue_create", "enqueue_poll", "enqueue_reconcile_job", "get_runtime",
        "has_runtime",
        "poll", "poll_due", "prune", "reconcile_job", "reset_runtime", "set_runtime",
        "settle", "sweep",
    },
    "reconcile.console": {"AUTH_SETTING", "OperatorIdentity", "create_app", "load_authorizer"},
    "reconcile.contrib": set(),
    "reconcile.contrib.django": {
        "close_connections", "database_alias", "database_url", "eager", "export_environment",
        "jobs_migration", "runtime", "runtime_options", "settings", "url_for",
    },
    "reconcile.contrib.django.testing": {"ReconcileTestRunner", "flush", "simulated"},
    "reconcile.testing": set(),
    "reconcile.testing.fixtures": {"simulator", "simulator_env", "simulator_session"},
    "reconcile.testing.sim_registry": {
        "Example", "SimRoute", "SimWebhooks", "env_name", "examples", "load_builtin", "missing",
        "prefixes", "register_route", "register_webhooks", "registered_webhooks", "route",
        "routes", "sign", "unregister", "verify_key", "webhooks_for",
    },
    "reconcile.testing.simulator": {
        "Script", "SimSecrets", "Simulator", "SimulatorClient", "Task", "base_urls_for",
        "main",
    },
    "reconcile.webhook_ingest": {"BodyRefused", "CappedBody", "handle_webhook",
                                 "handle_webhook_stream", "read_capped"},
    "reconcile.webhooks": {
        "Binding", "DUBBING_NAME_PREFIX", "ELEVENLABS_TOLERANCE", "FAILED",
        "FAL_CHECKED_USER", "FAL_TOLERANCE", "JWKS_FAILURE_TTL", "JWKS_MAX_AGE",
        "JWKS_MAX_BYTES", "JWKS_MIN_REFRESH", "JwksCache", "KIE_TOLERANCE", "MAX_DEPTH",
        "PROVIDERS", "REPLICATE_TOLERANCE", "RUNNING", "SUCCEEDED", "WebhookEvent",
        "WebhookScheme", "event", "fresh_timestamp", "from_settings", "get_scheme",
        "header", "hmac_sha256", "json_object", "parse_jwks", "payload_digest",
        "register_webhook_scheme", "require_secret", "required_headers", "schemes",
        "unregister_webhook_scheme", "verify", "verify_elevenlabs", "verify_fal",
        "verify_kie", "verify_replicate",
    },
}

NOT_EXPORTED = {
    "reconcile.api": {
        "CUSTOMER_MESSAGES", "INTERNAL_MESSAGE", "NOT_FOUND_MESSAGE",
        "SUBMISSION_FAILED_MESSAGE", "SUBMISSION_UNCERTAIN_MESSAGE", "customer_message",
        "iso", "settlement_pending",
    },
    "reconcile.credits": {
        "LOT_PAGE", "SETTLED_KEY", "TERMINAL_JOB_STATUSES", "commit_txn_id", "held_pools",
        "legacy_refunded", "legacy_refunded_pools", "lock_balance",
        "recharge_commit_txn_id", "recharge_usage_txn_id", "refund_txn_id",
        "release_txn_id", "reservation_pools", "returned", "settle_commit", "settled_amount",
        "take_from_lots", "take_in_order", "usage_txn_id",
    },
    "reconcile.console": {"DevLogin"},
    "reconcile.db.migrate": {
        "LOCK_TIMEOUT", "STATEMENT_TIMEOUT", "add_column_if_absent",
        "create_index_concurrently", "create_table_if_absent", "drop_index_concurrently",
        "drop_recorded", "is_pg", "record", "record_missing_columns", "set_lock_timeout",
        "sqlite_has_column",
    },
    "reconcile.db.contract": {
        "ALWAYS_SET", "Column", "Family", "INSERTED_INTO", "NAIVE_UTC", "UUID_ONLY", "columns", "family_of",
        "head_revision",
    },
    "reconcile.db.models": {
        "BIGID", "COMPLETED_AFTER_FAILURE", "IN_FLIGHT", "IdempotencyKey", "NAMING",
        "UNKNOWN_OUTCOME_IN_FLIGHT",
        "POLL_DUE", "UsageLogId", "WorkerHeartbeat",
    },
    "reconcile.db.session": {"SQLITE_BUSY_TIMEOUT_MS"},
    "reconcile.idempotency": {
        "PURGE_BATCH", "Replay", "check_key", "claim", "fingerprint", "purge",
        "record_answer",
    },
    "reconcile.kinds": {"DEADLINE_MARGIN", "check_sync_deadline"},
    "reconcile.ledger": {"TERMINAL", "anomaly_recorded", "ledger_of"},
    "reconcile.lifecycle": {
        "exhaust", "finalize_job_with_media", "past_threshold", "poll_countdown",
        "poll_lease", "usable_task_id",
    },
    "reconcile.operator": {
        "FAIL", "REASON_MAX", "RELEASE_ORPHAN", "RESOLVES", "RESOLVE_NOT_SUBMITTED",
        "RESOLVE_UPSTREAM",
        "RETRY_SETTLE", "VIA",
    },
    "reconcile.orchestrator": {"mark_node_timed_out"},
    "reconcile.providers.base": {"JOB_REF_PREFIX", "unwrap_sdk"},
    "reconcile.runtime": {"utcnow"},
    "reconcile.sweep": {
        "BATCH_SIZE", "EVENT_REPUBLISH_AGE", "LATE_BATCH", "LISTING_SLACK", "RECOVERING",
        "SETTLE_GRACE",
    },
    "reconcile.sync": {"FINISH_SLACK", "claim", "claim_lease"},
    "reconcile.testing.simulator": {"PROVIDER_MODULES"},
}

# Names a public package keeps importable from its facade without exporting them (private names
# included, which ``NOT_EXPORTED`` does not list): a split must not break
# ``from reconcile.sweep import BATCH_SIZE``.
KEPT_IMPORTABLE = {
    "reconcile.sweep": {
        "BATCH_SIZE", "EVENT_REPUBLISH_AGE", "LATE_BATCH", "LISTING_SLACK", "RECOVERING",
        "SETTLE_GRACE", "_cursor_of", "_phases",
    },
    # moved down to reconcile.worker.installed (the tasks module enqueues through it)
    "reconcile.celery_install": {"send"},
    # moved down to reconcile.providers.output_spec (the family declarations default to MEDIA)
    "reconcile.providers.outputs": {"ANY", "MEDIA"},
    # moved down to reconcile.kinds (the runtime's start-up check runs it)
    "reconcile.sync": {"DEADLINE_MARGIN"},
}

# Private: the library's own mechanics, inside the layer packages (README "Architecture"); each
# says ``Internal:`` on its docstring's first line. The top level holds public modules only
# (``test_the_top_level_is_the_public_api``).
PRIVATE = {
    "reconcile.jobstore", "reconcile.jobstore.adoption", "reconcile.jobstore.batch",
    "reconcile.jobstore.cas", "reconcile.jobstore.create", "reconcile.jobstore.events",
    "reconcile.jobstore.evidence", "reconcile.jobstore.horizon", "reconcile.jobstore.poll",
    "reconcile.jobstore.predicates", "reconcile.jobstore.retention", "reconcile.jobstore.terminal",
    "reconcile.jobstore.turns", "reconcile.lifecycle.adopt", "reconcile.lifecycle.batch", "reconcile.lifecycle.cancel",
    "reconcile.lifecycle.create", "reconcile.lifecycle.finalize", "reconcile.lifecycle.poll",
    "reconcile.lifecycle.settling", "reconcile.lifecycle.submit",
    "reconcile.credits.importer",
    "reconcile.db.types",
    "reconcile.sweep.carry", "reconcile.sweep.claims", "reconcile.sweep.report",
    "reconcile.sweep.table", "reconcile.sweep.tick", "reconcile.sweep.liveness",
    "reconcile.jobstore.workers",
    "reconcile.providers.deadline", "reconcile.providers.family", "reconcile.providers.http",
    "reconcile.providers.kind", "reconcile.providers.outcome", "reconcile.providers.output_spec",
    "reconcile.providers.scheme",
    "reconcile.webhooks.registry",
    "reconcile.testing.counting", "reconcile.testing.platform_ledger",
    "reconcile.testing.platform_schema",
    "reconcile.testing.processes",
    "reconcile.testing.sim_control", "reconcile.testing.sim_core", "reconcile.testing.sim_delivery",
    "reconcile.testing.sim_http", "reconcile.testing.sim_main", "reconcile.testing.sim_signing",
    "reconcile.contrib.django.apps", "reconcile.contrib.django.admin",
    "reconcile.contrib.django.models", "reconcile.contrib.django.enqueue",
    "reconcile.contrib.django.beat",
}
# Private packages: the package says ``Internal:``; every module inside is private with it.
PRIVATE_PACKAGES = {
    "reconcile.audit", "reconcile.core", "reconcile.demo", "reconcile.media", "reconcile.ops",
    "reconcile.worker", "reconcile.testing.chaos",
    "reconcile.testing.explorer",
    "reconcile.contrib.django.management", "reconcile.contrib.django.migrations",
}
# Never imported here: entry points that run on import, and Alembic's environment and revisions.
NOT_IMPORTABLE = re.compile(r"(\.__main__$|^reconcile\.migrations\.(env|versions)\b)")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}

# A built-in provider family's plug-in units are private by rule, like the modules above: its
# package (clients, webhook scheme, declaration) and its simulator module — each of them says
# ``Internal:`` on its docstring's first line too. The families come from their declarations.
PLUGINS = {name for family in families()
           for name in (f"reconcile.providers.{family.name}", family.simulator or "")
           if name in MODULES}


def _private(name: str) -> bool:
    return (name in PRIVATE
            or any(name == p or name.startswith(p + ".") for p in PRIVATE_PACKAGES | PLUGINS)
            or any(part.startswith("_") and part != "__init__" for part in name.split(".")[1:]))


def _first_doc_line(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    return doc.splitlines()[0] if doc else ""


def _defined(path: Path) -> set[str]:
    """The public-looking names a module defines itself (not the ones it imports). A package's
    ``__init__`` also "defines" what it takes from its own submodules (``from .poll import x``):
    the facade of a package split into private submodules (``reconcile.lifecycle``) is held to
    the same rule as the module it replaced."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if path.name == "__init__.py" and isinstance(node, ast.ImportFrom) and node.level == 1 \
                and node.module is not None:
            names.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {n for n in names if not n.startswith("_") and n != "log"}


def test_every_module_is_public_or_private() -> None:
    unplaced = sorted(name for name in MODULES if not NOT_IMPORTABLE.search(name)
                      and name not in EXPORTED and not _private(name))
    assert unplaced == [], f"place each new module in EXPORTED or PRIVATE: {unplaced}"
    both = sorted(name for name in EXPORTED if _private(name))
    assert both == []
    missing = sorted((set(EXPORTED) | PRIVATE | PRIVATE_PACKAGES) - set(MODULES))
    assert missing == [], f"listed but not in reconcile/: {missing}"


def test_private_modules_say_internal() -> None:
    explicit = PRIVATE | PRIVATE_PACKAGES | PLUGINS
    unmarked = sorted(name for name in explicit if not _first_doc_line(MODULES[name]).startswith(
        "Internal:"))
    assert unmarked == []


def test_the_top_level_is_the_public_api() -> None:
    """A module directly in ``reconcile/`` is a public import path (it is in ``EXPORTED``); the
    library's own mechanics live in the layer packages (README "Architecture")."""
    top = sorted(name for name, path in MODULES.items()
                 if name.count(".") == 1 and path.name != "__init__.py"
                 and not NOT_IMPORTABLE.search(name))
    assert len(top) > 10  # the scan sees the top level
    assert sorted(name for name in top if name not in EXPORTED) == []


def test_public_modules_do_not_say_internal() -> None:
    marked = sorted(name for name in EXPORTED
                    if _first_doc_line(MODULES[name]).startswith("Internal:"))
    assert marked == []


@pytest.mark.parametrize("name", sorted(EXPORTED))
def test_exported_members(name: str) -> None:
    module = importlib.import_module(name)
    exported = module.__all__
    assert len(exported) == len(set(exported)), "a name listed twice in __all__"
    assert set(exported) == EXPORTED[name]
    absent = sorted(n for n in exported if not hasattr(module, n))
    assert absent == [], f"{name}.__all__ names what it does not have: {absent}"


@pytest.mark.parametrize("name", sorted(EXPORTED))
def test_public_members_are_exported_or_listed(name: str) -> None:
    """A public-looking name defined in a public module and missing from ``__all__`` is flagged
    unless it is deliberately kept out (``NOT_EXPORTED``): a sibling module uses it, platforms
    do not."""
    module = importlib.import_module(name)
    unexported = _defined(MODULES[name]) - set(module.__all__)
    assert unexported == NOT_EXPORTED.get(name, set())


def test_not_exported_lists_only_modules_that_are_pinned() -> None:
    assert set(NOT_EXPORTED) <= set(EXPORTED)
    assert set(KEPT_IMPORTABLE) <= set(EXPORTED)


@pytest.mark.parametrize("name", sorted(KEPT_IMPORTABLE))
def test_kept_names_stay_importable(name: str) -> None:
    module = importlib.import_module(name)
    kept = KEPT_IMPORTABLE[name]
    assert sorted(n for n in kept if not hasattr(module, n)) == []
    assert not kept & set(module.__all__), "a kept name is exported: pin it in EXPORTED"


_FROM = re.compile(r"\bfrom[ \t]+(reconcile(?:\.\w+)*)[ \t]+import[ \t]+([\w \t,]+)")  # one line
_IMPORT = re.compile(r"^\s*import\s+(reconcile(?:\.\w+)*)", re.M)


def imports_in(text: str) -> list[tuple[str, str | None]]:
    """``(module, name)`` for every ``from reconcile… import name`` and ``(module, None)`` for
    every ``import reconcile…`` in ``text`` (code blocks and inline code alike)."""
    found: list[tuple[str, str | None]] = []
    for module, names in _FROM.findall(text):
        for name in names.split(","):
            name = name.split()[0] if name.split() else ""  # "x as y" -> "x"
            if name:
                found.append((module, name))
    found.extend((module, None) for module in _IMPORT.findall(text))
    return found


def _not_public(imports: list[tuple[str, str | None]]) -> list[str]:
    bad = []
    for module, name in imports:
        if name is not None and f"{module}.{name}" in MODULES:  # from reconcile import credits
            module, name = f"{module}.{name}", None
        if module not in EXPORTED:
            bad.append(module)
        elif name is not None and name not in EXPORTED[module]:
            bad.append(f"{module}.{name}")
    return sorted(set(bad))


def test_imports_in_finds_every_form() -> None:
    text = ("from reconcile import credits\nfrom reconcile.sync import sync_call, run_sync\n"
            "use (`from reconcile.testing.fixtures import simulator`)\nimport reconcile\n")
    assert imports_in(text) == [("reconcile", "credits"), ("reconcile.sync", "sync_call"),
                                ("reconcile.sync", "run_sync"),
                                ("reconcile.testing.fixtures", "simulator"), ("reconcile", None)]
    assert _not_public([("reconcile.jobstore", "load"), ("reconcile.sync", "claim_lease")]) == [
        "reconcile.jobstore", "reconcile.sync.claim_lease"]


def test_readme_imports_are_exported() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    imports = [i for page in pages if page.exists() for i in imports_in(page.read_text())]
    assert len(imports) >= 8  # the samples: migrations, credits, sync, webhooks, kinds…
    assert _not_public(imports) == []


def test_example_platform_imports_are_exported() -> None:
    imports = [i for p in sorted((ROOT / "examples").rglob("*.py")) for i in imports_in(p.read_text())]
    assert imports
    assert _not_public(imports) == []
