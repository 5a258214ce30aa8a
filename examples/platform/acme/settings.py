"""acme's own settings; the library reads its ``RECONCILE_*`` variables itself."""

from __future__ import annotations

import os

from reconcile import Settings


def database_url() -> str:
    """acme and the library share one database (the library's tables sit beside acme's)."""
    url = os.environ.get("ACME_DATABASE_URL") or os.environ.get("RECONCILE_DATABASE_URL")
    if not url:
        raise SystemExit("set ACME_DATABASE_URL (or RECONCILE_DATABASE_URL) to acme's PostgreSQL")
    return url


def broker_url() -> str:
    return os.environ.get("ACME_BROKER_URL") or Settings().broker_url


# what acme charges per job, by provider kind (the library never invents a price)
PRICES = {"kie-standard": 10, "replicate-prediction": 12, "fal-queue": 8, "elevenlabs-dubbing": 30}
DEFAULT_PRICE = 10
