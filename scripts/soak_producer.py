"""The soak's producer: the job mix, and a process that enqueues it at a
fixed rate and reports each commit back (scripts/soak.py)."""
from __future__ import annotations

import itertools
import multiprocessing
import random
import threading
import time
from typing import Any, Callable, Dict, Optional, Set, Tuple

import psycopg2

import awa_pool
from awa_pool import Job


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
