"""The soak's PNG: rate, pickup latency, dead tuples and size over time
(scripts/soak.py; needs matplotlib)."""
from __future__ import annotations

from pathlib import Path

from soak_sampling import CLAIM_PATH_TABLES


def plot(rows, path: Path, rate: float, retention_s: float, p99_bar_ms: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [r["t"] for r in rows]
    fig, axes = plt.subplots(4, 1, figsize=(10, 12), sharex=True)
    axes[0].plot(t, [r["completed_per_s"] for r in rows], label="completed jobs/s")
    axes[0].axhline(rate, color="grey", linestyle="--", label="target rate")
    axes[0].set_ylabel("jobs/s")
    axes[0].legend(loc="lower right")
    axes[1].plot(t, [r["pickup_p50_ms"] for r in rows], label="pickup p50")
    axes[1].plot(t, [r["pickup_p99_ms"] for r in rows], label="pickup p99")
    axes[1].plot(t, [r["pickup_from_run_at_p99_ms"] for r in rows], linestyle=":",
                 label="p99 from run_at (incl. the producer's transaction)")
    axes[1].axhline(p99_bar_ms, color="grey", linestyle="--", label="p99 bar")
    # log scale: a start-up window in seconds must not flatten milliseconds
    axes[1].set_yscale("log")
    axes[1].set_ylabel("ms")
    axes[1].legend(loc="upper right")
    for table in CLAIM_PATH_TABLES:
        axes[2].plot(t, [r[f"{table}.dead_peak"] for r in rows], label=f"{table} dead tuples (peak)")
    axes[2].plot(t, [r.get("jobs_deferred.dead", 0) for r in rows], label="jobs_deferred dead tuples")
    axes[2].set_ylabel("dead tuples")
    axes[2].legend(loc="upper right")
    axes[3].plot(t, [r["total_bytes"] / 1e6 for r in rows], label="all awa tables + indexes")
    axes[3].plot(t, [sum(v for k, v in r.items() if k.startswith("jobs_done_") and k.endswith(".bytes")) / 1e6
                     for r in rows], label="terminal history (ring)")
    axes[3].axvline(retention_s, color="grey", linestyle=":", label="retention age")
    axes[3].set_ylabel("MB")
    axes[3].set_xlabel("seconds")
    axes[3].legend(loc="upper left")
    fig.suptitle("awa_pool soak")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
