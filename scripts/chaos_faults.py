"""Fault injection for the chaos run (scripts/chaos.py): the schedule of
faults, the five kinds (child kill, supervisor kill, backend kill, server
restart, pause), and the probes that measure how long the system takes to
recover from each one (`Observer`)."""
from __future__ import annotations

import argparse
import os
import random
import signal
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

import psycopg2

from chaos_checks import OrphanWatch
from chaos_fleet import (AdminSession, Fleet, alive, backends_by_supervisor, children_of, close_quietly, connect,
                         identity, parent_of, say)

if TYPE_CHECKING:
    from chaos_checks import ExecLog

FAULT_KINDS = ("child_kill", "supervisor_kill", "backend_kill", "server_restart", "pause")


@dataclass
class Fault:
    """One injected fault: what, when, and which processes it hit."""

    kind: str
    at: float                         # wall time
    sup_pid: Optional[int] = None
    child_pid: Optional[int] = None
    until: Optional[float] = None     # pauses: SIGCONT time; backend kills: back (or superseded)
    detail: str = ""


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
    waiting_for: str = ""             # while pending: what the last check found missing


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
                close_quietly(conn)
                conn = None
            self.stop_event.wait(0.1)  # probe resolution
        if conn is not None:
            conn.close()

    def unrecovered(self) -> List[str]:
        """A violation for every fault the system never recovered from, by kind."""
        return [f"{kind} ({probe.detail}) never recovered" + (f": {probe.waiting_for}" if probe.waiting_for else "")
                for kind in FAULT_KINDS for probe in self.probes if probe.kind == kind and probe.outcome == "pending"]


ROLES = {"listen": "notifier", "leader": "leader", "completer": "completer", "main": "main"}


def session_name(session: str) -> str:
    """Which of a supervisor's sessions this is ("application_name\\nlast
    query", as backends_by_supervisor gives it): by the role in its name
    ("awa-pool/17 listen", awa_pool.core.db.session_name), else judged by its
    last query."""
    name, _, query = session.partition("\n")
    role = ROLES.get(name.rsplit(" ", 1)[-1]) if " " in name else None
    if role is not None:
        return role
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


# -- the injector ------------------------------------------------------------------------------

class FaultInjector:
    """Injects each fault kind at its scheduled times and registers a
    recovery probe for each fault with the observer."""

    def __init__(self, args: argparse.Namespace, rng: random.Random, server: Any, fleet: Fleet,
                 log: ExecLog, observer: Observer, orphans: OrphanWatch, admin: AdminSession) -> None:
        self.args = args
        self.rng = rng
        self.server = server
        self.fleet = fleet
        self.log = log
        self.observer = observer
        self.orphans = orphans
        self.admin = admin
        self.faults: List[Fault] = []
        self.pause_due: Dict[int, float] = {}
        self.pause_count = 0
        self.restart_count = 0
        self.backends_terminated = 0
        self.busy_child_kills = 0

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

    # -- injecting faults ---------------------------------------------------------------------
    def inject(self, kind: str) -> bool:
        try:
            return getattr(self, f"_{kind}")()
        except psycopg2.Error as exc:
            say(f"{kind} postponed: {str(exc).strip().splitlines()[0] if str(exc).strip() else exc}")
            self.admin.drop()
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
            if inc is not None and inc.active and parent_of(child_pid) == inc.pid:
                candidates.append((child_pid, execution, inc))
        if candidates:
            child_pid, execution, inc = self.rng.choice(candidates)
        else:
            inc = self.rng.choice(active)
            children = children_of(inc.pid)
            if not children:
                return False
            child_pid, execution = self.rng.choice(children), None
        if parent_of(child_pid) != inc.pid:
            return False
        at = time.time()  # before the kill: what it causes may come before this thread runs again
        try:
            os.kill(child_pid, signal.SIGKILL)
        except ProcessLookupError:
            return False
        fault = Fault("child_kill", at, sup_pid=inc.pid, child_pid=child_pid,
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
        at = time.time()  # before the kill (Fleet.kill returns once the process is reaped)
        self.fleet.kill(inc, restart_after=self.rng.uniform(0.2, 2.0))
        if was_paused:  # killed while frozen: that pause ends here
            for fault in reversed(self.faults):
                if fault.kind == "pause" and fault.sup_pid == inc.pid and fault.until is None:
                    fault.until = inc.ended_at
                    break
        fault = Fault("supervisor_kill", at, sup_pid=inc.pid,
                      detail=f"slot {inc.slot}, {len(children)} children")
        self.faults.append(fault)
        self.pause_due.pop(inc.pid, None)
        self.orphans.add(inc.pid, children)
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
        cur = self.admin.cursor()
        owned = backends_by_supervisor(cur, self.fleet, self.server.port)
        candidates = [inc for inc in active if owned.get(inc.pid)]
        if not candidates:
            return False
        inc = self.rng.choice(candidates)
        backends = owned[inc.pid]
        victims = backends if self.rng.random() < 0.4 else [self.rng.choice(backends)]
        at = time.time()  # before the sessions end
        cur.execute("SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)), extract(epoch FROM clock_timestamp()) "
                    "FROM unnest(%s::int[]) AS pid", ([pid for pid, _ in victims],))
        killed, db_time = cur.fetchone()
        if not killed:
            return False
        self.backends_terminated += killed
        what = ", ".join(session_name(query) for _, query in victims)
        fault = Fault("backend_kill", at, sup_pid=inc.pid, detail=f"{killed} session(s): {what}")
        self.faults.append(fault)
        fleet, port = self.fleet, self.server.port

        def check(cur: Any) -> Optional[str]:
            if not inc.active:
                fault.until = time.time()
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
                probe.waiting_for = f"no heartbeat from supervisor {inc.db_id} since the kill"
                return None
            sessions = backends_by_supervisor(cur, fleet, port).get(inc.pid, [])
            if not any(session_name(query) == "notifier" for _, query in sessions):
                probe.waiting_for = "no LISTEN session; its sessions: " + "; ".join(
                    " ".join(session.split())[:80] for _, session in sessions)
                return None
            fault.until = time.time()  # its sessions, and with them its liveness lock, are back
            return "recovered"

        probe = Probe("backend_kill", fault.at, check, fault.detail)
        self.observer.add(probe)
        return True

    def _server_restart(self) -> bool:
        if not self.server.restartable:
            return True
        mode = ("fast", "immediate")[self.restart_count % 2]
        outage = self.rng.uniform(0.0, 4.0)
        began = time.time()
        say(f"restarting PostgreSQL ({mode} shutdown, {outage:.1f}s outage)")
        self.admin.drop()
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
                         if any(session_name(query) == "notifier" for _, query in sessions.get(inc.pid, []))]
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

    def resume_paused(self, everyone: bool = False) -> None:
        """SIGCONT the paused supervisors whose pause is over (every one at the end of the chaos)."""
        now = time.monotonic()
        for pid, due in list(self.pause_due.items()):
            if everyone or now >= due:
                del self.pause_due[pid]
                self.resume(pid)
