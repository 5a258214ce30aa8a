"""Internal: the library's own mechanics, not an import path for platforms (may move).

Prometheus metrics read from the database at scrape time (optional extra ``metrics``).

The numbers live in the tables, not in any one process, so a collector queries them on each
scrape instead of counting events: every worker, the beat and the CLI see the same values, and a
restart loses nothing. ``prometheus-client`` is imported only when metrics are used
(``pip install 'reconcile[metrics]'``).

=======================================================  =====================================
metric (all gauges)                                      labels
=======================================================  =====================================
``reconcile_up``                                         1 when the last scrape read the DB
``reconcile_inflight_jobs``                              ``kind``, ``status``
``reconcile_inflight_oldest_age_seconds``                ``kind``
``reconcile_uncertain_submissions``                      ``kind``
``reconcile_unsettled_refunds``                          (failed/cancelled, refund pending)
``reconcile_job_outcomes``                               ``status``, ``error_code``
``reconcile_credit_anomalies``                           ``kind`` (the anomaly's kind)
``reconcile_scrape_duration_seconds``
=======================================================  =====================================

``kind`` is the job's ``provider_kind``, ``legacy`` for rows without one; ``error_code`` is empty
for jobs without one. ``reconcile_job_outcomes`` counts every terminal job in the table (a
counter that can only drop if rows are deleted); it is one grouped scan of ``jobs`` per scrape —
keep the scrape interval in minutes on a very large table. The other queries touch only in-flight
rows, pending settlements and anomalies.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, or_, select

from ..db.models import CreditAnomaly, Job
from ..states import IN_FLIGHT, TERMINAL, Status, Submission

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import Metric

    from ..runtime import Runtime

log = logging.getLogger("reconcile.metrics")

LEGACY = "legacy"


class MetricsUnavailable(ImportError):
    """prometheus-client is not installed: pip install 'reconcile[metrics]'."""

    def __init__(self) -> None:
        super().__init__(self.__doc__)


def _prometheus() -> Any:
    try:
        import prometheus_client
        import prometheus_client.core
    except ImportError as exc:
        raise MetricsUnavailable() from exc
    return prometheus_client


class JobsCollector:
    """A Prometheus collector that reads the jobs, settlements and anomalies on each scrape."""

    def __init__(self, rt: Runtime) -> None:
        _prometheus()
        self.rt = rt

    def _families(self) -> dict[str, Any]:
        core = _prometheus().core
        g = core.GaugeMetricFamily
        return {
            "up": g("reconcile_up", "1 when the last scrape could read the database."),
            "inflight": g("reconcile_inflight_jobs", "Jobs pending or processing.",
                          labels=["kind", "status"]),
            "oldest": g("reconcile_inflight_oldest_age_seconds",
                        "Age of the oldest in-flight job (since its provider call, else start).",
                        labels=["kind"]),
            "uncertain": g("reconcile_uncertain_submissions",
                           "Submissions with an unknown outcome (uncertain, or submitting with an "
                           "expired claim), waiting for evidence or an operator.", labels=["kind"]),
            "unsettled": g("reconcile_unsettled_refunds",
                           "Failed or cancelled jobs whose refund has not settled yet."),
            "outcomes": g("reconcile_job_outcomes", "Terminal jobs by status and error code.",
                          labels=["status", "error_code"]),
            "anomalies": g("reconcile_credit_anomalies", "Rows in credit_anomalies by kind.",
                           labels=["kind"]),
            "duration": g("reconcile_scrape_duration_seconds", "Time the database reads took."),
        }

    def describe(self) -> Iterable[Metric]:
        """The metric names, without touching the database (used at registration)."""
        return list(self._families().values())

    def collect(self) -> Iterable[Metric]:
        fam = self._families()
        started = time.perf_counter()
        try:
            self._read(fam)
        except Exception:  # a scrape must answer: report the DB as down instead of a 500
            log.exception("metrics_scrape_failed")
            fam = {"up": fam["up"], "duration": fam["duration"]}
            fam["up"].add_metric([], 0)
        else:
            fam["up"].add_metric([], 1)
        fam["duration"].add_metric([], time.perf_counter() - started)
        return list(fam.values())

    def _read(self, fam: dict[str, Any]) -> None:
        now = self.rt.now()
        since = func.coalesce(Job.provider_call_started_at, Job.started_at, Job.created_at)
        expired = or_(Job.claim_expires_at.is_(None), Job.claim_expires_at < now)
        with self.rt.sessions() as session:
            oldest: dict[str, Any] = {}
            for kind, status, count, first in session.execute(
                select(Job.provider_kind, Job.status, func.count(), func.min(since))
                .where(Job.status.in_(IN_FLIGHT)).group_by(Job.provider_kind, Job.status)
            ):
                kind = kind or LEGACY
                fam["inflight"].add_metric([kind, status], count)
                if first is not None and (kind not in oldest or first < oldest[kind]):
                    oldest[kind] = first
            for kind, first in sorted(oldest.items()):
                fam["oldest"].add_metric([kind], max(0.0, (now - first).total_seconds()))

            for kind, count in session.execute(
                select(Job.provider_kind, func.count()).where(
                    Job.status.in_(IN_FLIGHT),
                    or_(Job.submission_state == Submission.UNCERTAIN,
                        (Job.submission_state == Submission.SUBMITTING) & expired),
                ).group_by(Job.provider_kind)
            ):
                fam["uncertain"].add_metric([kind or LEGACY], count)

            fam["unsettled"].add_metric([], session.execute(
                select(func.count()).select_from(Job).where(
                    Job.next_poll_at.is_not(None), Job.credits_actual.is_(None),
                    Job.status.in_((Status.FAILED, Status.CANCELLED)))
            ).scalar_one())

            for status, code, count in session.execute(
                select(Job.status, Job.error_code, func.count())
                .where(Job.status.in_(TERMINAL)).group_by(Job.status, Job.error_code)
            ):
                fam["outcomes"].add_metric([status, code or ""], count)

            for kind, count in session.execute(
                select(CreditAnomaly.kind, func.count()).group_by(CreditAnomaly.kind)
            ):
                fam["anomalies"].add_metric([kind], count)


def collect(rt: Runtime, registry: CollectorRegistry | None = None) -> CollectorRegistry:
    """``registry`` (a new one by default) with a :class:`JobsCollector` for ``rt`` registered."""
    prom = _prometheus()
    registry = registry if registry is not None else prom.CollectorRegistry()
    registry.register(JobsCollector(rt))
    return registry


def exposition(rt: Runtime) -> str:
    """One scrape in the Prometheus text format."""
    scrape: bytes = _prometheus().generate_latest(collect(rt))
    return scrape.decode("utf-8")


def serve(rt: Runtime, port: int, addr: str = "127.0.0.1") -> Any:
    """Serve ``/metrics`` on ``addr:port`` from a daemon thread; returns (server, thread)."""
    prom = _prometheus()
    server = prom.start_http_server(port, addr=addr, registry=collect(rt))
    log.info("metrics_serving addr=%s port=%s", addr, port)
    return server


__all__ = ["JobsCollector", "MetricsUnavailable", "collect", "exposition", "serve"]
