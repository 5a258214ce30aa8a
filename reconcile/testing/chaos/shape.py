"""Internal: the database shape of a chaos run (``--db-timezone``, ``--naive-timestamps``): set
before the migrations, read back for the report."""

from __future__ import annotations

from .control import ChaosConfig


def _plain_url(config: ChaosConfig, db_name: str) -> str:
    return config.pg_admin.rsplit("/", 1)[0] + "/" + db_name


def _shape_database(config: ChaosConfig, db_name: str) -> None:
    """Before the migrations: the database's default time zone (``--db-timezone``) and the
    platform's own tables with naive timestamps (``--naive-timestamps``), as a platform has
    them; the migrations then add the library's columns and tables beside them."""
    import psycopg

    from ..platform_schema import create_platform_tables, set_database_timezone

    if config.db_timezone:
        with psycopg.connect(config.pg_admin, autocommit=True, connect_timeout=10) as conn:
            set_database_timezone(conn, db_name, config.db_timezone)
    if config.naive_timestamps:
        with psycopg.connect(_plain_url(config, db_name), autocommit=True,
                             connect_timeout=10) as conn:
            create_platform_tables(conn, naive=True)


def _database_shape(config: ChaosConfig, db_name: str, db_url: str) -> str:
    """What the run really got, read back: a plain session's zone (the platform's view), the
    library's session zone, and the type of the platform's timestamp columns."""
    import psycopg
    from sqlalchemy import text

    from ...db.session import make_engine

    with psycopg.connect(_plain_url(config, db_name), connect_timeout=10) as conn:
        zone = conn.execute("SHOW TimeZone").fetchone()
        types = sorted({row[0] for row in conn.execute(
            "SELECT data_type FROM information_schema.columns WHERE table_name IN "
            "('jobs', 'usage_logs') AND column_name IN ('created_at', 'started_at', "
            "'completed_at')")})
    engine = make_engine(db_url, pool_size=1, max_overflow=0)
    try:
        with engine.connect() as conn:
            library_zone = conn.execute(text("SHOW TimeZone")).scalar_one()
    finally:
        engine.dispose()
    return (f"TimeZone={zone[0] if zone else '?'} (library sessions: {library_zone}), "
            f"platform timestamps: {', '.join(types)}")
