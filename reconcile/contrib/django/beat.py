"""Internal: the library's beat entries keep their ``expires`` under django-celery-beat.

django-celery-beat's ``DatabaseScheduler`` stores each ``beat_schedule`` entry as a
``PeriodicTask`` row when beat starts and reads its options back from that row; the row has no
field for ``options["expires"]`` (it keeps ``expire_seconds``), so the sweep's tick, the
retention tick and the batch poller's tick would be sent without an expiry and pile up behind a
busy worker. On ``beat_init`` (after the scheduler stored the entries, before its first tick)
the library's entries are stored again with ``expire_seconds`` = their ``expires`` (whole
seconds, rounded up), and the scheduler reloads them from their rows. Connected by the app's
``ready()`` when ``django_celery_beat`` is installed; any other scheduler is left alone.
"""

from __future__ import annotations

import logging
import math
from datetime import timedelta
from typing import Any

log = logging.getLogger("reconcile.django")


def expire_seconds(options: dict[str, Any]) -> int | None:
    """``options["expires"]`` (seconds or a timedelta) as django-celery-beat's whole seconds."""
    expires = options.get("expires")
    if isinstance(expires, timedelta):
        expires = expires.total_seconds()
    if isinstance(expires, bool) or not isinstance(expires, int | float) or expires <= 0:
        return None
    return max(1, math.ceil(expires))


def keep_expires(sender: Any = None, **_: Any) -> None:
    """``beat_init``: store the library's entries with their expiry (DatabaseScheduler only)."""
    from django_celery_beat.schedulers import DatabaseScheduler  # type: ignore[import-untyped]

    from ...celery_install import BEAT_ENTRY, POLL_DUE_ENTRY, PRUNE_ENTRY

    scheduler = getattr(sender, "scheduler", None)
    if not isinstance(scheduler, DatabaseScheduler):
        return
    schedule = scheduler.app.conf.beat_schedule or {}
    entries = {}
    for name in (BEAT_ENTRY, PRUNE_ENTRY, POLL_DUE_ENTRY):
        entry = schedule.get(name)
        options = dict((entry or {}).get("options") or {})
        seconds = expire_seconds(options)
        if entry is None or seconds is None or options.get("expire_seconds") is not None:
            continue
        options.pop("expires")
        entries[name] = {**entry, "options": {**options, "expire_seconds": seconds}}
    if entries:
        scheduler.update_from_dict(entries)
        log.info("beat_entries_expire_seconds %s",
                 ", ".join(f"{k}={v['options']['expire_seconds']}" for k, v in entries.items()))
