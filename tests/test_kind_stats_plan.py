"""`awa-pool kinds` right after a burst (issue 41's defect): the plan of
awa.kind_stats must not depend on statistics ANALYZE has not gathered yet.

After 300,000 jobs drained, the planner took a kind's rows in the history
for a few hundred (no statistics on the new rows), read all 150,000 of them
with a bitmap scan and sorted them to keep the latest 1,000, and scanned
the hot table the burst had left large for live jobs' earlier attempts:
180 ms. The shape checked here is the one that costs the same whatever the
statistics say: each kind's latest jobs read backwards from the (kind,
finalized_at) index, no sort above a history scan, and no sequential or
bitmap scan of a job table. Wall time is measured by scripts/cli_reads.py,
not here.
"""
from __future__ import annotations

import json
from typing import Any, Dict, Iterator, List

from helpers import connection, query

HISTORY_ROWS = 30_000


def _nodes(plan: Dict[str, Any]) -> Iterator[Dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def _kind_stats_plan(dsn: str) -> Dict[str, Any]:
    """The plan kind_stats' query ran with, as auto_explain logged it."""
    with connection(dsn, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("LOAD 'auto_explain'")
        for setting in ("auto_explain.log_min_duration = 0", "auto_explain.log_nested_statements = on",
                        "auto_explain.log_format = json", "auto_explain.log_level = notice",
                        "client_min_messages = notice"):
            cur.execute(f"SET {setting}")
        cur.execute("SELECT kind, runs, sampled FROM awa.kind_stats(NULL, NULL, 1000)")
        rows = cur.fetchall()
        notices = list(conn.notices)
    assert sorted(rows) == [("a", HISTORY_ROWS // 2, 1000), ("b", HISTORY_ROWS // 2, 1000)], rows
    plans: List[Dict[str, Any]] = []
    for notice in notices:
        text = notice.split("plan:", 1)[1] if "plan:" in notice else None
        if text:
            plans.append(json.loads(text))
    [plan] = [p for p in plans if "WITH live AS" in p["Query Text"]]
    return plan["Plan"]


def test_kind_stats_reads_the_latest_jobs_in_index_order_without_statistics(dsn) -> None:
    # A burst just drained: history rows no ANALYZE has seen, and a hot
    # table whose pages the burst grew (its rows are gone, its size is not).
    for table in ["jobs_hot", "jobs_deferred"] + [f"jobs_done_{n}" for n in range(8)]:
        query(dsn, f"ALTER TABLE awa.{table} SET (autovacuum_enabled = false)")
    query(dsn, "INSERT INTO awa.jobs_hot (kind, args) SELECT 'burst', jsonb_build_object('i', i) "
               "FROM generate_series(1, %s) i", (HISTORY_ROWS,))
    query(dsn, "DELETE FROM awa.jobs_hot")
    query(dsn, """INSERT INTO awa.jobs_done (kind, state, attempt, attempted_at, finalized_at, wall_s, cpu_s,
                                             peak_rss, segment)
                  SELECT CASE WHEN i %% 2 = 0 THEN 'a' ELSE 'b' END, 'completed', 1,
                         now() - make_interval(secs => i), now() - make_interval(secs => i), 0.01, 0.01,
                         1000000, 0
                    FROM generate_series(1, %s) i""", (HISTORY_ROWS,))
    assert query(dsn, "SELECT count(*) FROM pg_stat_user_tables WHERE schemaname = 'awa' "
                      "AND relname LIKE 'jobs_done_%%' AND last_analyze IS NULL "
                      "AND last_autoanalyze IS NULL") == [(8,)]

    plan = _kind_stats_plan(dsn)
    nodes = list(_nodes(plan))
    job_tables = {"jobs_hot", "jobs_deferred"} | {f"jobs_done_{n}" for n in range(8)}
    scans = [(node["Node Type"], node.get("Relation Name"), node.get("Index Name"), node.get("Scan Direction"))
             for node in nodes if node.get("Relation Name") in job_tables]
    assert scans, json.dumps(plan, indent=1)
    for kind, relation, index, direction in scans:
        if relation.startswith("jobs_done_"):
            assert (kind, index, direction) == ("Index Scan", f"{relation}_kind_finalized_at_idx",
                                                "Backward"), scans
        else:  # live jobs' earlier attempts: the partial index of the rows that have any
            assert kind in ("Index Scan", "Bitmap Heap Scan"), scans
    used = {node.get("Index Name") for node in nodes if node["Node Type"] in ("Index Scan", "Bitmap Index Scan")}
    assert {"jobs_hot_retried", "jobs_deferred_retried"} <= used, used
    sorts_over_history = [node for node in nodes if node["Node Type"] == "Sort" and any(
        child.get("Relation Name", "").startswith("jobs_done_") for child in _nodes(node))]
    assert sorts_over_history == [], json.dumps(sorts_over_history, indent=1)
