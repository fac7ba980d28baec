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

What the tracing layer adds, in µs: to an enqueue call (a producer span
and one job stamped, against the same Python work without the layer),
per job of an enqueue_many of 1,000 (each job stamped), and to an attempt
(execute.run of a no-op handler, the child's per-job path, against the
undecorated function). Each is the fastest of many short runs: on a
shared machine the fastest run is the least disturbed one. The wall time
per job of a real enqueue_many of 1,000 (one transaction, rolled back)
shows the server's share: stamped jobs share one metadata, sent once per
chunk with the args-only insert. Set-ups alternate;
medians over --repeats. Last, what a Pool's on_outcome hook adds to the
supervisor's loop per attempt.
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


def fastest(work, count: int, repeats: int, clock=time.perf_counter) -> float:
    """µs per item of the fastest of `repeats` runs of work() (count items
    each): on a shared machine the fastest run is the one least disturbed."""
    best = float("inf")
    for _ in range(repeats):
        started = clock()
        work()
        best = min(best, clock() - started)
    return best / count * 1e6


def measure(setup: str, url: str, attempts: int) -> dict:
    if setup == "absent":
        sys.meta_path.insert(0, _RefuseOpenTelemetry())
    import contextlib

    import psycopg2

    import awa_pool
    from awa_pool.worker.execute import run
    from awa_pool.worker.protocol import ClaimedJob

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

    from awa_pool.api.producer import _check_job
    from awa_pool.core.tracing import producer_span

    def checked(conn, jobs):  # what an enqueue does in Python besides its SQL
        return [_check_job(job) for job in jobs]

    traced = producer_span("enqueue")(checked)
    one, thousand = [awa_pool.Job("bench_tracing", {"i": 1})], [awa_pool.Job("bench_tracing", {"i": i})
                                                                  for i in range(1000)]
    conn = psycopg2.connect(url)
    with span:
        awa_pool.enqueue_many(conn, thousand[:1])  # warm up: the import, the tracer, the plans
        traced(None, one)
        enqueue_added = fastest(lambda: traced(None, one), 1, 3000) - fastest(lambda: checked(None, one), 1, 3000)
        many_added = (fastest(lambda: traced(None, thousand), 1000, 30)
                      - fastest(lambda: checked(None, thousand), 1000, 30))
        many_wall = fastest(lambda: awa_pool.enqueue_many(conn, thousand), 1000, 15)  # the server's share too
    conn.rollback()
    conn.close()
    metadata = '{"traceparent": "%s"}' % TRACEPARENT if setup == "sdk" else "{}"
    job = ClaimedJob(id=1, kind="bench_tracing_noop", queue="default", args="{}", priority=2, attempt=1,
                     max_attempts=25, lease=1, timeout_s=None, tags=None, metadata=metadata,
                     created_at=0.0, run_at=0.0, progress=None, callback_result=None, batch_id=None)
    channel = _Channel()
    run(job, channel)
    attempt = fastest(lambda: [run(job, channel) for _ in range(attempts)], attempts, 300)
    bare = fastest(lambda: [run.__wrapped__(job, channel) for _ in range(attempts)], attempts, 300)
    return {"enqueue_added": enqueue_added, "many_added": many_added, "many_wall": many_wall,
            "attempt": attempt, "attempt_added": attempt - bare}


def hook_cost(n: int) -> float:
    """µs per attempt that an on_outcome hook (a no-op one) adds to the
    supervisor's loop: the OutcomeEvent built, the hook called."""
    from awa_pool.worker.hooks import PoolHooks
    from awa_pool.worker.inflight import Finished, InFlight
    from awa_pool.worker.protocol import Outcome

    hooks = PoolHooks()
    hooks.add("outcome", lambda event: None)
    finished = Finished(Outcome(1, 1, "completed", wall_s=0.01, cpu_s=0.01, peak_rss=1 << 25),
                        InFlight(1, 1, "kind", "default", None, 0, 1))
    return fastest(lambda: [hooks._on_outcome(finished) for _ in range(n)], n, 300)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--attempts", type=int, default=300)
    parser.add_argument("--setup", choices=SETUPS, help=argparse.SUPPRESS)  # one measurement, in a child
    args = parser.parse_args()
    if args.setup:
        print(json.dumps(measure(args.setup, args.database_url, args.attempts)))
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
                                      "--attempts", str(args.attempts)],
                                     check=True, capture_output=True, text=True).stdout
                results[setup].append(json.loads(out))
    finally:
        drop_database(server, name)
    print(f"{'setup':8} {'enqueue: +µs':>13} {'enqueue_many: +µs/job':>22} {'(wall µs/job)':>14} "
          f"{'attempt: µs':>12} {'(+µs)':>7}")
    for setup, runs in results.items():
        med = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
        print(f"{setup:8} {med['enqueue_added']:13.2f} {med['many_added']:22.2f} {med['many_wall']:14.2f} "
              f"{med['attempt']:12.2f} {med['attempt_added']:7.2f}")
    cost = statistics.median(hook_cost(args.attempts) for _ in range(args.repeats))
    bare = statistics.median(fastest(lambda: [None for _ in range(args.attempts)], args.attempts, 300)
                             for _ in range(args.repeats))
    cost -= bare
    print(f"an on_outcome hook (a no-op) adds {cost:.2f} µs per attempt to the supervisor's loop")


if __name__ == "__main__":
    main()
