"""The chaos run's report (scripts/chaos.py): the summary of a run (job
states, faults, recovery times per kind, violations), printed as a table and
optionally written as JSON, plus the faults and probes as JSON lines in the
work directory."""
from __future__ import annotations

import argparse
import json
import math
from collections import Counter
from pathlib import Path
from typing import Any, Dict, List, Optional

from awa_pool.core.db import redact
from chaos_faults import FAULT_KINDS, Fault, FaultInjector, Probe
from chaos_load import Producer


def percentile(values: List[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    index = min(len(ordered) - 1, max(0, int(math.ceil(q * len(ordered))) - 1))
    return ordered[index]


def recovery_times(probes: List[Probe]) -> Dict[str, Dict[str, Any]]:
    """Per fault kind: how many recoveries were measured, their max and median."""
    recovery = {}
    for kind in FAULT_KINDS:
        measured = [p.seconds for p in probes if p.kind == kind and p.outcome == "recovered" and p.seconds is not None]
        unrecovered = [p for p in probes if p.kind == kind and p.outcome == "pending"]
        recovery[kind] = {"measured": len(measured), "max_s": round(max(measured), 2) if measured else None,
                          "p50_s": round(percentile(measured, 0.5), 2) if measured else None,
                          "unrecovered": len(unrecovered)}
    return recovery


def summarize(args: argparse.Namespace, server_version: str, analysis: Dict[str, Any],
              injector: FaultInjector, incarnations: int, producer: Producer, callbacks: Dict[str, int],
              probes: List[Probe], settle_s: float, malformed_log_lines: int,
              violations: List[str]) -> Dict[str, Any]:
    fault_counts = Counter(f.kind for f in injector.faults)
    return {
        "command": redact(" ".join(["python", "scripts/chaos.py", *args.argv])),
        "seed": args.seed, "duration_s": args.duration, "supervisors": args.supervisors,
        "workers": args.workers, "server": server_version,
        "jobs": analysis["jobs"], "states": analysis["states"], "lost": analysis["lost"],
        "stuck": analysis["stuck"], "executions": analysis["executions"],
        "duplicates": analysis["duplicates"], "unexplained_duplicates": analysis["unexplained"],
        "failed_planned": analysis["failed_planned"], "failed_poison": analysis["failed_poison"],
        "rescued_attempts": analysis["rescued"], "crashed_attempts": analysis["crashed"],
        "faults": {kind: fault_counts.get(kind, 0) for kind in FAULT_KINDS},
        "busy_child_kills": injector.busy_child_kills, "backends_terminated": injector.backends_terminated,
        "supervisor_incarnations": incarnations,
        "producer": {"enqueued": producer.enqueued, "errors": producer.errors,
                     "recovered_commits": producer.recovered},
        "callbacks": callbacks, "recovery": recovery_times(probes),
        "settle_s": round(settle_s, 1), "malformed_log_lines": malformed_log_lines,
        "violations": violations,
    }


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


def write_outputs(summary: Dict[str, Any], summary_json: Optional[str], work: Path, faults: List[Fault],
                  probes: List[Probe]) -> None:
    if summary_json:
        Path(summary_json).write_text(json.dumps(summary, indent=2))
    with open(work / "faults.jsonl", "w") as handle:
        for fault in faults:
            handle.write(json.dumps(fault.__dict__) + "\n")
    with open(work / "probes.jsonl", "w") as handle:
        for probe in probes:
            handle.write(json.dumps({"kind": probe.kind, "since": probe.since, "detail": probe.detail,
                                     "outcome": probe.outcome, "seconds": probe.seconds}) + "\n")


def seeds_table(paths: List[str]) -> str:
    """A Markdown table of several runs' summaries (--summary-json files),
    one row per seed, for docs/reliability.md."""
    import json

    rows = ["| seed | jobs (completed / failed as planned) | lost | stuck | duplicates (unexplained) "
            "| rescued / crashed attempts | supervisor kill to recovered, p50 / max | violations |",
            "|---|---|---|---|---|---|---|---|"]
    for path in paths:
        with open(path) as f:
            s = json.load(f)
        kill = s["recovery"].get("supervisor_kill", {})
        rows.append(f"| {s['seed']} | {s['jobs']} ({s['states'].get('completed', 0)} / {s['failed_planned']}) "
                    f"| {s['lost']} | {s['stuck']} | {s['duplicates']} ({s['unexplained_duplicates']}) "
                    f"| {s['rescued_attempts']} / {s['crashed_attempts']} "
                    f"| {kill.get('p50_s', '-')} / {kill.get('max_s', '-')} s | {len(s['violations'])} |")
    return "\n".join(rows)


if __name__ == "__main__":
    import sys

    print(seeds_table(sys.argv[1:]))
