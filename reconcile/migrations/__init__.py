"""The library's Alembic migrations, shipped inside the package (``env.py`` + ``versions/``).

``reconcile db upgrade`` (or :func:`reconcile.db.migrate.upgrade`) runs them from wherever the
package is installed; a checkout's root ``alembic.ini`` runs the same files. The library keeps
its own version table, ``reconcile_alembic_version``, beside the platform's ``alembic_version``.

A platform's own Alembic ``env.py`` passes :func:`include_object` to ``context.configure`` so
its ``alembic revision --autogenerate`` (and ``alembic check``) never proposes dropping what the
library created::

    from reconcile.migrations import include_object, normalise_url
    context.configure(..., target_metadata=Base.metadata, include_object=include_object)

or, when the platform has its own filter, ``include_object=library_excluded(mine)``.
:func:`normalise_url` gives a plain ``postgresql://`` URL the psycopg 3 driver, as the
library's own engines do.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..db.session import normalise_url

__all__ = [
    "IncludeObject", "LOCATION", "PLATFORM_TABLES", "VERSION_TABLE", "include_object",
    "is_library_object", "library_excluded", "normalise_url",
]

LOCATION = Path(__file__).resolve().parent
VERSION_TABLE = "reconcile_alembic_version"
# the seed's platform tables: the library maps them but does not own them
PLATFORM_TABLES = frozenset({"jobs", "usage_logs", "workflow_executions"})
# bookkeeping tables the migrations create without a model
_UNMAPPED_TABLES = frozenset({VERSION_TABLE, "reconcile_created_objects"})

IncludeObject = Callable[[Any, str | None, str, bool, Any], bool]


@lru_cache(maxsize=1)
def _library() -> tuple[frozenset[str], dict[str, frozenset[str]], frozenset[str]]:
    """(tables the library owns, its columns on each platform table, its index names)."""
    from reconcile.db.models import Base

    tables = Base.metadata.tables
    owned = frozenset(name for name in tables if name not in PLATFORM_TABLES) | _UNMAPPED_TABLES
    columns = {name: frozenset(c.name for c in tables[name].columns)
               for name in PLATFORM_TABLES if name in tables}
    indexes = frozenset(ix.name for t in tables.values() for ix in t.indexes if ix.name)
    constraints = frozenset(c.name for t in tables.values() for c in t.constraints
                            if isinstance(c.name, str))
    return owned, columns, indexes | constraints


def is_library_object(obj: Any, name: str | None, type_: str, reflected: bool,
                      compare_to: Any) -> bool:
    """True for a database object the library's migrations made that the platform's metadata
    does not describe: a library table, a library column/index on a platform table."""
    owned, columns, named = _library()
    if type_ == "table":
        return name in owned
    table = getattr(getattr(obj, "table", None), "name", None)
    if table in owned:
        return True
    if not reflected or compare_to is not None:
        return False  # the platform's own model describes it: compare as usual
    if type_ == "column":
        return name in columns.get(table or "", frozenset())
    return name is not None and (name in named or name.startswith("reconcile_"))


def include_object(obj: Any, name: str | None, type_: str, reflected: bool,
                   compare_to: Any) -> bool:
    """An Alembic ``include_object`` that leaves the library's objects out of autogenerate."""
    return not is_library_object(obj, name, type_, reflected, compare_to)


def library_excluded(include: IncludeObject) -> IncludeObject:
    """The platform's own ``include_object`` with the library's objects excluded first."""

    def combined(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
        return include_object(obj, name, type_, reflected, compare_to) and \
            include(obj, name, type_, reflected, compare_to)

    return combined
