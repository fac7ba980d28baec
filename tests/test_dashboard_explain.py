"""The dashboard's list queries read the big tables through indexes only.

The database gets history in the shape scripts/dashboard_speed.py writes
(smaller: 60,000 terminal jobs and 6,000 queued, analyzed), then every
query a page runs is EXPLAINed with the parameters the page would pass; no
plan may scan a terminal-history partition sequentially, and the jobs list
may not scan the live tables sequentially either. scripts/dashboard_speed.py
measures the pages themselves on a million rows (docs/dashboard.md)."""
from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List

import psycopg2
import pytest

from awa_pool.dashboard import kinds, reads
from awa_pool.core.sql import QUERIES

ROOT = Path(__file__).resolve().parent.parent
HISTORY, QUEUED = 60_000, 6_000


def _speed_script() -> Any:
    spec = importlib.util.spec_from_file_location("dashboard_speed", ROOT / "scripts" / "dashboard_speed.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def big(dsn: str) -> Iterator[Dict[str, Any]]:
    ids = _speed_script().fill(dsn, HISTORY, QUEUED, say=lambda _: None)
    conn = psycopg2.connect(dsn)
    try:
        yield {"conn": conn, **ids}
    finally:
        conn.close()


def _scans(plan: Dict[str, Any]) -> Iterator[Dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _scans(child)


def seq_scanned(conn: Any, name: str, params: Dict[str, Any]) -> List[str]:
    with conn.cursor() as cur:
        cur.execute(QUERIES["dash_session_setup"])  # as every dashboard connection is set up
        cur.execute("EXPLAIN (FORMAT JSON) " + cur.mogrify(QUERIES[name], params).decode())
        plan = cur.fetchone()[0]
        conn.rollback()
    if isinstance(plan, str):
        plan = json.loads(plan)
    return sorted({node.get("Relation Name", "?") for node in _scans(plan[0]["Plan"])
                   if node["Node Type"] == "Seq Scan"})


JOB_FILTERS = [
    {}, {"state": "failed"}, {"state": "completed"}, {"state": "cancelled"}, {"state": "running"},
    {"state": "available"}, {"state": "scheduled"}, {"queue": "mail"}, {"kind": "reindex"},
    {"kind": "render_tile"}, {"tag": "urgent"}, {"older_than": "12h"}, {"newer_than": "5m"},
    {"state": "failed", "queue": "render", "kind": "render_tile"},
]


@pytest.mark.parametrize("deep", [False, True], ids=["first page", "deep page"])
def test_the_jobs_list_never_scans_a_jobs_table_sequentially(big, deep):
    conn = big["conn"]
    queues = ["default", "mail", "render"]
    for args in JOB_FILTERS:
        if deep:
            args = dict(args, before=str((big["low"] + big["high"]) // 2))
        filt = reads.JobFilter.from_args(args)
        with conn.cursor() as cur:
            params = reads.jobs_page_params(cur, filt, queues, reads.PAGE_SIZE)
        scanned = seq_scanned(conn, "dash_jobs_page", params)
        assert not [table for table in scanned if table.startswith("jobs_done")], args
        if args.get("kind") == "reindex":
            # A kind with no live job at all: the live tables have no kind
            # index (it would cost every enqueue and claim), so the planner
            # may read them whole; dashboard_speed.py times that page.
            continue
        assert scanned == [], args


def test_overview_kinds_dlq_and_job_queries_never_scan_history_sequentially(big):
    conn = big["conn"]
    checks = [
        ("dash_throughput", {"queues": ["default", "mail", "render"], "since": time.time() - 3600}),
        ("dash_dlq_page", {"queue": None, "kind": None, "before": None, "limit": 51}),
        ("dash_dlq_count", {"queue": "mail", "kind": None}),
        ("dash_batch_members", {"batch_id": 1, "limit": 100}),
        ("dash_job_extra", {"id": big["failed"]}),
        ("get_job", {"id": big["failed"]}),
        ("queue_stats", {}),
    ]
    now = time.time()
    for window in (3600.0, 86400.0):
        width = window / kinds.KIND_BUCKETS
        since = (now // width - kinds.KIND_BUCKETS + 1) * width
        checks += [
            ("dash_kind_counts", {"since": since, "width_s": width}),
            ("dash_kind_samples", {"kind": "render_tile", "since": since, "width_s": width,
                                   "slices": kinds.KIND_BUCKETS, "sample": kinds.KIND_SAMPLE}),
        ]
    for name, params in checks:
        history = [table for table in seq_scanned(conn, name, params) if table.startswith("jobs_done")]
        assert history == [], f"{name} scans {history} sequentially"


def test_an_age_filter_lists_the_same_jobs_as_the_plain_filter(big):
    """The id range an age filter adds is an optimisation: same rows."""
    conn = big["conn"]
    for args in ({"older_than": "12h"}, {"newer_than": "3h"}, {"older_than": "23h"}, {"newer_than": "1s"}):
        filt = reads.JobFilter.from_args(args)
        with conn.cursor() as cur:
            fast = reads.jobs_page_params(cur, filt, [], 500)
            cur.execute(QUERIES["dash_jobs_page"], fast)
            listed = [row[0] for row in cur.fetchall()]
            cur.execute(QUERIES["dash_jobs_page"], dict(fast, id_below=None, id_from=None))
            plain = [row[0] for row in cur.fetchall()]
        conn.rollback()
        assert listed == plain, args
