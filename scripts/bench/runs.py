"""Every driver run of one harness run, in the order they ran: a Markdown
table read from results/raw-<stamp>.jsonl (its first line is the run's
header), for a document to cite instead of the raw file.

    python scripts/bench/runs.py results/raw-<stamp>.jsonl > results/runs-<stamp>.md
"""
from __future__ import annotations

import json
import sys
from typing import Any, Dict


def result(run: Dict[str, Any]) -> str:
    if "latency_ms" in run:
        lat = run["latency_ms"]
        return f"p50 {lat['p50']:.1f} / p95 {lat['p95']:.1f} / p99 {lat['p99']:.1f} ms"
    text = f"{run['jobs_per_s']:.0f} jobs/s" if run["jobs_per_s"] >= 100 else f"{run['jobs_per_s']:.1f} jobs/s"
    if "hi_share" in run:
        text += f", hi share {run['hi_share']:.3f}"
    if "bare_ratio" in run:
        text += f", ×{run['bare_ratio']:.2f} bare"
    return text


def exactly_once(run: Dict[str, Any]) -> str:
    verify = run.get("verify", {})
    if "handler_runs" not in verify:
        return "n/a (queued ok)" if verify.get("ok") else "FAILED"
    if not verify.get("ok"):
        return "FAILED"
    return f"yes ({verify['unique']} of {verify['unique']}, 0 duplicates)"


def main(path: str) -> None:
    with open(path) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    print("| rep | workload | system | result | exactly-once | loadavg (1 min) at start |")
    print("|---|---|---|---|---|---|")
    for run in lines[1:]:
        print(f"| {run['rep']} | {run['workload']} | {run['system']} | {result(run)} | {exactly_once(run)} "
              f"| {run['loadavg_at_start'][0]:.1f} |")


if __name__ == "__main__":
    main(sys.argv[1])
