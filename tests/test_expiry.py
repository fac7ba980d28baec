"""Expiry (SPEC §13): a job not started by its expires_at is cancelled by
the leader with reason "expired", counted in the metrics, and never runs;
the claim skips it even before the leader looks."""
from __future__ import annotations

from datetime import timedelta

import pytest

import awa_pool
from awa_pool import Job
from awa_pool.worker.maintenance import ExpireJobs
from cli_run import ok
from helpers import connection, count_lines, enqueue_jobs, query, record, scalar, wait_for
from test_metrics import port_of, scrape, value


def test_a_paused_queue_job_expires_unrun_and_a_live_one_runs(pools, dsn, auto) -> None:
    from apps import retrying  # noqa: F401  (soon_stale's task expires its jobs after 1 s)

    awa_pool.pause_queue(auto, "stale")
    stale, live = enqueue_jobs(dsn, [Job("soon_stale"), Job("fresh", expires_in=600)])
    assert record(dsn, stale).expires_at is not None
    proc = pools.start("--queue", "stale", "--metrics-port", "0", app="apps.retrying", workers=2)
    wait_for(lambda: record(dsn, stale).state == "cancelled", timeout=30, message="the stale job to expire")
    job = record(dsn, stale)
    assert job.attempt == 0 and job.errors[-1]["error"] == "expired" and job.errors[-1]["kind"] == "cancel"
    assert record(dsn, live).state == "available"  # paused: waiting, not expired

    awa_pool.resume_queue(auto, "stale")
    wait_for(lambda: record(dsn, live).state == "completed", timeout=30, message="the live job to run")
    assert count_lines(pools.log_dir, "soon_stale") == 0 and count_lines(pools.log_dir, "fresh") == 1
    port = port_of(proc.log_path)
    assert value(scrape(port), "awa_jobs_expired_total", queue="stale", kind="soon_stale") == 1


def test_the_claim_never_hands_out_an_expired_job(dsn) -> None:
    """Between two passes of the leader an expired job is still available,
    but no claim takes it; a live one in the same queue is claimed."""
    expired = scalar(dsn, "SELECT awa.insert_job('x', queue => 'q', expires_at => now() - interval '1 s')")
    live = scalar(dsn, "SELECT awa.insert_job('x', queue => 'q', expires_at => now() + interval '1 h')")
    plain = scalar(dsn, "SELECT awa.insert_job('x', queue => 'q')")
    claimed = [row[0] for row in query(dsn, "SELECT id FROM awa.claim('q', 10, 1)")]
    assert sorted(claimed) == sorted([live, plain])
    assert record(dsn, expired).state == "available"


def test_the_leader_cancels_expired_jobs_in_every_waiting_state_and_no_running_one(dsn) -> None:
    for state_sql in (
            "SELECT awa.insert_job('w', queue => 'a', expires_at => now())",                       # available
            "SELECT awa.insert_job('w', queue => 'a', run_at => now() + interval '1 h', "
            "expires_at => now())"):                                                             # scheduled
        scalar(dsn, state_sql)
    retryable = scalar(dsn, "SELECT awa.insert_job('w', queue => 'r', expires_at => now() + interval '1 h')")
    [(lease,)] = query(dsn, "SELECT lease FROM awa.claim('r', 1, 1)")
    assert scalar(dsn, "SELECT awa.finish_attempt(%s, %s, 'failed', 'boom')::text", (retryable, lease)) == "retryable"
    running = scalar(dsn, "SELECT awa.insert_job('w', queue => 'run', expires_at => now() + interval '1 h')")
    query(dsn, "SELECT id FROM awa.claim('run', 1, 1)")
    query(dsn, "UPDATE awa.jobs_deferred SET expires_at = now() - interval '1 s'")
    query(dsn, "UPDATE awa.jobs_hot SET expires_at = now() - interval '1 s' WHERE id = %s", (running,))

    service = ExpireJobs()
    with connection(dsn, autocommit=True) as conn, conn.cursor() as cur:
        assert service.tick(cur) == 3
        assert service.tick(cur) == 0
    assert service.expired == {("a", "w"): 2, ("r", "w"): 1}
    assert dict(query(dsn, "SELECT state::text, count(*) FROM awa.jobs GROUP BY 1")) == {"cancelled": 3,
                                                                                         "running": 1}
    assert record(dsn, retryable).errors[-1]["error"] == "expired"
    assert len(record(dsn, retryable).attempts) == 1  # its one attempt is still on record


def test_every_enqueue_path_stores_the_expiry_on_the_database_clock(conn, dsn) -> None:
    ids = [awa_pool.enqueue(conn, Job("e", expires_in=30)),
           awa_pool.enqueue(conn, Job("e", expires_in=timedelta(seconds=30), delay=5))]
    ids += awa_pool.enqueue_many(conn, [Job("e", {"i": i}, expires_in=30) for i in range(3)])     # uniform
    ids += awa_pool.enqueue_many(conn, [Job("e", {"i": i}, expires_in=30, tags=[str(i)]) for i in range(3)])
    ids += awa_pool.enqueue_many(conn, [Job("e", {"i": i}, expires_in=30, delay=i + 1) for i in range(3)])
    conn.commit()
    lifetimes = [s for (s,) in query(dsn, "SELECT extract(epoch FROM expires_at - created_at)::float8 "
                                          "FROM awa.jobs WHERE id = ANY(%s)", (ids,))]
    assert len(lifetimes) == len(ids) and all(abs(s - 30) < 0.01 for s in lifetimes), lifetimes


def test_an_operator_retry_runs_an_expired_job(dsn, auto) -> None:
    job_id = scalar(dsn, "SELECT awa.insert_job('x', queue => 'q', expires_at => now())")
    with connection(dsn, autocommit=True) as conn, conn.cursor() as cur:
        ExpireJobs().tick(cur)
    assert record(dsn, job_id).state == "cancelled"
    awa_pool.retry_job(auto, job_id)
    assert record(dsn, job_id).state == "available" and record(dsn, job_id).expires_at is None
    assert [row[0] for row in query(dsn, "SELECT id FROM awa.claim('q', 10, 1)")] == [job_id]


@pytest.mark.parametrize("make, message", [
    (lambda: Job("k", expires_in=-1), "expires_in must be > 0 seconds, got -1"),
    (lambda: Job("k", expires_in=0), "expires_in must be > 0 seconds, got 0"),
    (lambda: Job("k", expires_in="1h"), "expires_in must be seconds (int or float) or a timedelta, not str"),
    (lambda: Job("k", expires_in=5, delay=10), "the job would expire (expires_in=5s) before it is due (delay=10s)"),
    (lambda: awa_pool.task("bad_expiry", expires_in=-5), "task expires_in must be > 0 seconds, got -5"),
])
def test_a_bad_expiry_is_a_one_line_error_at_declaration(make, message) -> None:
    with pytest.raises((TypeError, ValueError)) as raised:
        make()
    assert str(raised.value) == message


def test_the_cli_enqueues_with_an_expiry(dsn, tmp_path) -> None:
    one = int(ok("enqueue", "k", "--expires-in", "5m", "--database-url", dsn))
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text('{"kind": "k", "expires_in": 30}\n{"kind": "k", "expires_in": "2h"}\n{"kind": "k"}\n')
    ok("enqueue", "--file", str(jobs), "--expires-in", "10s", "--database-url", dsn)
    lifetimes = [s for (s,) in query(dsn, "SELECT extract(epoch FROM expires_at - created_at)::float8 "
                                          "FROM awa.jobs ORDER BY id")]
    assert [round(s) for s in lifetimes] == [300, 30, 7200, 10]
    assert record(dsn, one).expires_at is not None
