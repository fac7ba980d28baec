"""Supervisors for scale.py, and what is measured while they run: drain
rate, pickup latency, peak RSS and CPU of their processes.

A Fleet starts k supervisor processes (scale_tasks.py, each an
awa_pool.Pool) in their own process groups and stops them with SIGTERM (then
SIGKILL), so nothing outlives a measurement.
"""
from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Tuple

import psycopg2

from driver import stop_workers  # the harness's own group-wide SIGTERM, then SIGKILL

HERE = os.path.dirname(os.path.abspath(__file__))
CLK_TCK = os.sysconf("SC_CLK_TCK")


class Fleet:
    """k supervisors with `workers` children each, serving `queues`."""

    def __init__(self, dsn: str, *, supervisors: int = 1, workers: int = 1, queues: List[str],
                 source: Optional[str] = None, leader: bool = True, metrics_port: Optional[int] = None,
                 max_batch: Optional[int] = None):
        self.rec_dir = tempfile.mkdtemp(prefix="awa-scale-")
        self.procs: List[subprocess.Popen] = []
        queue_file = os.path.join(self.rec_dir, "queues.txt")
        with open(queue_file, "w") as f:
            f.write("\n".join(queues) + "\n")
        for i in range(supervisors):
            cmd = [sys.executable, os.path.join(HERE, "scale_tasks.py"), dsn, "--workers", str(workers),
                   "--queue-file", queue_file]
            if source:
                cmd += ["--source", source]
            if not leader or i > 0:  # one leader at most, and only when asked
                cmd.append("--no-leader")
            if metrics_port is not None and i == 0:
                cmd += ["--metrics-port", str(metrics_port)]
            if max_batch is not None:
                cmd += ["--max-batch", str(max_batch)]
            log = open(os.path.join(self.rec_dir, f"supervisor-{i}.log"), "wb")
            self.procs.append(subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, "SCALE_REC_DIR": self.rec_dir, "PYTHONUNBUFFERED": "1"}))
        self.started = time.time()

    def alive(self) -> bool:
        return all(p.poll() is None for p in self.procs)

    def log_tail(self, n: int = 2000) -> str:
        out = []
        for name in sorted(os.listdir(self.rec_dir)):
            if name.startswith("supervisor-"):
                with open(os.path.join(self.rec_dir, name), "rb") as f:
                    out.append(f"--- {name}\n" + f.read()[-n:].decode(errors="replace"))
        return "\n".join(out)

    def pids(self) -> Dict[str, List[int]]:
        """{"supervisors": [...], "children": [...]} from /proc."""
        sups = [p.pid for p in self.procs if p.poll() is None]
        children: List[int] = []
        for pid in sups:
            try:
                with open(f"/proc/{pid}/task/{pid}/children") as f:
                    children += [int(x) for x in f.read().split()]
            except OSError:
                pass
        return {"supervisors": sups, "children": children}

    def stop(self, grace: float = 30.0) -> None:
        """SIGTERM each supervisor's process group, SIGKILL what is left after `grace`."""
        stop_workers(self.procs, grace)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.rec_dir, ignore_errors=True)

    def __enter__(self) -> "Fleet":
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is not None:
            self.show_logs()
        self.close()

    def show_logs(self, lines: int = 15) -> None:
        """The end of each supervisor's log, when a measurement failed."""
        for i, proc in enumerate(self.procs):
            path = os.path.join(self.rec_dir, f"supervisor-{i}.log")
            with open(path, "rb") as f:
                tail = f.read().decode(errors="replace").splitlines()[-lines:]
            state = "running" if proc.poll() is None else f"exited {proc.returncode}"
            print(f"  supervisor {i} ({state}), last lines of its log:", flush=True)
            for line in tail:
                print(f"    {line}", flush=True)

    def records(self, prefix: str) -> List[List[str]]:
        rows = []
        for name in os.listdir(self.rec_dir):
            if name.startswith(prefix + "-"):
                with open(os.path.join(self.rec_dir, name)) as f:
                    rows += [line.split() for line in f if line.strip()]
        return rows


def peak_rss(pid: int) -> int:
    """VmHWM of a process in bytes (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return 0.0


def backend_pids(conn: Any, dbname: str) -> List[int]:
    with conn.cursor() as cur:
        cur.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                    (dbname,))
        pids = [r[0] for r in cur.fetchall()]
    conn.commit()
    return pids


def background_pids(conn: Any) -> List[int]:
    """The server's own processes (checkpointer, WAL writer, autovacuum...)."""
    with conn.cursor() as cur:
        cur.execute("SELECT pid FROM pg_stat_activity WHERE backend_type <> 'client backend'")
        pids = [r[0] for r in cur.fetchall()]
    conn.commit()
    return pids


def machine_times() -> Tuple[float, float, float]:
    """(busy, idle, iowait) clock ticks of every CPU so far, from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [float(x) for x in f.readline().split()[1:8]]
    user, nice, system, idle, iowait, irq, softirq = fields
    return user + nice + system + irq + softirq, idle, iowait


def wait_for(predicate, timeout: float, what: str, fleet: Optional[Fleet] = None, every: float = 0.2) -> float:
    """Poll until predicate() is true; returns the time it became true."""
    deadline = time.time() + timeout
    while True:
        if predicate():
            return time.time()
        if fleet is not None and not fleet.alive():
            raise RuntimeError(f"a supervisor exited while waiting for {what}:\n{fleet.log_tail()}")
        if time.time() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}"
                               + (f"\n{fleet.log_tail()}" if fleet else ""))
        time.sleep(every)


def done_count(conn: Any, queues: List[str], kind: str = "noop") -> int:
    with conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM awa.jobs_done WHERE queue = ANY(%s) AND kind = %s",
                    (list(queues), kind))
        n = cur.fetchone()[0]
    conn.commit()
    return n


def drain_rate(conn: Any, queues: List[str], since: float, kind: str = "noop") -> Dict[str, float]:
    """Jobs/s between the 10th and 90th percentile of the completion times of
    jobs of `kind` in `queues` finished after `since` (the middle 80% of a
    drain: start-up and the tail left out)."""
    with conn.cursor() as cur:
        cur.execute("""
            SELECT count(*),
                   extract(epoch FROM percentile_disc(0.1) WITHIN GROUP (ORDER BY finalized_at)),
                   extract(epoch FROM percentile_disc(0.9) WITHIN GROUP (ORDER BY finalized_at)),
                   extract(epoch FROM min(finalized_at)), extract(epoch FROM max(finalized_at))
              FROM awa.jobs_done
             WHERE queue = ANY(%s) AND kind = %s AND finalized_at >= to_timestamp(%s)""",
                    (list(queues), kind, since))
        n, p10, p90, first, last = cur.fetchone()
    conn.commit()
    if not n or p90 is None or p90 <= p10:
        return {"completed": n or 0, "jobs_per_s": float("nan")}
    return {"completed": n, "jobs_per_s": 0.8 * n / float(p90 - p10), "first_at": float(first),
            "last_at": float(last)}


def probe_pickups(dsn: str, fleet: Fleet, queue: str, count: int, rate_hz: float,
                  source_awa: Any) -> List[float]:
    """Enqueue `count` priority-1 probe jobs one per transaction at `rate_hz`
    while the fleet drains; returns commit -> handler start latencies (ms)."""
    committed = paced_probes(dsn, queue, count, rate_hz, source_awa)
    wait_for(lambda: len(fleet.records("probe")) >= count, 300, f"{count} probe jobs to start", fleet)
    started = {int(tag): float(at) for tag, at in fleet.records("probe")}
    return [1000.0 * (started[i] - committed[i]) for i in committed if i in started]


def p50_p99(latencies: List[float]) -> Tuple[float, float]:
    """A pickup run's median and 99th percentile (nearest rank: of 100
    probes, the second slowest), as the backlog curve and pickup.py report them."""
    ordered = sorted(latencies)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def paced_probes(dsn: str, queue: str, count: int, rate_hz: float, awa_pool: Any) -> Dict[int, float]:
    """Enqueue priority-1 probe jobs {"tag": i} one per transaction at
    `rate_hz`; returns when each one's commit returned (epoch seconds)."""
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    committed = {}
    try:
        t0 = time.time()
        for i in range(count):
            delay = t0 + i / rate_hz - time.time()
            if delay > 0:
                time.sleep(delay)
            awa_pool.enqueue(conn, awa_pool.Job("probe", {"tag": i}, queue=queue, priority=1))
            committed[i] = time.time()
    finally:
        conn.close()
    return committed


def loadavg() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())
