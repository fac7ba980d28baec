"""The multi-host scenarios of issue 25, as functions that run one scenario on
a bench (tests/hostlab.py) and return what they measured. The tests in
tests/multihost assert on the results; scripts/hosts.py prints them as the
tables of docs/scaling.md and docs/reliability.md.
"""
from __future__ import annotations

import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List

from awa_pool import Job

import netns
from hostlab import Bench, Cluster, Supervisor, cluster, wait_until

QUEUE = "hosts"


# -- scenario 1: 1, 2 and 4 hosts drain one queue ---------------------------------------

@dataclass
class Drain:
    hosts: int
    workers: int
    jobs: int
    seconds: float
    statements_per_job: float
    transactions_per_job: float

    @property
    def jobs_per_s(self) -> float:
        return self.jobs / self.seconds


def _database_counters(c: Cluster) -> Dict[str, float]:
    """Statements (pg_stat_statements, counted at once) and committed
    transactions (pg_stat_database, flushed by each backend within about a
    second) of the cluster's database, read from another database so that
    reading them does not count."""
    row = c.bench.server.execute(
        "SELECT (SELECT coalesce(sum(calls), 0) FROM pg_stat_statements s WHERE s.dbid = d.oid),"
        "       (SELECT xact_commit FROM pg_stat_database WHERE datid = d.oid)"
        "  FROM pg_database d WHERE d.datname = %s", (c.name,))[0]
    return {"statements": float(row[0]), "transactions": float(row[1])}


def _settled_counters(c: Cluster, timeout: float = 10.0) -> Dict[str, float]:
    """The counters once no backend of the database is left to flush
    (call after stopping every supervisor)."""
    wait_until(lambda: c.bench.server.execute(
        "SELECT count(*) = 0 FROM pg_stat_activity WHERE datname = %s", (c.name,))[0][0],
        timeout, "the supervisors' sessions to end")
    previous: Dict[str, float] = {}

    def stable() -> Dict[str, float]:
        nonlocal previous
        now = _database_counters(c)
        steady, previous = now == previous, now
        return now if steady else {}

    return wait_until(stable, timeout, "transaction counters to settle", interval=0.5)


def drain(bench: Bench, work_dir: Path, *, hosts: int, jobs: int, workers: int = 2) -> Drain:
    """Start `hosts` supervisors on hosts of their own, wait until every one is
    idle, enqueue `jobs` no-op jobs in one transaction and time the drain
    from the enqueue's commit to the last completion (database clock)."""
    with cluster(bench, work_dir / f"drain-{hosts}") as c:
        supervisors = [c.start(bench.lab.add_host(f"h{n}"), workers=workers) for n in range(hosts)]
        c.wait_ready(supervisors)
        before = _database_counters(c)
        ids = c.enqueue([Job("host_noop", queue=QUEUE) for _ in range(jobs)])
        c.wait_terminal(ids, timeout=60 + jobs / 100)
        span, completed = c.query(
            "SELECT extract(epoch FROM max(finalized_at) - min(created_at)), count(*) FILTER"
            " (WHERE state = 'completed') FROM awa.jobs WHERE id = ANY(%s)", (ids,))[0]
        assert completed == jobs, f"{jobs - completed} of {jobs} jobs did not complete"
        for supervisor in supervisors:
            code = c.stop(supervisor)
            assert code == 0, f"supervisor exited {code}:\n{supervisor.log()}"
        after = _settled_counters(c)
    return Drain(hosts, workers, jobs, float(span),
                 (after["statements"] - before["statements"]) / jobs,
                 (after["transactions"] - before["transactions"]) / jobs)


def drain_series(bench: Bench, work_dir: Path, *, host_counts: List[int], jobs: int, repeats: int,
                 workers: int = 2) -> Dict[int, List[Drain]]:
    """Interleaved repetitions (1, 2, 4, 1, 2, 4, ...), so that a busy moment
    of the machine does not land on one host count only."""
    runs: Dict[int, List[Drain]] = {n: [] for n in host_counts}
    for repeat in range(repeats):
        for n in host_counts:
            runs[n].append(drain(bench, work_dir / f"r{repeat}", hosts=n, jobs=jobs, workers=workers))
    return runs


def median_rate(runs: List[Drain]) -> float:
    return statistics.median(run.jobs_per_s for run in runs)


# -- shared steps --------------------------------------------------------------------

def _db_now(c: Cluster) -> float:
    return float(c.scalar("SELECT extract(epoch FROM now())"))


def _leader_and_follower(c: Cluster, bench: Bench, **start: object) -> "tuple[Supervisor, Supervisor]":
    """Host a starts first and leads; host b follows."""
    a = c.start(bench.lab.add_host("a"), **start)  # type: ignore[arg-type]
    c.wait_ready([a])
    wait_until(lambda: c.leader() is a, 15, "host a to lead")
    b = c.start(bench.lab.add_host("b"), **start)  # type: ignore[arg-type]
    c.wait_ready([b])
    return a, b


def _wait_heartbeat_after(c: Cluster, supervisor: Supervisor, since: float, timeout: float) -> float:
    """Seconds (database clock) from `since` until the supervisor heartbeats."""
    beat = wait_until(lambda: c.scalar(
        "SELECT extract(epoch FROM heartbeat_at) FROM awa.supervisors WHERE id = %s"
        " AND heartbeat_at > to_timestamp(%s)", (supervisor.id, since)), timeout,
        f"host {supervisor.host.name} to heartbeat again")
    return float(beat) - since


def _stop_all(c: Cluster, supervisors: List[Supervisor]) -> List[int]:
    return [c.stop(supervisor) for supervisor in supervisors]


# -- scenario 2: a worker host is cut off while it runs jobs ---------------------------

@dataclass
class WorkerPartition:
    rescued_after_s: float          # cut -> its running jobs taken from it (database clock)
    silent_for_s: float             # its last heartbeat -> the rescue (staleness: >= 10 s)
    rescue_reasons: List[str]       # why each of its jobs was rescued (the heartbeat, never its session)
    completed_elsewhere: int        # of those, completed by the other host
    late_executions: int            # attempts the cut host finished anyway (outcomes to drop)
    kept_from_cut_host: int         # rescued jobs whose kept outcome is the cut host's (must be 0)
    leases_run_twice: int           # (job, lease) executed more than once (must be 0)
    not_completed: int              # jobs not completed at the end (must be 0)
    rejoined_after_s: float         # heal -> its next heartbeat
    ran_after_rejoin: int           # jobs the same process ran after it rejoined
    exit_codes: List[int]


def partition_worker(bench: Bench, work_dir: Path, *, job_seconds: float = 3.0,
                     extra_jobs: int = 8) -> WorkerPartition:
    """Cut the link of a host that is running jobs (not the leader); heal it
    once its jobs completed elsewhere; then give both hosts more work."""
    with cluster(bench, work_dir / "partition-worker") as c:
        a, b = _leader_and_follower(c, bench)
        first = c.enqueue([Job("host_sleep", {"seconds": job_seconds}, queue=QUEUE) for _ in range(4)])
        held = wait_until(lambda: [row[0] for row in c.query(
            "SELECT id FROM awa.jobs WHERE state = 'running' AND supervisor_id = %s", (b.id,))], 15,
            "host b to run jobs")
        cut_at = _db_now(c)
        b.host.partition()
        rescued_at = wait_until(lambda: c.scalar(
            "SELECT extract(epoch FROM now()) WHERE NOT EXISTS (SELECT FROM awa.jobs WHERE id = ANY(%s)"
            " AND state = 'running' AND supervisor_id = %s)", (held, b.id)), 40,
            "the cut host's jobs to be rescued", interval=0.1)
        last_beat = float(c.scalar("SELECT extract(epoch FROM heartbeat_at) FROM awa.supervisors WHERE id = %s",
                                   (b.id,)))
        reasons = [row[0] for row in c.query("SELECT errors->0->>'error' FROM awa.jobs WHERE id = ANY(%s)",
                                              (held,))]
        c.wait_terminal(first, timeout=30 + 2 * job_seconds)
        healed_at = _db_now(c)
        b.host.heal()
        rejoined = _wait_heartbeat_after(c, b, healed_at, timeout=60)
        # its children finished the old attempts while it was cut off; their
        # outcomes reach the database now and must change nothing
        wait_until(lambda: len([e for e in c.executions("host_sleep") if e["supervisor_pid"] == b.pid])
                   >= len(held), 30, "the cut host's children to finish their attempts")
        c.wait_ready([a, b])
        more = c.enqueue([Job("host_work", {"seconds": 0.5}, queue=QUEUE) for _ in range(extra_jobs)])
        c.wait_terminal(more, timeout=60)
        codes = _stop_all(c, [a, b])
        kept = dict((row[0], row[1]) for row in c.query(
            "SELECT id, (result->>'supervisor_pid')::int FROM awa.jobs WHERE id = ANY(%s)"
            " AND state = 'completed'", (first + more,)))
        runs = c.executions("host_sleep") + c.executions("host_work")
        leases = [(run["job"], run["lease"]) for run in runs]
    late = [run for run in c.executions("host_sleep") if run["supervisor_pid"] == b.pid and run["job"] in held]
    return WorkerPartition(
        rescued_after_s=float(rescued_at) - cut_at, silent_for_s=float(rescued_at) - last_beat,
        rescue_reasons=reasons,
        completed_elsewhere=sum(1 for job in held if kept.get(job) == a.pid),
        late_executions=len(late),
        kept_from_cut_host=sum(1 for job in held if kept.get(job) == b.pid),
        leases_run_twice=len(leases) - len(set(leases)),
        not_completed=len(first) + len(more) - len(kept),
        rejoined_after_s=rejoined,
        ran_after_rejoin=sum(1 for run in runs if run["job"] in more and run["supervisor_pid"] == b.pid),
        exit_codes=codes)


# -- scenario 3: the leader's host is cut off -------------------------------------------

@dataclass
class LeaderPartition:
    took_over_after_s: float        # cut -> the other host leads (database clock)
    ticks: int                      # cron ticks fired from the first to the last
    duplicate_ticks: int            # ticks fired more than once (must be 0)
    missing_ticks: int              # ticks never fired, catch-up included (must be 0)
    rejoined_after_s: float         # heal -> the old leader heartbeats again
    leaders_at_end: List[int]       # pids of supervisors marked leader at the end (one: host b)
    exit_codes: List[int]


def _cron_fire_times(c: Cluster) -> List[float]:
    return [float(row[0]) for row in c.query(
        "SELECT extract(epoch FROM (metadata->>'awa:fire_at')::timestamptz) FROM awa.jobs"
        " WHERE kind = 'cron_tick'")]


def partition_leader(bench: Bench, work_dir: Path, *, ticks_after: int = 3) -> LeaderPartition:
    """Cut the leader's link while an every-second cron schedule runs; heal it
    after the other host has led for a few ticks."""
    with cluster(bench, work_dir / "partition-leader") as c:
        a, b = _leader_and_follower(c, bench, app="apps.cron", queues=("cron",))
        wait_until(lambda: len(_cron_fire_times(c)) >= 3, 15, "the leader to fire 3 cron ticks")
        cut_at = _db_now(c)
        a.host.partition()
        took_over = wait_until(lambda: c.scalar(
            "SELECT extract(epoch FROM now()) FROM awa.supervisors WHERE is_leader AND id = %s", (b.id,)),
            60, "host b to lead", interval=0.1)
        wait_until(lambda: max(_cron_fire_times(c)) >= float(took_over) + ticks_after, 15,
                   f"{ticks_after} ticks fired by the new leader")
        healed_at = _db_now(c)
        a.host.heal()
        rejoined = _wait_heartbeat_after(c, a, healed_at, timeout=60)
        leaders = [row[0] for row in c.query(
            "SELECT pid FROM awa.supervisors WHERE is_leader AND stopped_at IS NULL")]
        codes = _stop_all(c, [a, b])
        fired = _cron_fire_times(c)
    seconds = sorted(round(t) for t in fired)
    expected = set(range(seconds[0], seconds[-1] + 1))
    return LeaderPartition(
        took_over_after_s=float(took_over) - cut_at, ticks=len(expected),
        duplicate_ticks=len(seconds) - len(set(seconds)), missing_ticks=len(expected - set(seconds)),
        rejoined_after_s=rejoined, leaders_at_end=leaders, exit_codes=codes)


# -- scenario 4: one host 200 ms away ----------------------------------------------------

@dataclass
class Latency:
    method: str                     # "tc netem" or "delay relay" (the kernel has no netem)
    delay_ms: int
    round_trip_ms: float            # SELECT 1 from the slow host, median of 9
    jobs: int                       # per drain
    alone_jobs_per_s: List[float]   # hosts a and b, each round without the slow host
    with_slow_jobs_per_s: List[float]  # hosts a and b, each round while the slow host c also claims
    slow_host_jobs: int             # jobs the slow host completed
    reruns: int                     # jobs that needed more than one attempt (must be 0)
    leases_run_twice: int           # (must be 0)
    not_completed: int              # (must be 0)
    exit_codes: List[int]

    @property
    def ratio(self) -> float:
        """Median over rounds of (a+b with c) / (a+b alone)."""
        return statistics.median(w / a for w, a in zip(self.with_slow_jobs_per_s, self.alone_jobs_per_s))


def _rate_of(c: Cluster, ids: List[int], pids: List[int]) -> float:
    count, span = c.query(
        "SELECT count(*), extract(epoch FROM max(finalized_at) - min(created_at)) FROM awa.jobs"
        " WHERE id = ANY(%s) AND (result->>'supervisor_pid')::int = ANY(%s)", (ids, pids))[0]
    return count / float(span) if count else 0.0


def _round_trip_ms(host: netns.Host, url: str) -> float:
    """Median time of `SELECT 1` from inside `host` over `url`."""
    probe = ("import psycopg2, statistics, sys, time\n"
             "conn = psycopg2.connect(sys.argv[1], connect_timeout=10)\n"
             "cur = conn.cursor()\n"
             "times = []\n"
             "for _ in range(9):\n"
             "    start = time.perf_counter(); cur.execute('SELECT 1'); cur.fetchone()\n"
             "    times.append(time.perf_counter() - start)\n"
             "print(statistics.median(times) * 1000)\n")
    done = subprocess.run(host.argv([sys.executable, "-c", probe, url]), capture_output=True, text=True,
                          timeout=60)
    if done.returncode != 0:
        raise AssertionError(f"round-trip probe from {host.name} failed: {done.stderr.strip()}")
    return float(done.stdout)


def latency(bench: Bench, work_dir: Path, *, delay_s: float = 0.2, jobs: int = 400,
            job_s: float = 0.05, rounds: int = 3) -> Latency:
    """Hosts a and b drain `jobs` recorded jobs of `job_s` alone, then again
    while host c, whose traffic takes `delay_s` longer, claims too; `rounds`
    rounds back to back. Jobs that sleep make a and b's rate a matter of
    their children and of the claim path (which a slow host could hold up),
    not of the CPU the machine's other work leaves. Every job must run
    exactly once and none may need a second attempt."""
    from delayline import DelayRelay

    relay = None
    with cluster(bench, work_dir / "latency") as c:
        try:
            pair = [c.start(bench.lab.add_host(name)) for name in ("a", "b")]
            c.wait_ready(pair)
            slow_host = bench.lab.add_host("c")
            url, method = c.host_url, "tc netem"
            if not slow_host.delay(delay_s):
                method = "delay relay"
                relay = DelayRelay(bench.lab.add_address(2), (bench.server_address, bench.server.port),
                                   delay_s).start()
                url = bench.server.url(c.name, host=relay.listen_host, port=relay.port)
            round_trip = _round_trip_ms(slow_host, url)
            alone: List[float] = []
            with_slow: List[float] = []
            every: List[int] = []
            codes: List[int] = []
            slow_pids: List[int] = []
            for _ in range(rounds):
                ids = c.enqueue([Job("host_work", {"seconds": job_s}, queue=QUEUE) for _ in range(jobs)])
                c.wait_terminal(ids, timeout=120)
                alone.append(_rate_of(c, ids, [s.pid for s in pair]))
                slow = c.start(slow_host, url=url)
                c.wait_ready(pair + [slow], timeout=60)
                ids_with = c.enqueue([Job("host_work", {"seconds": job_s}, queue=QUEUE) for _ in range(jobs)])
                c.wait_terminal(ids_with, timeout=120)
                with_slow.append(_rate_of(c, ids_with, [s.pid for s in pair]))
                codes.append(c.stop(slow))
                slow_pids.append(slow.pid)
                every += ids + ids_with
            slow_jobs = int(c.scalar("SELECT count(*) FROM awa.jobs WHERE id = ANY(%s) AND state = 'completed'"
                                     " AND (result->>'supervisor_pid')::int = ANY(%s)", (every, slow_pids)))
            reruns, completed = c.query("SELECT count(*) FILTER (WHERE attempt > 1), count(*) FILTER"
                                        " (WHERE state = 'completed') FROM awa.jobs WHERE id = ANY(%s)",
                                        (every,))[0]
            codes += _stop_all(c, pair)
            leases = [(run["job"], run["lease"]) for run in c.executions("host_work")]
        finally:
            if relay is not None:
                relay.close()
    return Latency(method, int(delay_s * 1000), round_trip, jobs, alone, with_slow, slow_jobs, int(reruns),
                   len(leases) - len(set(leases)), len(every) - int(completed), codes)


# -- scenario 2b: a cut-off host is told to stop ---------------------------------------

@dataclass
class CutOffShutdown:
    noticed_after_s: float          # cut -> it logs the lost connection (client-side TCP timeouts)
    exited_after_s: float           # SIGTERM -> exit, while still cut off
    exit_code: int
    not_completed: int              # its jobs, once rescued by the other host (must be 0)


def partition_then_stop(bench: Bench, work_dir: Path, *, job_seconds: float = 20.0) -> CutOffShutdown:
    """Cut off a host running long jobs, then SIGTERM it (as an orchestrator
    evicting the pod on a partitioned node does): it must notice the lost
    database on its own and exit within its shutdown timeout, not hang in a
    blocked query until TCP gives up."""
    with cluster(bench, work_dir / "partition-stop") as c:
        a, b = _leader_and_follower(c, bench)
        jobs = c.enqueue([Job("host_sleep", {"seconds": job_seconds}, queue=QUEUE) for _ in range(4)])
        wait_until(lambda: c.scalar("SELECT count(*) FROM awa.jobs WHERE state = 'running' AND supervisor_id = %s",
                                    (b.id,)), 15, "host b to run jobs")
        cut = time.monotonic()
        b.host.partition()
        wait_until(lambda: "lost the database connection" in b.log(20000), 40,
                   "the cut host to notice its lost connection", interval=0.1)
        noticed = time.monotonic() - cut
        stopping = time.monotonic()
        code = c.stop(b, timeout=90)
        exited = time.monotonic() - stopping
        b.host.heal()
        counts = c.wait_terminal(jobs, timeout=30 + 2 * job_seconds)
        _stop_all(c, [a])
    return CutOffShutdown(noticed, exited, code, len(jobs) - counts.get("completed", 0))
