"""Run the multi-host scenarios of issue 25 and print their tables (Markdown)
for docs/scaling.md and docs/reliability.md.

Hosts are Linux network namespaces on a private bridge, PostgreSQL is a
private server on that bridge (both made and removed by tests/hostlab.py);
nothing else on the machine is touched. Needs root, iproute2 and the
PostgreSQL server binaries.

    sudo python scripts/hosts.py                    # every scenario
    sudo python scripts/hosts.py --only scaling --repeats 5 --jobs 20000
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Dict, List

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import host_failover  # noqa: E402
import host_pooler  # noqa: E402
import host_rescue  # noqa: E402
import host_scenarios  # noqa: E402
import hostlab  # noqa: E402

SCENARIOS = ("scaling", "partition-worker", "partition-leader", "partition-stop", "latency", "pgbouncer",
             "fast-rescue", "failover")


def say(text: str = "") -> None:
    print(text, flush=True)


def scaling(bench: hostlab.Bench, work: Path, args: argparse.Namespace) -> Dict[str, Any]:
    runs = host_scenarios.drain_series(bench, work, host_counts=[1, 2, 4], jobs=args.jobs,
                                       repeats=args.repeats, workers=args.workers)
    one = host_scenarios.median_rate(runs[1])
    say(f"### Scenario 1: N hosts drain one queue ({args.jobs:,} no-op jobs, -w {args.workers} per host, "
        f"median of {args.repeats} interleaved runs)\n")
    say("| hosts | children | jobs/s (median) | vs one host | statements / job | transactions / job |")
    say("|---|---|---|---|---|---|")
    for n, series in runs.items():
        rate = host_scenarios.median_rate(series)
        say(f"| {n} | {n * args.workers} | {rate:,.0f} | x{rate / one:.2f} "
            f"| {statistics.median(r.statements_per_job for r in series):.3f} "
            f"| {statistics.median(r.transactions_per_job for r in series):.3f} |")
    say()
    return {str(n): [asdict(r) for r in series] for n, series in runs.items()}


def partition_worker(bench: hostlab.Bench, work: Path, args: argparse.Namespace) -> Dict[str, Any]:
    r = host_scenarios.partition_worker(bench, work)
    say("### Scenario 2: a worker host cut off while it runs jobs\n")
    _facts([("cut -> its jobs rescued", f"{r.rescued_after_s:.1f} s ({r.silent_for_s:.1f} s after its last "
             "heartbeat)"),
            ("rescued jobs completed by the other host", r.completed_elsewhere),
            ("attempts the cut host finished anyway (outcomes dropped)", r.late_executions),
            ("of those, outcomes kept", r.kept_from_cut_host),
            ("leases executed twice / jobs not completed", f"{r.leases_run_twice} / {r.not_completed}"),
            ("heal -> the same process heartbeats again", f"{r.rejoined_after_s:.1f} s"),
            ("jobs it ran after rejoining", r.ran_after_rejoin)])
    return asdict(r)


def partition_leader(bench: hostlab.Bench, work: Path, args: argparse.Namespace) -> Dict[str, Any]:
    r = host_scenarios.partition_leader(bench, work)
    say("### Scenario 3: the leader's host cut off (an every-second cron schedule)\n")
    _facts([("cut -> the other host leads", f"{r.took_over_after_s:.1f} s"),
            ("cron ticks over the run / fired twice / never fired",
             f"{r.ticks} / {r.duplicate_ticks} / {r.missing_ticks}"),
            ("heal -> the old leader heartbeats again (as a follower)", f"{r.rejoined_after_s:.1f} s"),
            ("leaders at the end", len(r.leaders_at_end))])
    return asdict(r)


def partition_stop(bench: hostlab.Bench, work: Path, args: argparse.Namespace) -> Dict[str, Any]:
    r = host_scenarios.partition_then_stop(bench, work)
    say("### Scenario 2b: a cut-off host running 20 s jobs gets SIGTERM (default --shutdown-timeout 30s)\n")
    _facts([("cut -> it notices the lost connection", f"{r.noticed_after_s:.1f} s"),
            ("SIGTERM -> exit, still cut off", f"{r.exited_after_s:.1f} s (exit code {r.exit_code})"),
            ("its jobs not completed in the end", r.not_completed)])
    return asdict(r)


def pgbouncer(bench: hostlab.Bench, work: Path, args: argparse.Namespace) -> Dict[str, Any]:
    runs = [host_pooler.behind_pgbouncer(bench, work, mode=mode, session_url=session_url)
            for mode, session_url in (("transaction", True), ("transaction", False), ("session", False))]
    say("### Scenario 5: two supervisor hosts behind PgBouncer 1.18 (producer, admin calls and wait() too)\n")
    say("| pool mode | session URL | LISTEN | leader | features that ended as expected | cancel seen by the handler "
        "| leader killed -> other leads | left on pooled server sessions |")
    say("|---|---|---|---|---|---|---|---|")
    for r in runs:
        left = ", ".join(f"{n} {k}" for k, n in r.leftovers.items())
        takeover = f"{r.takeover_s:.2f} s" if r.takeover_s is not None else "no leader (polling)"
        say(f"| {r.mode} | {'yes' if r.session_url else 'no'} | {'yes' if all(r.listening) else 'no (polls)'} "
            f"| {len(r.leaders)} | {len(r.states)}: {', '.join(r.states)} | {r.cancel_seen_s:.2f} s "
            f"| {takeover} | {left} |")
    say()
    return {f"{r.mode}-{r.session_url}": asdict(r) for r in runs}


def fast_rescue(bench: hostlab.Bench, work: Path, args: argparse.Namespace) -> Dict[str, Any]:
    r = host_rescue.fast_rescue(bench, work, kills=args.kills)
    say(f"### Fast rescue: kill -9 of the supervisor running a job, {r.kills} times\n")
    _facts([("kill -> the job's next attempt started on another host",
             f"p50 {r.p50:.2f} s, p95 {r.p95:.2f} s, max {r.worst:.2f} s"),
            ("rescued by", f"the liveness lock ({sum('session ended' in x for x in r.reasons)} of {r.kills})")])
    return asdict(r)


def latency(bench: hostlab.Bench, work: Path, args: argparse.Namespace) -> Dict[str, Any]:
    r = host_scenarios.latency(bench, work, rounds=args.repeats)
    say(f"### Scenario 4: one host {r.delay_ms} ms away ({r.method}; SELECT 1 from it: "
        f"{r.round_trip_ms:.0f} ms)\n")
    _facts([("hosts a+b alone, jobs/s per round", ", ".join(f"{x:,.0f}" for x in r.alone_jobs_per_s)),
            ("hosts a+b while the slow host claims too", ", ".join(f"{x:,.0f}" for x in r.with_slow_jobs_per_s)),
            ("median ratio", f"x{r.ratio:.2f}"),
            ("jobs the slow host completed", r.slow_host_jobs),
            ("second attempts / leases run twice / not completed",
             f"{r.reruns} / {r.leases_run_twice} / {r.not_completed}")])
    return asdict(r)


def failover(bench: hostlab.Bench, work: Path, args: argparse.Namespace) -> Dict[str, Any]:
    results = [host_failover.failover(bench, work / str(n)) for n in range(args.repeats)]
    say(f"### Scenario 6: the primary crashes, its synchronous standby is promoted ({len(results)} runs)\n")
    say("| run | standby takes writes | longest enqueue gap | every supervisor back | first new job done "
        "| committed enqueues | lost | jobs run twice |")
    say("|---|---|---|---|---|---|---|---|")
    for n, r in enumerate(results, 1):
        say(f"| {n} | {r.writable_after_s:.2f} s | {r.enqueue_gap_s:.2f} s | {r.supervisors_back_after_s:.2f} s "
            f"| {r.first_job_after_s:.2f} s | {r.committed} | {r.lost} | {r.reruns} |")
    say()
    return {"runs": [asdict(r) for r in results]}


def _facts(rows: List[tuple]) -> None:
    say("| | |")
    say("|---|---|")
    for name, value in rows:
        say(f"| {name} | {value} |")
    say()


RUNNERS: Dict[str, Callable[[hostlab.Bench, Path, argparse.Namespace], Dict[str, Any]]] = {
    "scaling": scaling, "partition-worker": partition_worker, "partition-leader": partition_leader,
    "partition-stop": partition_stop, "latency": latency, "pgbouncer": pgbouncer, "fast-rescue": fast_rescue,
    "failover": failover}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", choices=SCENARIOS, help="run only these (repeatable)")
    parser.add_argument("--jobs", type=int, default=10000, help="jobs per drain in the scaling scenario")
    parser.add_argument("--workers", type=int, default=2, help="children per host in the scaling scenario")
    parser.add_argument("--repeats", type=int, default=3, help="runs per scaling point, latency rounds, failovers")
    parser.add_argument("--kills", type=int, default=20, help="kill -9 rounds of the fast-rescue scenario")
    parser.add_argument("--work-dir", type=Path, help="keep supervisor logs here (default: a temp dir)")
    parser.add_argument("--json", type=Path, help="also write the measurements here")
    args = parser.parse_args()
    why_not = hostlab.unavailable()
    if why_not:
        print(f"hosts: {why_not}", file=sys.stderr)
        return 2
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="awa-hosts-"))
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    started = datetime.datetime.now(datetime.timezone.utc)
    say(f"awa_pool {commit}, {started:%Y-%m-%d %H:%M} UTC, {os.cpu_count()} CPUs, "
        f"Linux {platform.release()}; logs in {work}\n")
    results: Dict[str, Any] = {"commit": commit, "started": started.isoformat()}
    with hostlab.open_bench() as bench:
        pg_version = bench.server.execute("SHOW server_version")[0][0]
        say(f"PostgreSQL {pg_version} (private, on the bridge {bench.lab.network})\n")
        results["postgresql"] = pg_version
        for name in args.only or SCENARIOS:
            results[name] = RUNNERS[name](bench, work / name, args)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
