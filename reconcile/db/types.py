"""Internal: the library's own mechanics, not an import path for platforms (may move).

Column types that behave the same on PostgreSQL and the embedded SQLite default."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, DateTime
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

# jsonb on PostgreSQL (the platform's type), JSON text elsewhere.
JSONType = JSON().with_variant(JSONB(), "postgresql")


class UTCDateTime(TypeDecorator[datetime]):
    """``timestamptz`` on PostgreSQL; on SQLite a naive UTC value, returned as aware UTC."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a timestamptz column; use aware UTC")
        value = value.astimezone(UTC)
        if dialect.name == "sqlite":
            return value.replace(tzinfo=None)
        return value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        found: datetime = value
        if found.tzinfo is None:
            return found.replace(tzinfo=UTC)
        return found.astimezone(UTC)
