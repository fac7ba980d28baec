#!/usr/bin/env python3
"""Markdown detail tables from a run's summary JSON (stdlib only).

    python report.py results/summary-<stamp>.json [more summaries ...]
    python report.py --runs results/raw-<stamp>.jsonl     # every run, with the load it saw

Several summaries (e.g. a main run and a later awa_pool run) are merged; for a
(system, workload) present in more than one, the later file wins.
"""
import json
import sys

from run import HEAD, cell, label, limit_lines  # noqa: E402


def fmt(e, m, spec="{:.0f}"):
    if not e or m not in e:
        return "–"
    d = e[m]
    return f"{spec.format(d['median'])} ({spec.format(d['min'])}–{spec.format(d['max'])})"


def main(paths):
    summary = {}
    for p in paths:
        with open(p) as f:
            s = json.load(f)
        s.pop("_meta", None)
        summary.update(s)
    systems, workloads = [], []
    for k in summary:
        s, w = k.split("/")
        if s not in systems:
            systems.append(s)
        if w not in workloads:
            workloads.append(w)
    order = ["W1a", "W1b", "W2", "W3", "W4", "W5", "W6"]
    workloads = [w for w in order if w in workloads]
    names = {s: label(summary, s) for s in systems}

    print("### Headline (median of repetitions)\n")
    print("| system | version | " + " | ".join(HEAD[w] for w in workloads) + " |")
    print("|---|---|" + "---|" * len(workloads))
    for s in systems:
        name, ver = names[s]
        print(f"| {name} | {ver} | " + " | ".join(cell(summary.get(f"{s}/{w}"), w) for w in workloads) + " |")
    extra = limit_lines(summary, systems)
    if extra:
        print("\n" + "\n".join(f"* {line}" for line in extra))

    print("\n### Detail: median (min–max) over repetitions; ok = runs that passed exactly-once + DB checks\n")
    print("| system | workload | N | ok | jobs/s | other |")
    print("|---|---|---|---|---|---|")
    for w in workloads:
        for s in systems:
            e = summary.get(f"{s}/{w}")
            if not e:
                continue
            other = ""
            if w == "W2":
                other = (f"incl. startup {fmt(e, 'jobs_per_s_incl_startup')}/s; "
                         f"startup {fmt(e, 'startup_s', '{:.2f}')} s")
            elif w == "W3":
                other = (f"×ideal {fmt(e, 'ideal_ratio', '{:.2f}')}; ×bare {fmt(e, 'bare_ratio', '{:.2f}')} "
                         f"(bare {fmt(e, 'bare_jobs_per_s', '{:.1f}')}/s); busy {fmt(e, 'busy_ratio', '{:.2f}')}; "
                         f"in-run job {fmt(e, 'mean_job_ms', '{:.1f}')} ms")
            elif w == "W4":
                other = (f"p50 {fmt(e, 'latency_ms.p50', '{:.1f}')}, p95 {fmt(e, 'latency_ms.p95', '{:.1f}')}, "
                         f"p99 {fmt(e, 'latency_ms.p99', '{:.1f}')}, max {fmt(e, 'latency_ms.max', '{:.1f}')} ms")
            elif w == "W5":
                other = f"hi share {fmt(e, 'hi_share', '{:.3f}')}"
            elif w == "W6":
                other = (f"×bare {fmt(e, 'bare_ratio', '{:.3f}')} (bare {fmt(e, 'bare_jobs_per_s', '{:.1f}')}/s); "
                         f"busy {fmt(e, 'busy_ratio', '{:.2f}')}; in-run job {fmt(e, 'mean_job_ms', '{:.0f}')} ms; "
                         f"startup {fmt(e, 'startup_s', '{:.2f}')} s")
            if e.get("duplicates_total") or e.get("missing_total"):
                other += f"; DUPLICATES {e['duplicates_total']} MISSING {e['missing_total']}"
            if e.get("errors"):
                other += "; errors: " + "; ".join(x[:80] for x in e["errors"])
            jps = fmt(e, "jobs_per_s", "{:.1f}" if w in ("W3", "W6") else "{:.0f}") if w != "W4" else "–"
            print(f"| {names[s][0]} | {w} | {e.get('n')} | {e['ok_runs']}/{e['runs']} | {jps} | {other} |")

    print("\n### Worker configuration used\n")
    print("| system | workload | worker_config |")
    print("|---|---|---|")
    for s in systems:
        for w in workloads:
            e = summary.get(f"{s}/{w}")
            if e and w not in ("W1a", "W1b"):
                print(f"| {s} | {w} | `{json.dumps(e.get('worker_config'))}` |")


def runs(path):
    """One line per driver run of a raw-*.jsonl: headline, verification, load."""
    from run import headline
    print("| rep | workload | system | result | exactly-once | loadavg (1 min) at start |")
    print("|---|---|---|---|---|---|")
    with open(path) as f:
        rows = [json.loads(line) for line in f]
    rows = [r for r in rows if "system" in r]
    order = ["W1a", "W1b", "W2", "W3", "W4", "W5", "W6"]
    rows.sort(key=lambda r: (order.index(r["workload"]) if r["workload"] in order else 9, r["rep"]))
    for r in rows:
        v = r.get("verify") or {}
        if "duplicates" not in v:  # W1: the DB holds exactly N queued jobs
            once = "n/a (queued ok)" if v.get("ok") else "FAIL"
        else:
            once = "ok" if v.get("ok") else f"FAIL: dup {v.get('duplicates')} miss {v.get('missing')}"
        load = r.get("loadavg_at_start")
        load = f"{load[0]:.1f}" if load else "?"
        print(f"| {r['rep']} | {r['workload']} | {r['system']} | {headline(r)} | {once} | {load} |")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--runs"]:
        for raw in sys.argv[2:]:
            runs(raw)
    else:
        main(sys.argv[1:])
