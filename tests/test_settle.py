"""awa.settle_jobs: one flush of non-success outcomes, settled in one call.

Every outcome the supervisor sends through it in one flush must land where
its new state belongs, a stale lease must change nothing, and jobs_done's
statement triggers (batch fan-in) must count every member the flush ends.
"""
from __future__ import annotations

import json
import select
from typing import Dict, List

import psycopg2
import pytest

import awa_pool
from awa_pool import Job
from helpers import job_row, query, scalar, wait_for

pytestmark = pytest.mark.embedded_smoke  # the set-based statements must plan on PostgreSQL 18 too


def claim_all(dsn: str, queue: str, count: int) -> Dict[int, int]:
    """Claim like supervisor 1: {id: lease}."""
    rows = query(dsn, "SELECT id, lease FROM awa.claim(%s, %s, 1)", (queue, count))
    assert len(rows) == count
    return dict(rows)


def settle(dsn: str, outcomes: List[dict]) -> Dict[int, str]:
    rows = query(dsn, "SELECT job_id, new_state::text FROM awa.settle_jobs(%s::jsonb)",
                 (json.dumps(outcomes),))
    settled = dict(rows)
    assert len(settled) == len(rows), "a job settled twice"
    return settled


def table_of(dsn: str, job_id: int) -> str:
    return scalar(dsn, "SELECT t FROM (SELECT 'hot' AS t FROM awa.jobs_hot WHERE id = %(id)s "
                       "UNION ALL SELECT 'deferred' FROM awa.jobs_deferred WHERE id = %(id)s "
                       "UNION ALL SELECT 'done' FROM awa.jobs_done WHERE id = %(id)s) x", {"id": job_id})


def test_one_flush_of_mixed_outcomes_lands_each_job_where_its_state_belongs(dsn: str) -> None:
    listener = psycopg2.connect(dsn)
    listener.autocommit = True
    with listener.cursor() as cur:
        cur.execute("LISTEN awa_jobs")
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    ids = awa_pool.enqueue_many(conn, [Job("k", queue="mix") for _ in range(7)]
                                + [Job("k", queue="mix", max_attempts=1)])
    leases = claim_all(dsn, "mix", len(ids))
    retry_later, retry_now, fatal, cancel, snooze, wait, stale, last_attempt = ids
    outcomes = [
        {"id": retry_later, "outcome": "retry", "delay_s": 3600, "error": "try later"},
        {"id": retry_now, "outcome": "retry", "delay_s": 0, "error": "try again"},
        {"id": fatal, "outcome": "fatal", "error": "bad args", "wall_s": 0.5, "cpu_s": 0.25},
        {"id": cancel, "outcome": "cancel"},
        {"id": snooze, "outcome": "snooze", "delay_s": 60},
        {"id": wait, "outcome": "wait"},
        {"id": last_attempt, "outcome": "failed", "error": "boom", "traceback": "Traceback ..."},
    ]
    for outcome in outcomes:
        outcome["lease"] = leases[outcome["id"]]
    before_stale = job_row(dsn, stale)
    outcomes.append({"id": stale, "lease": leases[stale] - 1, "outcome": "failed", "error": "late"})

    assert settle(dsn, outcomes) == {
        retry_later: "retryable", retry_now: "available", fatal: "failed", cancel: "cancelled",
        snooze: "scheduled", wait: "waiting_external", last_attempt: "failed"}

    expected_table = {retry_later: "deferred", retry_now: "hot", fatal: "done", cancel: "done",
                      snooze: "deferred", wait: "deferred", last_attempt: "done", stale: "hot"}
    assert {job_id: table_of(dsn, job_id) for job_id in ids} == expected_table
    assert job_row(dsn, stale) == before_stale, "a stale lease changed its job"
    later = awa_pool.get_job(conn, retry_later)
    assert later.errors[-1]["error"] == "try later" and later.attempts[-1]["outcome"] == "retry"
    assert job_row(dsn, snooze)["attempt"] == 0, "a snooze does not use up an attempt"
    failed = awa_pool.get_job(conn, fatal)
    assert failed.errors[-1]["error"] == "bad args" and failed.finalized_at is not None
    assert job_row(dsn, fatal)["wall_s"] == pytest.approx(0.5)
    assert awa_pool.get_job(conn, last_attempt).errors[-1]["traceback"] == "Traceback ..."

    def woken() -> set:
        select.select([listener], [], [], 0.1)
        listener.poll()
        return {n.payload for n in listener.notifies}

    try:
        wait_for(lambda: "mix" in woken(), timeout=5, message="NOTIFY for the queue a job went back to")
    finally:
        listener.close()
        conn.close()
    # the same lease again settles nothing twice
    assert settle(dsn, outcomes) == {}


def test_a_flush_that_ends_several_members_of_a_batch_counts_each_and_releases_the_follow_up(
        dsn: str) -> None:
    conn = psycopg2.connect(dsn)
    with conn:
        batch = awa_pool.enqueue_batch(conn, [Job("k", queue="fan") for _ in range(3)],
                                       then=Job("after", queue="next"))
    conn.close()
    leases = claim_all(dsn, "fan", 3)
    first, second, third = batch.ids
    assert settle(dsn, [{"id": first, "lease": leases[first], "outcome": "fatal", "error": "x"},
                        {"id": second, "lease": leases[second], "outcome": "cancel"}]) == {
        first: "failed", second: "cancelled"}
    assert scalar(dsn, "SELECT remaining FROM awa.batches WHERE id = %s", (batch.id,)) == 1
    assert job_row(dsn, batch.then_id)["state"] != "available"
    assert settle(dsn, [{"id": third, "lease": leases[third], "outcome": "fatal", "error": "y"}]) == {
        third: "failed"}
    assert scalar(dsn, "SELECT remaining FROM awa.batches WHERE id = %s", (batch.id,)) == 0
    assert job_row(dsn, batch.then_id)["state"] == "available"


def test_an_empty_flush_and_a_flush_of_only_stale_leases_change_nothing(dsn: str) -> None:
    assert settle(dsn, []) == {}
    conn = psycopg2.connect(dsn)
    with conn:
        job_id = awa_pool.enqueue(conn, Job("k", queue="stale"))
    conn.close()
    lease = claim_all(dsn, "stale", 1)[job_id]
    before = job_row(dsn, job_id)
    assert settle(dsn, [{"id": job_id, "lease": lease + 1, "outcome": "failed"}]) == {}
    assert job_row(dsn, job_id) == before
