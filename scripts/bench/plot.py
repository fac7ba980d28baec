"""Plot one harness run: throughput per workload and W4 latency percentiles.

    python scripts/bench/plot.py scripts/bench/results/summary-<stamp>.json --out docs/img/bench

writes <out>-throughput.png (W1a, W1b, W2, W3, W5, W6 jobs/s per system,
median with min-max whiskers over the repetitions; limit rows in blue) and <out>-latency.png (W4 pickup
p50/p95/p99 per system, same whiskers). Needs matplotlib.
"""
from __future__ import annotations

import argparse
import json

THROUGHPUT = [("W1a", "W1a enqueue, 1 job per tx"), ("W1b", "W1b enqueue, batches of 1000"),
              ("W2", "W2 drain, no-op"), ("W3", "W3 CPU-bound, 25 ms jobs"),
              ("W5", "W5 weighted queues, 20 ms jobs"), ("W6", "W6 zlib-9 of 1-4 MB")]
LIMIT_ROWS = ("sql_bare", "process_pool")
PERCENTILES = ("p50", "p95", "p99")


def systems_of(summary: dict) -> list:
    seen = []
    for key in summary:
        if key != "_meta" and key.split("/")[0] not in seen:
            seen.append(key.split("/")[0])
    return seen


def stat(summary: dict, system: str, workload: str, metric: str):
    """(median, below, above) of one metric, or None when it was not run."""
    entry = summary.get(f"{system}/{workload}", {}).get(metric)
    if not entry:
        return None
    return entry["median"], entry["median"] - entry["min"], entry["max"] - entry["median"]


def bars(ax, systems, values, title, ylabel):
    import numpy as np

    x = np.arange(len(systems))
    medians = [v[0] if v else 0 for v in values]
    errors = [[v[1] if v else 0 for v in values], [v[2] if v else 0 for v in values]]
    colours = ["tab:red" if s == "awa_pool" else "tab:blue" if s in LIMIT_ROWS else "tab:gray"
               for s in systems]
    ax.bar(x, medians, yerr=errors, color=colours, capsize=3)
    ax.set_xticks(x, systems, rotation=30, ha="right", fontsize=8)
    ax.set_title(title, fontsize=9)
    ax.set_ylabel(ylabel, fontsize=8)
    for xi, m in zip(x, medians):
        ax.annotate(f"{m:,.0f}" if m >= 100 else f"{m:.1f}", (xi, m), ha="center", va="bottom",
                    fontsize=7, xytext=(0, 2), textcoords="offset points")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("summary", help="results/summary-<stamp>.json")
    parser.add_argument("--out", required=True, help="output prefix, e.g. docs/img/bench")
    args = parser.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    with open(args.summary) as f:
        summary = json.load(f)
    systems = systems_of(summary)
    stamp = args.summary.rsplit("summary-", 1)[-1].removesuffix(".json")

    fig, axes = plt.subplots(1, len(THROUGHPUT), figsize=(3.2 * len(THROUGHPUT), 3.6))
    for ax, (workload, title) in zip(axes, THROUGHPUT):
        ran = [s for s in systems if f"{s}/{workload}" in summary]
        bars(ax, ran, [stat(summary, s, workload, "jobs_per_s") for s in ran], title, "jobs/s")
    fig.suptitle(f"Throughput, median of repetitions with min-max (run {stamp}; higher is better)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(f"{args.out}-throughput.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 3.6))
    systems = [s for s in systems if f"{s}/W4" in summary]
    x = np.arange(len(systems))
    width = 0.26
    for i, p in enumerate(PERCENTILES):
        values = [stat(summary, s, "W4", f"latency_ms.{p}") for s in systems]
        ax.bar(x + (i - 1) * width, [v[0] if v else 0 for v in values], width,
               yerr=[[v[1] if v else 0 for v in values], [v[2] if v else 0 for v in values]],
               capsize=2, label=p)
    ax.set_xticks(x, systems)
    ax.set_ylabel("ms from producer COMMIT to handler start")
    ax.set_title(f"W4 pickup latency (run {stamp}; lower is better)", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(f"{args.out}-latency.png", dpi=110)
    plt.close(fig)
    print(f"wrote {args.out}-throughput.png and {args.out}-latency.png")


if __name__ == "__main__":
    main()
