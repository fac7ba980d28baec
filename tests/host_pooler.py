"""Scenario 5 of issue 25: supervisors behind a real PgBouncer.

In transaction mode, the main and completion connections go through the
pooler and the LISTEN session (with the liveness lock) and the leader's
session go to `--session-database-url`; without that URL the supervisor
polls and never campaigns for leader. In session mode one URL does it all.
Each run also checks that nothing a supervisor does stays behind on the
pooler's server sessions: no advisory lock, no LISTEN (PgBouncer would log
a notification for a server it had no client for), no `synchronous_commit`
changed for the producers that share them.
"""
from __future__ import annotations

import os
import signal
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import psycopg2

import awa_pool
from awa_pool import Job

from hostlab import Bench, Cluster, Supervisor, cluster, wait_until
from pgbouncer import PgBouncer

APPS = "apps.basic,apps.features,apps.cron"


@contextmanager
def pgbouncer(bench: Bench, mode: str) -> Iterator[PgBouncer]:
    """A PgBouncer on the bridge in front of the bench's server; it reaches
    the server from the bridge address, so its server sessions are told
    apart from the hosts' direct ones and the test's own (loopback)."""
    bouncer = PgBouncer(bench.server_address, bench.server_address, bench.server.port, mode)
    try:
        yield bouncer
    finally:
        bouncer.stop()


@dataclass
class Pooled:
    mode: str
    session_url: bool
    listening: List[bool]                  # per supervisor: LISTEN works
    leaders: List[int]                     # supervisors marked leader
    states: Dict[str, str] = field(default_factory=dict)   # feature -> final state
    wait_s: float = 0.0                    # wait() on every feature job, through the pooler
    cancel_seen_s: float = 0.0             # cancel_job -> the handler saw it
    cron_ticks: int = 0
    takeover_s: Optional[float] = None     # kill -9 of the leader -> the other leads
    direct_locks: int = 0                  # advisory locks held by the hosts' direct sessions
    warnings: List[int] = field(default_factory=list)   # pooler warning lines, per supervisor log
    exit_codes: List[int] = field(default_factory=list)
    leftovers: Dict[str, int] = field(default_factory=dict)  # what stayed on pooled server sessions


def _through(url: str) -> psycopg2.extensions.connection:
    return psycopg2.connect(url, connect_timeout=5)


FEATURES = {  # name -> the job; the last three need a leader (promotion of due jobs)
    "complete": Job("add", {"a": 2, "b": 3}), "retry": Job("retry_then_ok", {"times": 1}),
    "callback": Job("cb_wait"), "snooze": Job("snooze_once"), "fail": Job("fail", max_attempts=2),
    "scheduled": Job("add", {"a": 1, "b": 1}, delay=1.0)}
NEED_LEADER = ("snooze", "fail", "scheduled")


def _features(c: Cluster, url: str, result: Pooled, with_leader: bool) -> None:
    """Every feature's job, enqueued, resolved and waited for through `url`."""
    names = [name for name in FEATURES if with_leader or name not in NEED_LEADER]
    conn = _through(url)
    try:
        ids = awa_pool.enqueue_many(conn, [FEATURES[name] for name in names])
        conn.commit()
        callback = wait_until(lambda: c.scalar("SELECT callback_id FROM awa.jobs WHERE id = %s"
                                               " AND state = 'waiting_external'",
                                               (ids[names.index("callback")],)), 30,
                              "the callback job to park")
        awa_pool.complete_external(conn, str(callback), {"paid": True})
        conn.commit()
        started = time.monotonic()
        records = awa_pool.wait(conn, ids, timeout=60)
        result.wait_s = time.monotonic() - started
        result.states = {name: record.state for name, record in zip(names, records)}
    finally:
        conn.close()


def _cancel(c: Cluster, url: str, result: Pooled) -> None:
    conn = _through(url)
    try:
        job_id = awa_pool.enqueue(conn, Job("cooperative", {"limit_s": 30}))
        conn.commit()
        wait_until(lambda: any(r["job"] == job_id for r in _records(c, "cooperative_start")), 30,
                   "the cooperative job to start")
        asked = time.time()
        awa_pool.cancel_job(conn, job_id)
        conn.commit()
        seen = wait_until(lambda: next((r["time"] for r in _records(c, "cooperative_saw_cancel")
                                        if r["job"] == job_id), None), 30, "the handler to see its cancel",
                          interval=0.01)
        result.cancel_seen_s = seen - asked
        result.states["cancel"] = awa_pool.wait(conn, [job_id], timeout=30)[0].state
    finally:
        conn.close()


def _records(c: Cluster, kind: str) -> List[dict]:
    """apps.basic's execution lines: `kind job pid time extra`."""
    found = []
    for path in c.log_dir.glob("exec-*.log"):
        for line in path.read_text().splitlines():
            parts = line.split(" ", 4)
            if parts[0] == kind:
                found.append({"job": int(parts[1]), "time": float(parts[3])})
    return found


def _leftovers(c: Cluster, bouncer: PgBouncer) -> Dict[str, int]:
    """What supervisors left on the pooler's server sessions."""
    locks = c.bench.server.execute(
        "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)"
        " WHERE l.locktype = 'advisory' AND a.client_addr = %s::inet", (bouncer.listen,))[0][0]
    conn = _through(bouncer.url(c.name))
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            asynchronous = 0
            for _ in range(20):
                cur.execute("SHOW synchronous_commit")
                asynchronous += cur.fetchone()[0] != "on"
    finally:
        conn.close()
    stray = bouncer.log_tail(1_000_000).count("got packet 'A' from server when not linked")
    return {"advisory locks": int(locks), "async commit sessions": asynchronous, "stray notifications": stray}


def behind_pgbouncer(bench: Bench, work_dir: Path, *, mode: str, session_url: bool,
                     kill_leader: bool = True) -> Pooled:
    """Two supervisor hosts behind a PgBouncer in `mode`, with or without a
    direct session URL; every feature through the pooler."""
    with pgbouncer(bench, mode) as bouncer, \
            cluster(bench, work_dir / f"pgbouncer-{mode}-{session_url}") as c:
        pooled_url = bouncer.url(c.name)
        args = ("--session-database-url", c.host_url) if session_url else ()
        supervisors: List[Supervisor] = []
        for name in ("a", "b"):
            supervisors.append(c.start(bench.lab.add_host(name), *args, app=APPS, queues=(), url=pooled_url))
            c.wait_ready(supervisors[-1:])
        result = Pooled(mode, session_url, [], [])
        with_leader = session_url or mode == "session"
        if with_leader:
            wait_until(lambda: c.leader(), 15, "a leader")
            wait_until(lambda: c.scalar("SELECT count(*) FROM awa.jobs WHERE kind = 'cron_tick'") >= 2, 15,
                       "the leader to fire cron")
        _features(c, pooled_url, result, with_leader)
        _cancel(c, pooled_url, result)
        result.listening = [row[0] for row in c.query(
            "SELECT (stats->>'listen')::bool FROM awa.supervisors WHERE stopped_at IS NULL ORDER BY id")]
        result.leaders = [row[0] for row in c.query("SELECT pid FROM awa.supervisors WHERE is_leader")]
        result.cron_ticks = int(c.scalar("SELECT count(*) FROM awa.jobs WHERE kind = 'cron_tick'"))
        result.direct_locks = int(bench.server.execute(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) WHERE l.locktype = 'advisory'"
            " AND a.client_addr = ANY(%s::inet[])", ([s.host.address for s in supervisors],))[0][0])
        result.warnings = [sum("transaction-mode pooler" in line for line in s.log(1_000_000).splitlines())
                           for s in supervisors]
        leader = c.leader()
        if kill_leader and leader is not None:
            killed = time.monotonic()
            os.kill(leader.pid, signal.SIGKILL)
            other = next(s for s in supervisors if s is not leader)
            wait_until(lambda: c.leader() is other, 30, "the other supervisor to lead", interval=0.05)
            result.takeover_s = time.monotonic() - killed
        result.exit_codes = [c.stop(s) for s in supervisors if s.alive()]
        result.leftovers = _leftovers(c, bouncer)
    return result
