"""Integration fixtures shared across files: ``ledger_backend`` (each ledger backend in turn)."""

from tests.integration.ledgers import ledger_backend  # noqa: F401
