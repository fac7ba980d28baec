"""PNG of one scale.py curve from its CSV, or of several CSVs of the same
curve overlaid (a before/after pair):

    python scripts/bench/scale_plot.py results/scale-history-<stamp>.csv --out-dir docs/img
    python scripts/bench/scale_plot.py before.csv after.csv --labels 'before,after' --out docs/img/x.png

Each panel shows the median of a point's measurements with min-max bars.
Needs matplotlib.
"""
from __future__ import annotations

import argparse
import csv
import os
import statistics
from typing import Dict, List, Optional, Tuple

READS = ["queue_stats", "list_jobs first page", "list_jobs deep page", "list_jobs state=failed", "get_job",
         "kind_stats", "kind_stats since 1h", "awa-pool queues", "awa-pool kinds",
         "awa-pool kinds --since 1h", "awa-pool jobs list", "awa-pool --version (no database)",
         "Prometheus scrape"]
DASHBOARD = ["dashboard " + page for page in (
    "overview", "overview fragment", "jobs, first page", "jobs, deep page", "jobs, state=failed",
    "jobs, kind=send_email", "job detail", "kinds, last hour", "kinds, last 24 h", "dead letters")]
# curve -> panels: (title, metrics, y label, log y)
PANELS: Dict[str, List[Tuple[str, List[str], str, bool]]] = {
    "backlog": [("drain rate", ["drain", "drain (batch <= 8)"], "jobs/s", False),
                ("CPU per no-op job", ["CPU per job, supervisor", "CPU per job, children",
                                       "CPU per job, postgres"], "µs", False),
                ("enqueue into the deep queue", ["enqueue 1/tx", "enqueue_many"], "jobs/s", True),
                ("pickup of a priority-1 job while draining",
                 ["pickup p50", "pickup p99", "pickup p50 (batch <= 8)", "pickup p99 (batch <= 8)"], "ms", True)],
    "history": [("operator reads: API, CLI, scrape", READS, "ms (log)", True),
                ("dashboard pages", DASHBOARD, "ms (log)", True),
                ("retention rotation", ["retention rotation"], "ms", False),
                ("enqueue and drain", ["enqueue 1/tx", "enqueue_many", "drain"], "jobs/s", True)],
    "scheduled": [("promotion", ["promotion, nothing draining", "promotion", "drain"], "jobs/s", False),
                  ("delays after the due time", ["due to all promoted", "due to last running"], "s", False)],
    "queues": [("weighted share (ideal 0.667)", ["share of weight-2 queues (ideal 0.667)"], "share", False),
               ("throughput", ["no-op drain", "20 ms jobs started"], "jobs/s", True),
               ("CPU per no-op job", ["CPU per job, supervisor", "CPU per job, children",
                                      "CPU per job, postgres"], "µs", False)],
    "payloads": [("throughput", ["jobs"], "jobs/s", True),
                 ("payload moved (args in + result out)", ["payload in and out"], "MB/s", False),
                 ("peak RSS", ["peak RSS supervisor", "peak RSS child (max)"], "MiB", False)],
    "supervisors": [("total drain rate", ["drain"], "jobs/s", False)],
    "live": [("reads that count live jobs", ["queue_stats", "queue_depth", "awa-pool queues",
                                              "dashboard overview", "Prometheus scrape"], "ms (log)", True),
             ("while two supervisors drain the backlog", ["queue_stats while draining",
                                                          "queue_depth while draining"], "ms (log)", True),
             ("finished_10s while draining: estimate / exact", ["finished_10s, estimate / exact"], "ratio",
              False),
             ("the leader's census", ["census"], "ms (log)", True)],
}
GOALS = {("backlog", "pickup p99"): 5.0, ("history", "queue_stats"): 100.0,
         ("history", "dashboard overview"): 100.0, ("live", "queue_stats"): 100.0,
         ("live", "dashboard overview"): 100.0}


def load(path: str) -> Tuple[str, Dict[str, str], Dict[Tuple[float, str], List[float]]]:
    info: Dict[str, str] = {}
    data: Dict[Tuple[float, str], List[float]] = {}
    curve = ""
    with open(path) as f:
        lines = []
        for line in f:
            if line.startswith("# "):
                key, _, value = line[2:].partition(": ")
                info[key] = value.strip()
            else:
                lines.append(line)
    for row in csv.DictReader(lines):
        curve = row["curve"]
        data.setdefault((float(row["point"]), row["metric"]), []).append(float(row["value"]))
    return curve, info, data


def plot(*paths: str, out_dir: Optional[str] = None, out: Optional[str] = None,
         labels: Optional[List[str]] = None) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    loaded = [load(p) for p in paths]
    curve, info, _ = loaded[0]
    panels = PANELS[curve]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.6 * len(panels), 4.6), squeeze=False)
    styles = ["-", "--", ":", "-."]
    colours = [plt.get_cmap("tab20")(k) for k in range(20)]
    for ax, (title, metrics, ylabel, logy) in zip(axes[0], panels):
        labelled = set()
        for i, (_, _, data) in enumerate(loaded):
            for j, metric in enumerate(metrics):   # one colour per metric, one line style per run
                points = sorted(p for p, m in data if m == metric)
                if not points:
                    continue
                med = [statistics.median(data[(p, metric)]) for p in points]
                lo = [m - min(data[(p, metric)]) for p, m in zip(points, med)]
                hi = [max(data[(p, metric)]) - m for p, m in zip(points, med)]
                ax.errorbar(points, med, yerr=[lo, hi], marker="o" if i == 0 else "s", capsize=3,
                            linestyle=styles[i % 4], color=colours[j % len(colours)], markersize=4,
                            label=None if metric in labelled else metric)
                labelled.add(metric)
        xs = sorted({p for _, _, d in loaded for p, m in d if m in metrics})
        positive = [x for x in xs if x > 0]
        if positive and positive[-1] / positive[0] >= 10:
            if xs[0] > 0:
                ax.set_xscale("log")
            else:  # a 0 point (no history): linear up to the first positive one
                ax.set_xscale("symlog", linthresh=positive[0])
        if logy:
            ax.set_yscale("log")
        for metric in metrics:
            goal = GOALS.get((curve, metric))
            if goal:
                ax.axhline(goal, color="tab:red", linewidth=0.8, linestyle=":")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(curve)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6 if len(metrics) > 4 else 8)
    runs = ""
    if labels:
        runs = "; " + ", ".join(f"{label}: {styles[i % 4]!r} line" for i, label in enumerate(labels))
    fig.suptitle(f"{curve}: median of measurements, min-max bars ({info.get('date', '?')}, "
                 f"{info.get('nproc', '?')} CPUs, {info.get('postgres', '?').split(',')[0]}){runs}",
                 fontsize=10)
    fig.tight_layout()
    if out is None:
        base = os.path.basename(paths[0]).rsplit(".", 1)[0]
        out = os.path.join(out_dir or os.path.dirname(paths[0]), base + ".png")
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", nargs="+")
    parser.add_argument("--labels", help="comma-separated, one per CSV")
    parser.add_argument("--out", help="the PNG's path")
    parser.add_argument("--out-dir", help="directory for <csv name>.png")
    args = parser.parse_args()
    labels = args.labels.split(",") if args.labels else None
    print(plot(*args.csv, out_dir=args.out_dir, out=args.out, labels=labels))


if __name__ == "__main__":
    main()
