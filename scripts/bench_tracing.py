#!/usr/bin/env python3
"""What awa_pool's optional OpenTelemetry support costs per enqueue and
per attempt, in four set-ups (each in its own process):

  absent   opentelemetry cannot be imported (a finder refuses it)
  api      opentelemetry-api installed, no SDK, no span active
  sdk-off  the SDK configured, but enqueued outside any span and run
           without a trace context (what an untraced job costs)
  sdk      the SDK with a BatchSpanProcessor (spans dropped by the
           exporter), enqueues inside a request span, jobs carrying a
           traceparent: a producer span per call, a consumer span per attempt

    python scripts/bench_tracing.py [--database-url URL] [--repeats 3]

Enqueues: N single enqueues, then enqueue_many of 1,000 jobs, in one
transaction each, rolled back. Attempts: execute.run of a no-op handler
(no database), the child's per-job path. Set-ups alternate; medians. Last,
what a Pool's on_outcome hook adds to the supervisor's loop per attempt.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # run from a checkout without installing

SETUPS = ("absent", "api", "sdk-off", "sdk")
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


class _RefuseOpenTelemetry:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "opentelemetry":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


class _Channel:
    def progress(self, *args):
        pass

    def request(self, *args):
        raise RuntimeError("not in this benchmark")

    def cancel_requested(self, job_id):
        return False


def measure(setup: str, url: str, singles: int, attempts: int) -> dict:
    if setup == "absent":
        sys.meta_path.insert(0, _RefuseOpenTelemetry())
    import contextlib

    import psycopg2

    import awa_pool
    from awa_pool.execute import run
    from awa_pool.protocol import ClaimedJob

    span = contextlib.nullcontext()
    if setup.startswith("sdk"):
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

        class Drop(SpanExporter):
            def export(self, spans):
                return SpanExportResult.SUCCESS

        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(Drop()))
        trace.set_tracer_provider(provider)
        if setup == "sdk":
            span = trace.get_tracer("bench").start_as_current_span("request")

    @awa_pool.task("bench_tracing_noop")
    def noop() -> None:
        return None

    conn = psycopg2.connect(url)
    singles_jobs = [awa_pool.Job("bench_tracing", {"i": i}) for i in range(singles)]
    many_jobs = [awa_pool.Job("bench_tracing", {"i": i}) for i in range(1000)]
    with span:
        awa_pool.enqueue(conn, singles_jobs[0])  # warm up: the import, the tracer, the plans
        started = time.perf_counter()
        for job in singles_jobs:
            awa_pool.enqueue(conn, job)
        enqueue_us = (time.perf_counter() - started) / singles * 1e6
        started = time.perf_counter()
        for _ in range(5):
            awa_pool.enqueue_many(conn, many_jobs)
        many_us = (time.perf_counter() - started) / 5000 * 1e6
    conn.rollback()
    conn.close()
    metadata = '{"traceparent": "%s"}' % TRACEPARENT if setup == "sdk" else "{}"
    job = ClaimedJob(id=1, kind="bench_tracing_noop", queue="default", args="{}", priority=2, attempt=1,
                     max_attempts=25, lease=1, timeout_s=None, tags=None, metadata=metadata,
                     created_at=0.0, run_at=0.0, progress=None, callback_result=None, batch_id=None)
    channel = _Channel()
    run(job, channel)
    started = time.perf_counter()
    for _ in range(attempts):
        run(job, channel)
    attempt_us = (time.perf_counter() - started) / attempts * 1e6
    return {"enqueue_us": enqueue_us, "many_us_per_job": many_us, "attempt_us": attempt_us}


def hook_cost(n: int) -> float:
    """µs per attempt that an on_outcome hook (a no-op one) adds to the
    supervisor's loop: the OutcomeEvent built, the hook called."""
    from awa_pool.hooks import PoolHooks
    from awa_pool.inflight import Finished, InFlight
    from awa_pool.protocol import Outcome

    hooks = PoolHooks()
    hooks.add("outcome", lambda event: None)
    finished = Finished(Outcome(1, 1, "completed", wall_s=0.01, cpu_s=0.01, peak_rss=1 << 25),
                        InFlight(1, 1, "kind", "default", None, 0, 1))
    started = time.perf_counter()
    for _ in range(n):
        hooks._on_outcome(finished)
    return (time.perf_counter() - started) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--singles", type=int, default=2000)
    parser.add_argument("--attempts", type=int, default=20000)
    parser.add_argument("--setup", choices=SETUPS, help=argparse.SUPPRESS)  # one measurement, in a child
    args = parser.parse_args()
    if args.setup:
        print(json.dumps(measure(args.setup, args.database_url, args.singles, args.attempts)))
        return
    from scriptdb import drop_database, fresh_database

    server = args.database_url or "postgresql://postgres@127.0.0.1:5432/postgres"
    name = f"awa_bench_tracing_{os.getpid()}"
    url = fresh_database(server, name)
    results = {setup: [] for setup in SETUPS}
    try:
        for _ in range(args.repeats):
            for setup in SETUPS:
                out = subprocess.run([sys.executable, __file__, "--setup", setup, "--database-url", url,
                                      "--singles", str(args.singles), "--attempts", str(args.attempts)],
                                     check=True, capture_output=True, text=True).stdout
                results[setup].append(json.loads(out))
    finally:
        drop_database(server, name)
    print(f"{'setup':8} {'enqueue (µs)':>13} {'enqueue_many (µs/job)':>22} {'attempt (µs)':>13}")
    for setup, runs in results.items():
        med = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
        print(f"{setup:8} {med['enqueue_us']:13.1f} {med['many_us_per_job']:22.2f} {med['attempt_us']:13.2f}")
    cost = statistics.median(hook_cost(args.attempts) for _ in range(args.repeats))
    print(f"an on_outcome hook (a no-op) adds {cost:.2f} µs per attempt to the supervisor's loop")


if __name__ == "__main__":
    main()
