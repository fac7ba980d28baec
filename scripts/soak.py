#!/usr/bin/env python3
"""Sustained mixed load against real supervisors, sampled every few seconds.

A producer enqueues at a fixed rate, paced on real elapsed time (it catches
up after a slow commit instead of drifting), a mix of no-op jobs, short CPU
jobs, jobs that fail once and retry, and jobs scheduled a few seconds out.
Every --sample seconds the script records completion rate, pickup latency
(claim time - the moment the producer's commit returned, as the benchmark's
W4 counts it) p50/p99 of the jobs claimed in that window, queue
depth, the dead tuples and size of every awa table and index, the
producer's longest commit and longest gap between commits (a slow commit
releases its jobs together), and the machine's I/O wait and CPU stolen by
other guests of the hypervisor. It writes a CSV and,
when matplotlib is installed, a PNG plot; --trace-slow-ms also lists every
slow pickup with the clock time of its claim.

    python scripts/soak.py --minutes 10 --capacity-fraction 0.7 \\
        --retention 60s --out docs/soak

First, unless --rate is given, it measures the no-op capacity of the same
supervisors: by default with the producer flooding them with no-op jobs on
the same machine for --capacity-seconds (what the machine sustains when
production and consumption share its cores), with --capacity loaded-mix the
same flood made of the soak's own mix (its CPU jobs and retries cost more
than no-op jobs; --mix noop sends no-op jobs only), or with --capacity drain
by emptying a pre-filled backlog with the producer idle. Exit status 1 when
the soak misses its bars: rate held within 5%, p99 pickup under --max-p99-ms in
every window, dead tuples of the claim-path tables bounded (their highest
reading, taken every 0.5 s, in the second half no higher than --dead-growth
times the larger of the first half's and the leader's vacuum threshold), and total
size flat once history reached its retention age and jobs_hot had its first
vacuum (not judged in a run too short or slow to get there).
"""
from __future__ import annotations

import argparse
import csv
import itertools
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import psycopg2

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import awa_pool  # noqa: E402
from awa_pool import Job  # noqa: E402
from awa_pool.maintenance import VacuumQueueTables  # noqa: E402
from scriptdb import fresh_database  # noqa: E402

APP = '''
import time, awa_pool

@awa_pool.task("soak_noop", queue="soak")
def noop(**_):
    pass

@awa_pool.task("soak_cpu", queue="soak")
def cpu(ms=0.2, **_):
    end = time.process_time() + ms / 1000.0
    while time.process_time() < end:
        pass

@awa_pool.task("soak_flaky", queue="soak", pass_context=True)
def flaky(ctx, **_):
    if ctx.attempt == 1:
        raise awa_pool.Retry(delay=0.5, reason="first attempt fails on purpose")
'''

CLAIM_PATH_TABLES = ("jobs_hot", "queues")
# Their dead tuples form a saw-tooth (the leader vacuums at a threshold), so
# they are read this often and each sample keeps the highest reading since
# the previous one: single readings every few seconds would land anywhere on
# the teeth. (Backends publish their counts about once a second.)
DEAD_READ_EVERY_S = 0.5


def parse_seconds(text: str) -> float:
    from awa_pool.config import parse_duration

    return parse_duration(text, what="duration")


class Supervisors:
    def __init__(self, dsn: str, count: int, workers: int, retention: str, app_dir: Path) -> None:
        self.procs = []
        env = dict(os.environ, PYTHONPATH=f"{app_dir}{os.pathsep}{ROOT}")
        for i in range(count):
            log = open(app_dir / f"supervisor-{i}.log", "wb")
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", "awa_pool", "start", "--app", "soak_app", "-w", str(workers),
                 "--queue", "soak", "--database-url", dsn, "--retention-completed", retention,
                 "--retention-failed", retention, "--log-level", "warning"],
                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def count_done(cur) -> int:
    cur.execute("SELECT count(*) FROM awa.jobs_done")
    return cur.fetchone()[0]


def drain_capacity(dsn: str, jobs: int) -> float:
    """No-op jobs/s of the running supervisors draining a pre-filled backlog,
    with nothing else running."""
    conn = psycopg2.connect(dsn)
    with conn:
        for start in range(0, jobs, 1000):
            awa_pool.enqueue_many(conn, [Job("soak_noop", {"i": i}, queue="soak")
                                         for i in range(start, min(jobs, start + 1000))])
    conn.autocommit = True
    cur = conn.cursor()
    before = count_done(cur)
    started = None
    while True:
        done = count_done(cur) - before
        if started is None and done > 0:
            started, first = time.monotonic(), done
        if done >= jobs:
            break
        time.sleep(0.02)
    elapsed = time.monotonic() - started
    conn.close()
    return (jobs - first) / elapsed


def loaded_capacity(dsn: str, seconds: float, make_job: "MakeJob") -> float:
    """Jobs/s the supervisors finish while the producer floods them with
    make_job's jobs on the same machine: what the machine can sustain when
    production and consumption share its cores. Completions are counted over
    the second half of the window (the first fills the backlog); the backlog
    is drained before returning."""
    stats = CommitStats()
    flood = Producer(dsn, None, stats, make_job)
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    cur = conn.cursor()
    try:
        time.sleep(seconds / 2)
        before, started = count_done(cur), time.monotonic()
        time.sleep(seconds / 2)
        capacity = (count_done(cur) - before) / (time.monotonic() - started)
    finally:
        flood.stop(30)
    if stats.error:
        raise SystemExit(f"soak: the capacity run's producer failed: {stats.error}")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        cur.execute(SAMPLE_SQL["depth"])
        available, running, deferred = cur.fetchone()
        if available + running + deferred == 0:
            break
        time.sleep(0.2)
    else:
        raise SystemExit("soak: the capacity run's backlog did not drain within 300 s")
    conn.close()
    return capacity


def job_mix(rng: random.Random, tx: int) -> Job:
    roll = rng.random()
    if roll < 0.85:
        return Job("soak_noop", {"tx": tx}, queue="soak")
    if roll < 0.95:
        return Job("soak_cpu", {"ms": 0.2, "tx": tx}, queue="soak")
    if roll < 0.98:
        return Job("soak_flaky", {"tx": tx}, queue="soak")
    return Job("soak_noop", {"scheduled": True, "tx": tx}, queue="soak", delay=5)


def noop_only(rng: random.Random, tx: int) -> Job:
    return Job("soak_noop", {"tx": tx}, queue="soak")


class CommitStats:
    """The producer's commits. Pickup is counted from the moment a job's
    transaction became visible (its COMMIT returned), as the benchmark's W4
    counts latency from the return of the enqueue call: a job's run_at is its
    transaction's start, so measuring from run_at would also count the
    producer's own statement and commit. Every job carries its transaction's
    number ("tx"); the commit times are kept here, by number, for
    COMMIT_TIMES_KEPT_S (a job picked up later than that counts as not yet
    known).

    Also, since the last take: the longest commit and the longest time
    between two commits. Jobs become visible only when their commit's WAL
    flush ends, so a slow flush or a long gap releases them together: a
    burst the pool can only drain at its capacity, whose last jobs wait
    about burst / capacity."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sent = 0
        self.commit_max_s = 0.0
        self.gap_max_s = 0.0
        self.last_commit: Optional[float] = None
        self.committed: Dict[int, float] = {}  # tx -> wall-clock commit time, in tx order
        self.error: Optional[str] = None

    def record(self, jobs: int, tx: int, commit_started: float, committed_at: float, wall: float) -> None:
        """A commit of `jobs` jobs, as the producer timed it: monotonic start
        and return of its COMMIT, and the wall-clock time of the return."""
        with self.lock:
            self.committed[tx] = wall
            while self.committed:
                oldest = next(iter(self.committed))
                if self.committed[oldest] >= wall - COMMIT_TIMES_KEPT_S:
                    break
                del self.committed[oldest]
            self.sent += jobs
            self.commit_max_s = max(self.commit_max_s, committed_at - commit_started)
            if self.last_commit is not None:
                self.gap_max_s = max(self.gap_max_s, committed_at - self.last_commit)
            self.last_commit = committed_at

    def take(self) -> Tuple[float, float]:
        with self.lock:
            taken = self.commit_max_s, self.gap_max_s
            self.commit_max_s = self.gap_max_s = 0.0
            return taken

    def commit_times(self, txs: Set[Optional[int]]) -> Dict[Optional[int], float]:
        """Commit times of these transactions, those still known, in one
        lock hold (the sampler looks up a few thousand jobs at a time while
        the producer records its commits)."""
        with self.lock:
            return {tx: self.committed[tx] for tx in txs if tx in self.committed}


MakeJob = Callable[[random.Random, int], Job]
TX_BLOCK = 10 ** 9                  # each producer numbers its transactions from its own block
PRODUCER_BLOCKS = itertools.count(1)
COMMIT_TIMES_KEPT_S = 600.0


class Producer:
    """The producer, in a process of its own: sharing an interpreter with the
    sampler, whose 5-second sample holds the GIL for 50-120 ms at 24,000
    jobs/s, it committed late and released its jobs in bursts, a pattern of
    the measuring script rather than of the pool. Each commit comes back
    over a pipe to a thread here that records it in `stats`; a failure in
    the process ends up in stats.error (the soak stops on it)."""

    def __init__(self, dsn: str, rate: Optional[float], stats: CommitStats, make_job: MakeJob,
                 durable: bool = True) -> None:
        context = multiprocessing.get_context("fork")
        self.stopping = context.Event()
        receive, send = context.Pipe(duplex=False)
        first_tx = next(PRODUCER_BLOCKS) * TX_BLOCK
        # forked before this process opens its own connections: none to inherit
        self.process = context.Process(target=_produce_in_process, daemon=True, args=(
            dsn, rate, self.stopping, send, make_job, first_tx, durable))
        self.process.start()
        send.close()
        self.reader = threading.Thread(target=self._receive, args=(receive, stats), daemon=True)
        self.reader.start()

    def _receive(self, receive: Any, stats: CommitStats) -> None:
        while True:
            try:
                message = receive.recv()
            except EOFError:
                break
            if message[0] == "error":
                stats.error = message[1]
                break
            stats.record(*message[1:])
        receive.close()
        self.process.join(5)
        if stats.error is None and self.process.exitcode not in (0, None):
            stats.error = f"the producer process exited with status {self.process.exitcode}"

    def stop(self, timeout: float = 10.0) -> None:
        self.stopping.set()
        self.process.join(timeout)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout)
        self.reader.join(timeout)


def _produce_in_process(dsn: str, rate: Optional[float], stopping: Any, send: Any, make_job: MakeJob,
                        first_tx: int, durable: bool) -> None:
    """The producer process's body: a failure is sent up instead of a traceback."""
    try:
        produce(dsn, rate, stopping, lambda *commit: send.send(("commit",) + commit), make_job,
                first_tx, durable=durable)
    except Exception as exc:  # noqa: BLE001 - reported by the main process
        lines = str(exc).strip().splitlines()
        send.send(("error", f"{type(exc).__name__}: {lines[0] if lines else ''}"))
    finally:
        send.close()


def produce(dsn: str, rate: Optional[float], stopping: Any, on_commit: Callable[..., None],
            make_job: MakeJob, first_tx: int, tick: float = 0.01, durable: bool = True) -> None:
    """Enqueue the mix at `rate` jobs/s, paced on real elapsed time: every
    `tick` seconds one transaction holds the jobs that fell due since the
    last one (a producer that commits per job spends the CPU the pool needs
    on commits and wake-ups). rate None: as fast as it can, 1,000 per
    transaction. Every job carries its transaction's number ("tx"), and
    on_commit(jobs, tx, commit started, commit returned, wall-clock return)
    follows each commit. durable False: commits do not wait for their WAL
    flush (a diagnostic: what pickup looks like when jobs do not arrive in
    flush-sized bursts)."""
    conn = psycopg2.connect(dsn)
    if not durable:
        with conn, conn.cursor() as cur:
            cur.execute("SET synchronous_commit = off")
    started = time.monotonic()
    next_tick = started
    sent = 0
    rng = random.Random(7)
    tx = first_tx
    while not stopping.is_set():
        if rate is None:
            due = sent + 1000
        else:
            next_tick += tick
            time.sleep(max(0.0, next_tick - time.monotonic()))
            due = int(rate * (time.monotonic() - started))
        tx += 1
        batch = [make_job(rng, tx) for _ in range(min(due - sent, 5000))]
        if batch:
            with conn:
                awa_pool.enqueue_many(conn, batch)
                commit_started = time.monotonic()
            committed_at = time.monotonic()
            sent += len(batch)
            on_commit(len(batch), tx, commit_started, committed_at, time.time())
    conn.close()


SAMPLE_SQL = {
    # Pickup of ready jobs (first attempts); scheduled jobs are reported apart
    # because their lateness includes the leader's promotion interval.
    "window": """
        -- one row per job: (producer transaction, from run_at, scheduled, claimed at)
        -- date_part, not extract: float8 directly, a third cheaper than numeric
        SELECT (j.args->>'tx')::bigint, date_part('epoch', j.attempted_at - j.run_at),
               j.args ? 'scheduled', date_part('epoch', j.attempted_at)
          FROM awa.jobs_done j
         -- queue and state first: an index range scan, not a scan of all history
         WHERE j.queue = 'soak' AND j.state = 'completed' AND j.attempt = 1
           AND j.finalized_at > to_timestamp(%(lo)s) AND j.finalized_at <= to_timestamp(%(hi)s)""",
    "depth": """
        SELECT (SELECT count(*) FROM awa.jobs_hot WHERE state = 'available'),
               (SELECT count(*) FROM awa.jobs_hot WHERE state = 'running'),
               (SELECT count(*) FROM awa.jobs_deferred)""",
    "tables": """
        SELECT c.relname, coalesce(s.n_dead_tup, 0), coalesce(s.n_live_tup, 0),
               pg_total_relation_size(c.oid)
          FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
          LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
         WHERE n.nspname = 'awa' AND c.relkind IN ('r', 'p')""",
    # The supervisors' own counters (published with each heartbeat): how
    # many round trips the load costs.
    "round_trips": """
        SELECT coalesce(sum((stats->'counters'->>'claims')::bigint), 0)::bigint,
               coalesce(sum((stats->'counters'->>'empty_claims')::bigint), 0)::bigint,
               coalesce(sum((stats->'counters'->>'claimed_jobs')::bigint), 0)::bigint,
               coalesce(sum((stats->'counters'->>'completion_flushes')::bigint), 0)::bigint
          FROM awa.supervisors WHERE stopped_at IS NULL""",
    "claim_path_dead": """
        SELECT relname, n_dead_tup FROM pg_stat_user_tables
         WHERE schemaname = 'awa' AND relname = ANY(%s)""",
    "indexes": """
        SELECT c.relname, pg_relation_size(c.oid)
          FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = 'awa' AND c.relkind = 'i'""",
}


# Jobs are read in 0.1-second slices of finalized_at, each slice once it is
# PICKUP_LAG_S old (a completion flush in flight would be missed by a
# fresher one). The sampler's reads are CPU the pool does not get: one
# query per 5-second sample was a burst of 0.1-0.17 s at 10,000 jobs/s,
# and one per second still 50-60 ms of a backend's CPU at 8,000 jobs/s,
# which lined up with slow-pickup clusters on two cores. Small slices
# spread the same work thinly.
PICKUP_SLICE_S = 0.1
PICKUP_LAG_S = 0.5


class Pickups:
    """First-attempt pickups of the window so far, read a slice at a time."""

    def __init__(self, cur, since: float, commits: CommitStats, slow_s: Optional[float] = None) -> None:
        self.cur = cur
        self.commits = commits
        self.read_up_to = since
        self.rows: List[tuple] = []
        self.slow_s = slow_s
        self.slow: List[tuple] = []  # (claimed at, pickup s) above slow_s, for --trace-slow-ms

    def read_if_due(self, force: bool = False) -> None:
        upper = time.time() - PICKUP_LAG_S
        while upper - self.read_up_to >= PICKUP_SLICE_S or (force and upper > self.read_up_to):
            hi = min(upper, self.read_up_to + PICKUP_SLICE_S)
            self.cur.execute(SAMPLE_SQL["window"], {"lo": self.read_up_to, "hi": hi})
            # (from commit, from run_at, scheduled, claimed at); from commit is
            # None for scheduled jobs, and if the commit time is not known
            jobs = self.cur.fetchall()
            commit_times = self.commits.commit_times({job[0] for job in jobs})
            for tx, from_run_at, scheduled, claimed_at in jobs:
                committed = None if scheduled else commit_times.get(tx)
                self.rows.append((None if committed is None else claimed_at - committed,
                                  from_run_at, scheduled, claimed_at))
            self.read_up_to = hi

    def take(self) -> tuple:
        """(jobs, p50 and p99 from commit, p99 from run_at, scheduled p99)
        of everything read since the last take, in seconds (None if none)."""
        self.read_if_due(force=True)
        rows, self.rows = self.rows, []
        ready = [row for row in rows if not row[2]]
        if self.slow_s is not None:
            self.slow += [(row[3], row[0]) for row in ready if row[0] is not None and row[0] > self.slow_s]
        from_commit = sorted(row[0] for row in ready if row[0] is not None)
        from_run_at = sorted(row[1] for row in ready)
        scheduled = sorted(row[1] for row in rows if row[2])
        return (len(rows), percentile(from_commit, 0.5), percentile(from_commit, 0.99),
                percentile(from_run_at, 0.99), percentile(scheduled, 0.99))


STOLEN_PCT = 3.0  # a window that lost this much CPU to other guests is called out in the p99 bar


class CpuShares:
    """Shares of the machine's CPU time since the last take (Linux
    /proc/stat; None elsewhere): waiting for disk I/O, and stolen by the
    hypervisor for other guests (a VM that slows down under a noisy
    neighbour shows it here, not in the pool's figures)."""

    def __init__(self) -> None:
        self.last = self._read()

    @staticmethod
    def _read() -> Optional[List[int]]:
        try:
            with open("/proc/stat") as f:
                return [int(v) for v in f.readline().split()[1:9]]
        except (OSError, ValueError):
            return None

    def take(self) -> Tuple[Optional[float], Optional[float]]:
        """(iowait %, steal %)"""
        now, last = self._read(), self.last
        self.last = now
        if now is None or last is None or sum(now) == sum(last):
            return None, None
        total = sum(now) - sum(last)
        return (round(100.0 * (now[4] - last[4]) / total, 1),
                round(100.0 * (now[7] - last[7]) / total, 1))


def percentile(ordered: List[float], q: float) -> Optional[float]:
    """Linear interpolation between the closest ranks (PostgreSQL's percentile_cont)."""
    if not ordered:
        return None
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL",
                                                                  "postgresql://postgres@127.0.0.1:5432/postgres"),
                        help="server to use; the script creates (dropping it first) --database-name on it")
    parser.add_argument("--database-name", default="awa_soak")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=float, help="jobs/s (default: capacity x --capacity-fraction)")
    parser.add_argument("--capacity-fraction", type=float, default=0.7)
    parser.add_argument("--capacity", choices=("loaded", "loaded-mix", "drain"), default="loaded",
                        help="how the capacity is measured: 'loaded' (default) with the producer "
                             "flooding the same machine with no-op jobs for --capacity-seconds, "
                             "'loaded-mix' the same with the soak's own mix, 'drain' emptying "
                             "--calibrate-jobs pre-filled no-op jobs with the producer idle")
    parser.add_argument("--mix", choices=("standard", "noop"), default="standard",
                        help="what the producer sends: 'standard' (default) the mix above, "
                             "'noop' no-op jobs only")
    parser.add_argument("--capacity-seconds", type=float, default=30.0)
    parser.add_argument("--producer-commit", choices=("durable", "async"), default="durable",
                        help="'async' commits the soak's jobs without waiting for their WAL flush "
                             "(synchronous_commit off): a diagnostic that shows pickup without the "
                             "bursts a slow flush releases (the capacity run stays durable)")
    parser.add_argument("--calibrate-jobs", type=int, default=20000)
    parser.add_argument("--supervisors", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--retention", default="60s", help="completed and failed retention")
    parser.add_argument("--sample", type=float, default=5.0, help="seconds between samples")
    parser.add_argument("--max-p99-ms", type=float, default=50.0)
    parser.add_argument("--dead-growth", type=float, default=1.5)
    parser.add_argument("--out", default="soak", help="output prefix for .csv and .png")
    parser.add_argument("--trace-slow-ms", type=float,
                        help="also write OUT-slow.csv: every first-attempt pickup slower than this, "
                             "with the wall-clock time of its claim (to line stalls up with server logs)")
    args = parser.parse_args()

    dsn = fresh_database(args.database_url, args.database_name)

    app_dir = Path(tempfile.mkdtemp(prefix="awa-soak-"))
    (app_dir / "soak_app.py").write_text(APP)
    sys.path.insert(0, str(app_dir))
    import soak_app  # noqa: F401  (registers the kinds so producers apply their defaults)

    # SIGTERM (and SIGINT, which a background job ignores) ends the soak
    # through the finally below, so the supervisors are stopped too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("soak: terminated"))
    supervisors = Supervisors(dsn, args.supervisors, args.workers, args.retention, app_dir)
    producer: Optional[Producer] = None
    stats = CommitStats()
    rows = []
    failed_bars = []
    make_job = job_mix if args.mix == "standard" else noop_only
    try:
        rate = args.rate
        if rate is None:
            if args.capacity == "drain":
                capacity = drain_capacity(dsn, args.calibrate_jobs)
            else:
                capacity = loaded_capacity(dsn, args.capacity_seconds,
                                           make_job if args.capacity == "loaded-mix" else noop_only)
            rate = capacity * args.capacity_fraction
            what = "mixed-load" if args.capacity == "loaded-mix" and args.mix == "standard" else "no-op"
            print(f"{what} capacity ({args.capacity}) {capacity:,.0f} jobs/s; soaking at {rate:,.0f} jobs/s "
                  f"({args.capacity_fraction:.0%})", flush=True)
        started = time.monotonic()
        producer = Producer(dsn, rate, stats, make_job, durable=args.producer_commit == "durable")
        sample_conn = psycopg2.connect(dsn)
        sample_conn.autocommit = True
        cur = sample_conn.cursor()
        end = started + args.minutes * 60
        next_sample = started + args.sample
        header_printed = False
        previous_trips = None
        cpu_shares = CpuShares()
        pickups = Pickups(cur, time.time() - PICKUP_LAG_S, stats,
                          None if args.trace_slow_ms is None else args.trace_slow_ms / 1000)
        while time.monotonic() < end:
            if stats.error:
                raise SystemExit(f"soak: the producer failed: {stats.error}")
            dead_peaks = {table: 0 for table in CLAIM_PATH_TABLES}
            next_dead_read = time.monotonic()
            while True:
                if time.monotonic() >= next_dead_read:
                    next_dead_read += DEAD_READ_EVERY_S
                    cur.execute(SAMPLE_SQL["claim_path_dead"], (list(CLAIM_PATH_TABLES),))
                    for name, dead in cur.fetchall():
                        dead_peaks[name] = max(dead_peaks[name], dead)
                pickups.read_if_due()
                if time.monotonic() >= next_sample:
                    break
                time.sleep(max(0.0, min(PICKUP_SLICE_S, next_sample - time.monotonic())))
            now = time.monotonic()
            next_sample += args.sample
            completed_window, p50, p99, p99_from_run_at, scheduled_p99 = pickups.take()
            cur.execute(SAMPLE_SQL["depth"])
            available, running, deferred = cur.fetchone()
            cur.execute(SAMPLE_SQL["tables"])
            tables = {name: (dead, live, size) for name, dead, live, size in cur.fetchall()}
            cur.execute(SAMPLE_SQL["indexes"])
            indexes = dict(cur.fetchall())
            cur.execute(SAMPLE_SQL["round_trips"])
            trips = cur.fetchone()
            claims, empty, claimed, flushes = (
                [now_ - before for now_, before in zip(trips, previous_trips)] if previous_trips else [0, 0, 0, 0])
            previous_trips = trips
            commit_max, gap_max = stats.take()
            row = {
                "t": round(now - started, 1), "sent": stats.sent,
                "completed_per_s": round(completed_window / args.sample, 1),
                "pickup_p50_ms": round((p50 or 0) * 1000, 2), "pickup_p99_ms": round((p99 or 0) * 1000, 2),
                "pickup_from_run_at_p99_ms": round((p99_from_run_at or 0) * 1000, 2),
                "scheduled_late_p99_ms": round((scheduled_p99 or 0) * 1000, 2),
                "available": available, "running": running, "deferred": deferred,
                "total_bytes": sum(size for _, _, size in tables.values()),
                "claims_per_s": round(claims / args.sample, 1),
                "empty_claims_per_s": round(empty / args.sample, 1),
                "jobs_per_claim": round(claimed / claims, 1) if claims else 0,
                "completion_flushes_per_s": round(flushes / args.sample, 1),
                # A slow producer commit (its WAL flush), or a long gap between
                # two commits, holds jobs back and then releases them together:
                # a burst the pool drains at its capacity.
                "producer_commit_max_ms": round(commit_max * 1000, 1),
                "producer_gap_max_ms": round(gap_max * 1000, 1),
            }
            row["iowait_pct"], row["steal_pct"] = cpu_shares.take()
            for name, (dead, live, size) in sorted(tables.items()):
                row[f"{name}.dead"] = dead
                row[f"{name}.live"] = live
                row[f"{name}.bytes"] = size
            for name, size in sorted(indexes.items()):
                row[f"idx.{name}.bytes"] = size
            for name, peak in dead_peaks.items():
                row[f"{name}.dead_peak"] = peak
            rows.append(row)
            if not header_printed:
                print("     t  rate/s  p50ms  p99ms  avail  hot.dead^  total MB  claims/s  jobs/claim  commit^ms  gap^ms  iowait%  steal%",
                      flush=True)
                header_printed = True
            print(f"{row['t']:6.0f} {row['completed_per_s']:7.0f} {row['pickup_p50_ms']:6.1f} "
                  f"{row['pickup_p99_ms']:6.1f} {available:6d} {row['jobs_hot.dead_peak']:9d} "
                  f"{row['total_bytes'] / 1e6:9.1f} {row['claims_per_s']:9.0f} {row['jobs_per_claim']:11.1f} "
                  f"{row['producer_commit_max_ms']:10.1f} {row['producer_gap_max_ms']:7.1f} "
                  f"{'-' if row['iowait_pct'] is None else row['iowait_pct']:>8} "
                  f"{'-' if row['steal_pct'] is None else row['steal_pct']:>7}",
                  flush=True)
        producer.stop()
        sample_conn.close()
    finally:
        if producer is not None:
            producer.stop()
        supervisors.stop()

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    columns = sorted({key for row in rows for key in row}, key=lambda k: (k not in rows[0], k))
    with open(out.with_suffix(".csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {out.with_suffix('.csv')}")
    if args.trace_slow_ms is not None:
        slow_path = out.with_name(out.name + "-slow.csv")
        with open(slow_path, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["claimed_at_utc", "pickup_ms"])
            for claimed_at, pickup in sorted(pickups.slow):
                stamp = datetime.fromtimestamp(claimed_at, timezone.utc).strftime("%H:%M:%S.%f")[:12]
                writer.writerow([stamp, round(pickup * 1000, 1)])
        print(f"wrote {slow_path} ({len(pickups.slow)} pickups over {args.trace_slow_ms:g} ms)")

    # -- the bars -------------------------------------------------------------------
    warm = [r for r in rows if r["t"] > 2 * args.sample]
    achieved = sum(r["completed_per_s"] for r in warm) / max(1, len(warm))
    if achieved < 0.95 * rate:
        failed_bars.append(f"rate: {achieved:,.0f} jobs/s finished on average, below 95% of {rate:,.0f}")
    worst = max((r["pickup_p99_ms"] for r in warm), default=0.0)
    over = [r for r in warm if r["pickup_p99_ms"] >= args.max_p99_ms]
    if over:
        stolen = sum(1 for r in over if (r["steal_pct"] or 0) >= STOLEN_PCT)
        failed_bars.append(f"pickup p99 reached {worst:.1f} ms (bar {args.max_p99_ms:g} ms) in {len(over)} "
                           f"of {len(warm)} windows, {stolen} of them with {STOLEN_PCT:g} % or more of the "
                           f"CPU stolen by other guests")
    half = len(warm) // 2
    for table in CLAIM_PATH_TABLES:
        first = max((r[f"{table}.dead_peak"] for r in warm[:half]), default=0)
        second = max((r[f"{table}.dead_peak"] for r in warm[half:]), default=0)
        # Below the leader's vacuum threshold they are bounded by design (a
        # slow load may not reach it within half a run).
        if second > args.dead_growth * max(first, VacuumQueueTables().dead_threshold):
            failed_bars.append(f"{table} dead tuples grew: peak {first} then {second}")
    retention_s = parse_seconds(args.retention)
    # Size is steady once history reached its age limit and jobs_hot went
    # through one vacuum (its dead tuples, and so its pages, grow until the
    # leader's first vacuum at its threshold: a short, slow run never gets there).
    first_vacuum = next((i for i in range(1, len(rows))
                         if rows[i]["jobs_hot.dead_peak"] < rows[i - 1]["jobs_hot.dead_peak"]), None)
    settled = [] if first_vacuum is None else [
        r for r in rows[first_vacuum:] if r["t"] > max(retention_s, args.sample) * 2]
    if len(settled) < 4:
        print("size: not judged (fewer than 4 samples after both the retention age and the "
              "first vacuum of jobs_hot)")
    else:
        quarter = max(1, len(settled) // 4)
        early = max(r["total_bytes"] for r in settled[:quarter])
        late = max(r["total_bytes"] for r in settled[-quarter:])
        if late > early * 1.25:
            failed_bars.append(f"total size kept growing after retention: {early / 1e6:.1f} MB "
                               f"-> {late / 1e6:.1f} MB")
    print(f"summary: target {rate:,.0f} jobs/s, achieved {achieved:,.0f} jobs/s, worst pickup p99 "
          f"{worst:.1f} ms, samples {len(rows)}")

    try:
        plot(rows, out.with_suffix(".png"), rate, retention_s, args.max_p99_ms)
        print(f"wrote {out.with_suffix('.png')}")
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib)")

    for bar in failed_bars:
        print(f"FAILED: {bar}")
    return 1 if failed_bars else 0


def plot(rows, path: Path, rate: float, retention_s: float, p99_bar_ms: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [r["t"] for r in rows]
    fig, axes = plt.subplots(4, 1, figsize=(10, 12), sharex=True)
    axes[0].plot(t, [r["completed_per_s"] for r in rows], label="completed jobs/s")
    axes[0].axhline(rate, color="grey", linestyle="--", label="target rate")
    axes[0].set_ylabel("jobs/s")
    axes[0].legend(loc="lower right")
    axes[1].plot(t, [r["pickup_p50_ms"] for r in rows], label="pickup p50")
    axes[1].plot(t, [r["pickup_p99_ms"] for r in rows], label="pickup p99")
    axes[1].plot(t, [r["pickup_from_run_at_p99_ms"] for r in rows], linestyle=":",
                 label="p99 from run_at (incl. the producer's transaction)")
    axes[1].axhline(p99_bar_ms, color="grey", linestyle="--", label="p99 bar")
    # log scale: a start-up window in seconds must not flatten milliseconds
    axes[1].set_yscale("log")
    axes[1].set_ylabel("ms")
    axes[1].legend(loc="upper right")
    for table in CLAIM_PATH_TABLES:
        axes[2].plot(t, [r[f"{table}.dead_peak"] for r in rows], label=f"{table} dead tuples (peak)")
    axes[2].plot(t, [r.get("jobs_deferred.dead", 0) for r in rows], label="jobs_deferred dead tuples")
    axes[2].set_ylabel("dead tuples")
    axes[2].legend(loc="upper right")
    axes[3].plot(t, [r["total_bytes"] / 1e6 for r in rows], label="all awa tables + indexes")
    axes[3].plot(t, [sum(v for k, v in r.items() if k.startswith("jobs_done_") and k.endswith(".bytes")) / 1e6
                     for r in rows], label="terminal history (ring)")
    axes[3].axvline(retention_s, color="grey", linestyle=":", label="retention age")
    axes[3].set_ylabel("MB")
    axes[3].set_xlabel("seconds")
    axes[3].legend(loc="upper left")
    fig.suptitle("awa_pool soak")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


if __name__ == "__main__":
    sys.exit(main())
