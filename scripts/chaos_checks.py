"""The chaos run's checks (scripts/chaos.py): nothing lost, nothing run
twice without a fault to explain it, nothing stuck, no process left behind.
The evidence is the database's final state and the handlers' own execution
log (written by chaos_load), read back here by `ExecLog`."""
from __future__ import annotations

import os
import re
import signal
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from chaos_fleet import RUN_ENV, Identity, Incarnation, alive, processes_with_env

if TYPE_CHECKING:
    from chaos_faults import Fault

TERMINAL = ("completed", "failed", "cancelled")
ORPHAN_GRACE_S = 10.0               # a killed supervisor's children must be gone by then
EXPLAIN_SLACK_S = 2.0               # a fault this long before an execution started may still hit it


# -- the execution log ------------------------------------------------------------------------

@dataclass
class Execution:
    """One handler execution, as its start and end lines in the log tell it."""

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


# -- processes: orphans and supervisor logs ------------------------------------------------------

class OrphanWatch:
    """The children of each killed supervisor, until they are gone: one still
    alive ORPHAN_GRACE_S after the kill is a violation (and is killed)."""

    def __init__(self) -> None:
        self.watched: List[Tuple[float, int, List[Identity]]] = []   # (kill time, sup pid, children)

    def add(self, sup_pid: int, children: List[Identity]) -> None:
        self.watched.append((time.monotonic(), sup_pid, children))

    def poll(self) -> List[str]:
        violations = []
        now = time.monotonic()
        keep = []
        for killed_at, sup_pid, children in self.watched:
            survivors = [child for child in children if alive(child)]
            if not survivors:
                continue
            if now - killed_at > ORPHAN_GRACE_S:
                violations.append(f"orphan: children {[c[0] for c in survivors]} of killed supervisor "
                                  f"{sup_pid} still alive {ORPHAN_GRACE_S:g}s later")
                for child in survivors:
                    try:
                        os.kill(child[0], signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                continue
            keep.append((killed_at, sup_pid, children))
        self.watched = keep
        return violations


def leftover_processes(run_id: str) -> List[str]:
    """After every supervisor stopped, no process of the run may be left (they are killed)."""
    marker = f"{RUN_ENV}={run_id}".encode()
    deadline = time.monotonic() + 5
    left = processes_with_env(marker)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)  # killed processes need a moment to be reaped by init
        left = processes_with_env(marker)
    if not left:
        return []
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return [f"orphan processes left after every supervisor stopped: {left}"]


# A record's first line in the supervisor's text log (awa_pool.ops.logs.TEXT_FORMAT).
LOG_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [A-Z]+ \[\d+\] (?P<logger>[\w.]+): ")


def supervisor_tracebacks(incarnations: List[Incarnation]) -> List[str]:
    """Tracebacks of the supervisor's own: a handler's traceback follows its
    job's failure line (logger awa_pool.failures) and is not one."""
    violations = []
    for inc in incarnations:
        lines = inc.log_path.read_text(errors="replace").splitlines()
        for index, line in enumerate(lines):
            if "Traceback" not in line or LOG_RECORD.match(line):
                continue
            before = LOG_RECORD.match(lines[index - 1]) if index else None
            if before is None or before.group("logger") != "awa_pool.failures":
                violations.append(f"traceback in supervisor log {inc.log_path.name}: "
                                  + " | ".join(lines[index:index + 12]))
                break
    return violations


# -- the final state against the log --------------------------------------------------------------

def job_rows(cur: Any) -> Dict[int, tuple]:
    cur.execute("SELECT id, kind, state::text, attempt, max_attempts, lease, crashes, errors, result "
                "FROM awa.jobs")
    return {row[0]: row for row in cur.fetchall()}


def _explains(fault: Fault, first: Execution, second: Execution) -> bool:
    """Could this fault have made `first`'s outcome go missing, so that the
    job ran again as `second`? A pause, and terminated connections until the
    supervisor has them back (its liveness lock lives on one: the leader may
    rescue its jobs meanwhile), act for a while: any overlap counts."""
    low, high = first.start_t - EXPLAIN_SLACK_S, second.start_t
    if fault.kind in ("pause", "backend_kill"):
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
