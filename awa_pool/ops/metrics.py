"""Prometheus metrics of one supervisor (prometheus-client), served over
HTTP by `awa-pool start --metrics-port` and `Pool(metrics_port=...)`.

Job counters and histograms are fed by the supervisor's observability
hooks (on_claim, on_outcome, on_event), which run in its loop and so only
touch in-memory metric objects. Gauges of children and leadership are read
from the supervisor when scraped. Queue depth and lag come from SQL, at
most every QUEUE_REFRESH_S seconds, on a short-lived connection opened by
the scrape itself: the supervisor's loop never waits for a scrape.

Labels are queue names, job kinds, outcomes and states: never a database
URL, password or hostname-with-credentials. Every name is documented in
docs/metrics.md.
"""
from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any, Dict, Iterable, List, Optional

import psycopg2
from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..core.db import connect, first_line
from ..core.errors import AwaError
from ..worker.hooks import chain
from ..worker.inflight import Finished
from ..worker.outcomes import RAN
from ..worker.protocol import ClaimedJob
from ..core.sql import QUERIES
from .serving import stop_serving
from .stats import queue_stats
from ..core.version import __version__

log = logging.getLogger(__name__)

QUEUE_REFRESH_S = 5.0          # queue gauges hit the database at most this often
PICKUP_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
RUN_BUCKETS_S = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)

# Outcome names (protocol.Outcome.outcome) grouped into the named counters.
OUTCOME_COUNTERS = {
    "completed": "completed",
    "failed": "failed", "fatal": "failed",
    "retry": "retried",
    "crash": "crashed",
    "timeout": "timed_out",
}
# Attempts whose handler ran to a return or a raise: their wall time is real.
TIMED_OUTCOMES = RAN
LIVE_STATES = ("available", "running", "scheduled", "retryable", "waiting_external")


class Metrics:
    """The metric objects of one supervisor, its hooks and its HTTP server."""

    def __init__(self, supervisor: Any) -> None:
        self.supervisor = supervisor
        self.registry = CollectorRegistry()
        labels = ("queue", "kind")
        self.started = Counter("awa_jobs_started", "Jobs claimed and handed to a child.",
                               labels, registry=self.registry)
        self.counters = {
            "completed": Counter("awa_jobs_completed", "Attempts that completed the job.",
                                 labels, registry=self.registry),
            "failed": Counter("awa_jobs_failed", "Attempts whose handler raised (retried while "
                              "attempts remain, else the job failed).", labels, registry=self.registry),
            "retried": Counter("awa_jobs_retried", "Attempts whose handler raised awa_pool.Retry.",
                               labels, registry=self.registry),
            "crashed": Counter("awa_jobs_crashed", "Attempts whose child process died.",
                               labels, registry=self.registry),
            "timed_out": Counter("awa_jobs_timed_out", "Attempts killed for passing their timeout.",
                                 labels, registry=self.registry),
        }
        self.outcomes = Counter("awa_job_outcomes", "Every attempt outcome, by its name.",
                                ("queue", "kind", "outcome"), registry=self.registry)
        self.pickup = Histogram("awa_job_pickup_latency_seconds",
                                "Claim time minus the time the job became runnable (run_at).",
                                ("queue",), buckets=PICKUP_BUCKETS_S, registry=self.registry)
        self.run_time = Histogram("awa_job_run_seconds", "Wall time of attempts whose handler returned "
                                  "or raised.", labels, buckets=RUN_BUCKETS_S, registry=self.registry)
        self.recycles = Counter("awa_child_recycles", "Children replaced after --max-tasks-per-child "
                                "or --max-memory-per-child.", registry=self.registry)
        self.deaths = Counter("awa_child_deaths", "Children that died or were killed unexpectedly.",
                              registry=self.registry)
        self.db_lost = Counter("awa_db_disconnects", "Times the supervisor lost its database connection.",
                               registry=self.registry)
        self.db_back = Counter("awa_db_reconnects", "Times the supervisor reconnected after a loss.",
                               registry=self.registry)
        self.registry.register(_LiveCollector(self))
        self._children: Dict[tuple, Any] = {}
        self._queue_lock = threading.Lock()
        self._queue_rows: List[Any] = []
        self._queue_at = float("-inf")
        self._queue_error: Optional[str] = None
        self.server: Any = None
        self.thread: Optional[threading.Thread] = None
        self.port: Optional[int] = None

    # -- hooks (called in the supervisor's loop: in-memory work only) ----------
    def _child(self, metric: Any, *labels: str) -> Any:
        # labels() looks the child up under a lock; caching it keeps the hooks cheap
        key = (id(metric),) + labels
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def on_claim(self, queue: str, jobs: List[ClaimedJob]) -> None:
        now = time.time()
        for job in jobs:
            self._child(self.started, queue, job.kind).inc()
            if job.run_at is not None:
                self._child(self.pickup, queue).observe(max(0.0, now - float(job.run_at)))

    def on_outcome(self, finished: Finished) -> None:
        outcome, job = finished.outcome, finished.job
        queue, kind = (job.queue, job.kind) if job is not None else ("unknown", "unknown")
        name = outcome.outcome
        self._child(self.outcomes, queue, kind, name).inc()
        counter = OUTCOME_COUNTERS.get(name)
        if counter is not None:
            self._child(self.counters[counter], queue, kind).inc()
        if name in TIMED_OUTCOMES and outcome.wall_s:
            self._child(self.run_time, queue, kind).observe(outcome.wall_s)

    def on_event(self, name: str, fields: Dict[str, Any]) -> None:
        if name == "recycle":
            self.recycles.inc()
        elif name == "child_died":
            self.deaths.inc()
        elif name == "db_lost":
            self.db_lost.inc()
        elif name == "db_reconnected":
            self.db_back.inc()

    def install_hooks(self) -> None:
        """Set the supervisor's hooks, keeping any that were set before."""
        sup = self.supervisor
        sup.on_claim = chain(sup.on_claim, self.on_claim)
        sup.on_outcome = chain(sup.on_outcome, self.on_outcome)
        sup.on_event = chain(sup.on_event, self.on_event)

    # -- scrape side ------------------------------------------------------------
    def queue_rows(self) -> List[Any]:
        """Queue overview rows, refreshed from SQL at most every QUEUE_REFRESH_S."""
        with self._queue_lock:
            now = time.monotonic()
            if now - self._queue_at >= QUEUE_REFRESH_S:
                self._queue_at = now
                try:
                    conn = connect(self.supervisor.config.dsn, connect_timeout=3)  # one transaction
                    try:
                        with conn.cursor() as cur:
                            cur.execute(QUERIES["metrics_session"])
                        self._queue_rows = queue_stats(conn)
                        self._queue_error = None
                    finally:
                        conn.close()
                except (psycopg2.Error, AwaError) as exc:
                    if self._queue_error is None:
                        log.warning("metrics: cannot read queue depths: %s", first_line(exc))
                    self._queue_error = first_line(exc)
                    self._queue_rows = []
            return list(self._queue_rows)

    # -- HTTP --------------------------------------------------------------------
    def serve(self, port: int, addr: str = "0.0.0.0") -> int:
        """Start the HTTP server in a daemon thread; returns the bound port."""
        try:
            self.server, self.thread = start_http_server(port, addr=addr, registry=self.registry)
        except OSError as exc:
            raise OSError(f"cannot serve metrics on port {port}: {exc.strerror or exc}") from None
        self.port = self.server.server_address[1]
        host = addr if addr not in ("", "0.0.0.0") else socket.gethostname()
        log.info("serving Prometheus metrics on http://%s:%d/metrics", host, self.port)
        return self.port

    def close(self) -> None:
        stop_serving(self.server, self.thread)
        self.server = self.thread = None


class _LiveCollector:
    """Gauges computed at scrape time."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def describe(self) -> Iterable[Any]:
        return []  # computed per scrape; nothing to check at registration

    def collect(self) -> Iterable[Any]:
        sup = self.metrics.supervisor
        children = GaugeMetricFamily("awa_children", "Child processes of this supervisor, by state "
                                     "(busy, idle, other = starting or stopping).", labels=["state"])
        counts = {"busy": 0, "idle": 0, "other": 0}
        for child in _children_of(sup):
            counts["busy" if child.busy else "idle" if child.idle else "other"] += 1
        for state, value in counts.items():
            children.add_metric([state], value)
        yield children
        yield GaugeMetricFamily("awa_children_configured", "The -w setting of this supervisor.",
                                value=sup.config.workers)
        leader = sup.leader
        yield GaugeMetricFamily("awa_leader", "1 while this supervisor holds the leader lock.",
                                value=1 if (leader is not None and leader.is_leader) else 0)
        yield GaugeMetricFamily("awa_database_connected", "1 while the supervisor's main database "
                                "connection is up.", value=1 if sup.session.connected else 0)
        # Round trips: what the load costs the database, per job (claims and
        # flushes against jobs started and completed).
        yield CounterMetricFamily("awa_claims", "Claim statements sent.", value=sup.claimer.claims)
        yield CounterMetricFamily("awa_empty_claims", "Claim statements that found no job.",
                                  value=sup.claimer.empty_claims)
        yield CounterMetricFamily("awa_completion_flushes", "Transactions that wrote job outcomes.",
                                  value=sup.completer.flushes)
        yield CounterMetricFamily("awa_overtakes", "Refills whose more urgent jobs overtook jobs a child "
                                  "held queued.", value=sup.children.overtakes)
        yield CounterMetricFamily("awa_urgent_claims", "Early claims of new priority-1 jobs (awa_urgent) that "
                                  "found one.", value=sup.claimer.rushes)
        yield CounterMetricFamily("awa_loop_stalls", "Loop turns that took over 5 s (each logged with the "
                                  "statement it waited on).", value=sup.watchdog.stalls)
        expired = CounterMetricFamily("awa_jobs_expired", "Jobs cancelled as expired before they started, "
                                      "by this supervisor's leader.", labels=["queue", "kind"])
        for (queue, kind), jobs in sorted(_expired_counts(sup).items()):
            expired.add_metric([queue, kind], jobs)
        yield expired
        info = GaugeMetricFamily("awa_supervisor_info", "Always 1; labels describe this supervisor.",
                                 labels=["supervisor_id", "version", "state"])
        info.add_metric([str(sup.supervisor_id or ""), __version__, str(sup.state)], 1)
        yield info

        rows = self.metrics.queue_rows()
        depth = GaugeMetricFamily("awa_queue_jobs", "Jobs not yet finished, by queue and state "
                                  f"(refreshed at most every {QUEUE_REFRESH_S:g}s).", labels=["queue", "state"])
        lag = GaugeMetricFamily("awa_queue_lag_seconds", "Age of the oldest available job of the queue.",
                                labels=["queue"])
        paused = GaugeMetricFamily("awa_queue_paused", "1 when the queue is paused.", labels=["queue"])
        for row in rows:
            for state in LIVE_STATES:
                depth.add_metric([row.queue, state], getattr(row, state))
            lag.add_metric([row.queue], row.lag_seconds)
            paused.add_metric([row.queue], 1 if row.paused else 0)
        yield depth
        yield lag
        yield paused
        yield GaugeMetricFamily("awa_queue_counts_age_seconds", "Age of the live counts behind awa_queue_jobs "
                                "when they were read: 0 when counted, above 100,000 live jobs the age of "
                                "the leader's census of them.",
                                value=max((row.counts_age_s for row in rows), default=0.0))
        yield GaugeMetricFamily("awa_queue_stats_up", "1 when the last refresh of the queue gauges "
                                "succeeded.", value=0 if self.metrics._queue_error else 1)


def _expired_counts(supervisor: Any) -> Dict[tuple, int]:
    """What the leader's expiry service cancelled while this supervisor led
    (maintenance.ExpireJobs); nothing on a follower that never led."""
    leader = supervisor.leader
    if leader is None:
        return {}
    try:
        service = leader.maintenance.get("expire_jobs")
    except KeyError:
        return {}
    return dict(service.expired)


def _children_of(supervisor: Any) -> List[Any]:
    """The supervisor's children, read from the scrape thread while the loop
    may be changing the table: retry the copy if it changed under us."""
    for _ in range(5):
        try:
            return supervisor.children.all()
        except RuntimeError:
            continue
    return []


def attach(supervisor: Any, port: int, addr: str = "0.0.0.0") -> Metrics:
    """Set the supervisor's hooks and serve its metrics on `port` (0 picks a
    free port; see `.port`). Call `close()` when the supervisor is done."""
    metrics = Metrics(supervisor)
    metrics.install_hooks()
    metrics.serve(port, addr)
    return metrics
