"""The chaos run's load (scripts/chaos.py): the job kinds, their handlers
(this module is the supervisors' `--app`), the producer that enqueues a
steady mix of them, and the helper that plays the external system for
callback jobs.

Each handler appends one line per start and end of an execution to a file of
its own process (O_APPEND, no database traffic), so duplicates can be counted
without trusting the database (chaos_checks.ExecLog reads those files)."""
from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter
from typing import Any, Dict, Iterable, List, Optional, Tuple

import psycopg2
import psycopg2.extensions

import awa_pool
from chaos_fleet import close_quietly, connect

APP_MODULE = "chaos_load"
LOG_DIR_ENV = "AWA_CHAOS_LOG_DIR"
FAST_QUEUE = "chaos"
SLOW_QUEUE = "chaos_long"
QUEUES = (FAST_QUEUE, SLOW_QUEUE)
CALLBACK_TIMEOUT_S = 60

# -- the app: handlers run by the supervisors -----------------------------------------

_log_fd: Optional[Tuple[int, int]] = None


def _exec_log(event: str, ctx: Any, note: str = "-") -> None:
    """Append `event job lease attempt pid ppid time kind note` to this
    process's execution log (one write: atomic with O_APPEND)."""
    global _log_fd
    directory = os.environ.get(LOG_DIR_ENV)
    if not directory:
        return
    pid = os.getpid()
    if _log_fd is None or _log_fd[0] != pid:
        _log_fd = (pid, os.open(os.path.join(directory, f"exec-{pid}.log"),
                                os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644))
    os.write(_log_fd[1], (f"{event} {ctx.id} {ctx.lease} {ctx.attempt} {pid} {os.getppid()} "
                          f"{time.time():.6f} {ctx.kind} {note}\n").encode())


@awa_pool.task("chaos_noop", queue=FAST_QUEUE, pass_context=True)
def chaos_noop(ctx: Any, token: str) -> dict:
    _exec_log("start", ctx)
    _exec_log("end", ctx, "ok")
    return {"lease": ctx.lease}


@awa_pool.task("chaos_cpu", queue=FAST_QUEUE, pass_context=True)
def chaos_cpu(ctx: Any, token: str, ms: float) -> dict:
    _exec_log("start", ctx)
    end = time.process_time() + ms / 1000.0
    loops = 0
    while time.process_time() < end:
        loops += 1
    _exec_log("end", ctx, "ok")
    return {"lease": ctx.lease, "loops": loops}


@awa_pool.task("chaos_fail", queue=FAST_QUEUE, max_attempts=3, pass_context=True)
def chaos_fail(ctx: Any, token: str, fail_times: int) -> dict:
    _exec_log("start", ctx)
    if ctx.attempt <= fail_times:
        _exec_log("end", ctx, "raise")
        raise RuntimeError(f"planned failure on attempt {ctx.attempt} (fails {fail_times} times)")
    _exec_log("end", ctx, "ok")
    return {"lease": ctx.lease}


@awa_pool.task("chaos_long", queue=SLOW_QUEUE, timeout=60, pass_context=True)
def chaos_long(ctx: Any, token: str, seconds: float) -> dict:
    _exec_log("start", ctx)
    started = time.monotonic()
    halfway = False
    while time.monotonic() - started < seconds:
        time.sleep(0.05)  # the job's own work: a slow external call
        if not halfway and time.monotonic() - started >= seconds / 2:
            ctx.set_progress(50, "half way", lease=ctx.lease)
            halfway = True
    _exec_log("end", ctx, "ok")
    return {"lease": ctx.lease}


@awa_pool.task("chaos_callback", queue=SLOW_QUEUE, pass_context=True)
def chaos_callback(ctx: Any, token: str) -> Any:
    if ctx.callback_result is not None:
        _exec_log("start", ctx, "resumed")
        _exec_log("end", ctx, "ok")
        return {"lease": ctx.lease, "resumed_with": ctx.callback_result}
    _exec_log("start", ctx)
    try:
        callback = ctx.register_callback(timeout=CALLBACK_TIMEOUT_S)
    except Exception:
        _exec_log("end", ctx, "raise")
        raise
    _exec_log("end", ctx, "wait")
    return awa_pool.WaitForCallback(callback)


# -- the producer and the external system ---------------------------------------------------

class Producer(threading.Thread):
    """Enqueues `total` jobs at a steady rate over `duration` seconds. Each job
    carries a unique token, so a commit whose outcome was lost with the
    connection can be settled by looking the tokens up."""

    def __init__(self, url: str, total: int, duration: float, seed: int, run_id: str) -> None:
        super().__init__(name="chaos-producer", daemon=True)
        self.url = url
        self.total = total
        self.duration = duration
        self.rng = random.Random(seed)
        self.prefix = run_id[:8]
        self.jobs: Dict[int, Tuple[str, str]] = {}   # id -> (token, kind)
        self.enqueued = 0
        self.errors = 0
        self.recovered = 0
        self.stop_event = threading.Event()
        self.conn: Optional[psycopg2.extensions.connection] = None

    def make_job(self, seq: int) -> awa_pool.Job:
        token = f"{self.prefix}-{seq}"
        rng = self.rng
        priority = rng.choice((1, 2, 2, 3, 4))
        r = rng.random()
        if r < 0.50:
            return awa_pool.Job("chaos_noop", {"token": token}, queue=FAST_QUEUE, priority=priority)
        if r < 0.72:
            return awa_pool.Job("chaos_cpu", {"token": token, "ms": round(rng.uniform(2, 20), 1)},
                                queue=FAST_QUEUE, priority=priority)
        if r < 0.84:
            return awa_pool.Job("chaos_fail", {"token": token, "fail_times": rng.choice((1, 1, 2, 3))},
                                queue=FAST_QUEUE, priority=priority, max_attempts=3)
        if r < 0.92:
            return awa_pool.Job("chaos_callback", {"token": token}, queue=SLOW_QUEUE, priority=priority)
        if r < 0.94:
            return awa_pool.Job("chaos_long", {"token": token, "seconds": round(rng.uniform(0.3, 2.5), 2)},
                                queue=SLOW_QUEUE, priority=priority)
        return awa_pool.Job("chaos_noop", {"token": token}, queue=FAST_QUEUE, priority=priority,
                            delay=round(rng.uniform(0.2, 3.0), 2))

    def run(self) -> None:
        started = time.monotonic()
        seq = 0
        while seq < self.total and not self.stop_event.is_set():
            elapsed = time.monotonic() - started
            due = min(self.total, int(self.total * min(1.0, elapsed / self.duration)) + 1)
            if due > seq:
                count = min(due - seq, 500)
                self.insert([self.make_job(seq + i) for i in range(count)])
                seq += count
            self.stop_event.wait(0.05)  # pacing of the load, not synchronization

    def insert(self, jobs: List[awa_pool.Job]) -> None:
        pending = jobs
        while pending and not self.stop_event.is_set():
            try:
                if self.conn is None or self.conn.closed:
                    self.conn = psycopg2.connect(self.url, connect_timeout=3, application_name="awa-chaos-producer")
                if self.rng.random() < 0.1:
                    ids = [awa_pool.enqueue(self.conn, job) for job in pending]
                else:
                    ids = awa_pool.enqueue_many(self.conn, pending)
                self.conn.commit()
                self._record(zip(ids, pending))
                return
            except psycopg2.Error:
                self.errors += 1
                self._drop()
                pending = self._settle_unknown(pending)

    def _record(self, pairs: Iterable[Tuple[int, awa_pool.Job]]) -> None:
        for job_id, job in pairs:
            self.jobs[job_id] = (job.args["token"], job.kind)
            self.enqueued += 1

    def _drop(self) -> None:
        close_quietly(self.conn)
        self.conn = None

    def _settle_unknown(self, jobs: List[awa_pool.Job]) -> List[awa_pool.Job]:
        """After a failed transaction: which of these jobs did commit? Returns the others."""
        tokens = [job.args["token"] for job in jobs]
        while not self.stop_event.is_set():
            try:
                conn = connect(self.url)
                try:
                    with conn.cursor() as cur:
                        cur.execute("SELECT args->>'token', id FROM awa.jobs WHERE args->>'token' = ANY(%s)",
                                    (tokens,))
                        found = dict(cur.fetchall())
                finally:
                    conn.close()
            except psycopg2.Error:
                self.stop_event.wait(0.5)  # the server is down: try again shortly
                continue
            committed = [(found[job.args["token"]], job) for job in jobs if job.args["token"] in found]
            self.recovered += len(committed)
            self._record(committed)
            return [job for job in jobs if job.args["token"] not in found]
        return jobs


class CallbackHelper(threading.Thread):
    """Plays the external system: resolves the callbacks of waiting jobs
    (most complete with a payload, one in seven resumes the handler)."""

    def __init__(self, url: str) -> None:
        super().__init__(name="chaos-callbacks", daemon=True)
        self.url = url
        self.stop_event = threading.Event()
        self.counts: Counter = Counter()

    def run(self) -> None:
        conn = None
        while not self.stop_event.is_set():
            try:
                if conn is None or conn.closed:
                    conn = psycopg2.connect(self.url, connect_timeout=3, application_name="awa-chaos-callbacks")
                waiting = awa_pool.list_jobs(conn, state="waiting_external", kind="chaos_callback", limit=200)
                conn.rollback()
                for record in waiting:
                    if record.callback_id is None:
                        continue
                    try:
                        if record.id % 7 == 0:
                            awa_pool.resume_external(conn, record.callback_id, {"resume": record.id})
                            self.counts["resumed"] += 1
                        else:
                            awa_pool.complete_external(conn, record.callback_id, {"by": "helper", "job": record.id})
                            self.counts["completed"] += 1
                        conn.commit()
                    except awa_pool.UnknownCallback:
                        conn.rollback()
                        self.counts["already_used"] += 1
            except psycopg2.Error:
                self.counts["db_errors"] += 1
                close_quietly(conn)
                conn = None
            self.stop_event.wait(0.2)  # polling interval of the external system
        if conn is not None:
            conn.close()
