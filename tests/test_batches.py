"""Batches and waiting (SPEC §1 "Batches: fan-out and fan-in"): the
follow-up becomes available exactly once after every member is terminal,
even when members finish together on different supervisors; it reads the
members' records in input order; wait() wakes on NOTIFY and times out
cleanly."""
from __future__ import annotations

import threading
import time

import psycopg2
import psycopg2.extensions
import pytest

import awa_pool
from awa_pool import Job, Unique
from feature_helpers import APP, connection, enqueue_jobs, get, open_gate, wait_state
from helpers import count_lines, exec_records, query, scalar, start_idle_supervisors, wait_for


def _enqueue_batch(dsn, jobs, then=None):
    with connection(dsn) as conn:
        batch = awa_pool.enqueue_batch(conn, jobs, then=then)
        conn.commit()
    return batch


def _follow_up_runs(log_dir, then_id):
    return sum(1 for r in exec_records(log_dir) if r[0] == "reduce" and r[1] == then_id)


def test_a_batch_of_200_across_3_supervisors_fires_its_follow_up_exactly_once(dsn, pools):
    start_idle_supervisors(pools, 3, app=APP)
    failing = {7, 57, 107, 157}
    parked = {20, 120}  # in a queue nobody serves: cancelled below
    members = [Job("member", {"i": i, "fail": i in failing, "jitter_ms": 20}, max_attempts=1,
                   queue="parked" if i in parked else "default") for i in range(200)]
    batch = _enqueue_batch(dsn, members, then=Job("reduce"))
    assert len(batch.ids) == 200 and list(batch.ids) == sorted(batch.ids)

    wait_for(lambda: scalar(dsn, "SELECT count(*) FROM awa.jobs WHERE batch_id = %s AND state IN"
                                 " ('completed', 'failed')", (batch.id,)) == 198, timeout=60,
             message="the 198 runnable members to finish")
    assert get(dsn, batch.then_id).state == "scheduled"  # held: two members are not terminal yet
    for i in sorted(parked):
        with connection(dsn) as conn:
            assert awa_pool.cancel_job(conn, batch.ids[i]) == "cancelled"
            conn.commit()

    record = wait_state(dsn, batch.then_id, "completed", timeout=30)
    assert record.attempt == 1
    assert record.result["ids"] == list(batch.ids)  # the members' records, in input order
    expected_states = ["cancelled" if i in parked else "failed" if i in failing else "completed"
                       for i in range(200)]
    assert record.result["states"] == expected_states
    assert record.result["results"] == [
        {"i": i, "square": i * i} if state == "completed" else None
        for i, state in zip(range(200), expected_states)]
    assert record.result["errors"] == [1 if state != "completed" else 0 for state in expected_states]

    # exactly once: one run, one release, and only after the last member
    assert _follow_up_runs(pools.log_dir, batch.then_id) == 1
    assert scalar(dsn, "SELECT remaining FROM awa.batches WHERE id = %s", (batch.id,)) == 0
    last_member = scalar(dsn, "SELECT max(finalized_at) FROM awa.jobs WHERE batch_id = %s", (batch.id,))
    assert record.attempted_at >= last_member
    assert scalar(dsn, "SELECT count(DISTINCT supervisor_id) FROM awa.jobs WHERE batch_id = %s"
                       " AND state <> 'cancelled'", (batch.id,)) == 3


def test_members_finishing_at_the_same_instant_on_different_supervisors(dsn, pools):
    """Six members hold all six children of three supervisors, then finish
    together when the test opens their gate; again and again."""
    start_idle_supervisors(pools, 3, "--queue", "default", "--queue", "fanin", app=APP)
    rounds = 8
    spread = []
    for n in range(rounds):
        batch = _enqueue_batch(dsn, [Job("member", {"i": i, "gate": f"round{n}"}, queue="fanin")
                                     for i in range(6)], then=Job("reduce"))
        wait_for(lambda: scalar(dsn, "SELECT count(*) FROM awa.jobs_hot WHERE batch_id = %s"
                                     " AND state = 'running'", (batch.id,)) == 6,
                 timeout=20, message=f"round {n}: six members running")
        spread.append(scalar(dsn, "SELECT count(DISTINCT supervisor_id) FROM awa.jobs_hot"
                                  " WHERE batch_id = %s", (batch.id,)))
        open_gate(pools.log_dir, f"round{n}")
        record = wait_state(dsn, batch.then_id, "completed", timeout=20)
        assert record.result["states"] == ["completed"] * 6
        assert record.result["ids"] == list(batch.ids)
        wait_for(lambda: _follow_up_runs(pools.log_dir, batch.then_id) == 1, message="the reduce record")
    assert all(s >= 2 for s in spread) and max(spread) == 3, spread
    assert count_lines(pools.log_dir, "reduce") == rounds  # no follow-up ever fired twice
    assert scalar(dsn, "SELECT count(*) FROM awa.batches WHERE remaining <> 0 OR done_at IS NULL") == 0


def test_a_member_retried_while_its_batch_is_pending_counts_again(dsn, pools):
    parked, failing = 0, 1
    batch = _enqueue_batch(dsn, [Job("member", {"i": 0}, queue="parked"),
                                 Job("member", {"i": 1, "fail": True}, max_attempts=1)], then=Job("reduce"))
    pools.start(app=APP, workers=2)
    wait_state(dsn, batch.ids[failing], "failed")
    with connection(dsn) as conn:
        # a held follow-up stays held (and is not lost) when someone retries it
        assert awa_pool.retry_job(conn, batch.then_id) == "scheduled"
        assert awa_pool.retry_job(conn, batch.ids[failing]) == "available"
        conn.commit()
    wait_for(lambda: sum(1 for r in exec_records(pools.log_dir)
                         if r[0] == "member" and r[1] == batch.ids[failing]) == 2, message="the retried run")
    wait_state(dsn, batch.ids[failing], "failed")
    assert get(dsn, batch.then_id).state == "scheduled"
    assert scalar(dsn, "SELECT remaining FROM awa.batches WHERE id = %s", (batch.id,)) == 1

    with connection(dsn) as conn:
        awa_pool.cancel_job(conn, batch.ids[parked])
        conn.commit()
    record = wait_state(dsn, batch.then_id, "completed")
    assert record.result["states"] == ["cancelled", "failed"]
    assert record.result["errors"] == [1, 2]
    assert _follow_up_runs(pools.log_dir, batch.then_id) == 1


def test_a_cancelled_follow_up_is_not_released_and_can_be_retried(dsn, pools):
    batch = _enqueue_batch(dsn, [Job("member", {"i": i}, queue="parked") for i in range(2)],
                           then=Job("reduce"))
    with connection(dsn) as conn:
        assert awa_pool.cancel_job(conn, batch.then_id) == "cancelled"
        for job_id in batch.ids:
            awa_pool.cancel_job(conn, job_id)
        conn.commit()
    pools.start(app=APP, workers=1)
    tick = enqueue_jobs(dsn, Job("tick"))[0]
    wait_state(dsn, tick, "completed")
    assert get(dsn, batch.then_id).state == "cancelled"  # the batch finishing did not revive it

    with connection(dsn) as conn:
        assert awa_pool.retry_job(conn, batch.then_id) == "available"  # its batch is done: runs now
        conn.commit()
    record = wait_state(dsn, batch.then_id, "completed")
    assert record.result["states"] == ["cancelled", "cancelled"]
    assert _follow_up_runs(pools.log_dir, batch.then_id) == 1


def test_batch_shapes_and_misuse(dsn, pools):
    empty = _enqueue_batch(dsn, [], then=Job("reduce"))
    assert empty.ids == () and get(dsn, empty.then_id).state == "available"  # nothing to wait for
    plain = _enqueue_batch(dsn, [Job("tick", {"n": n}) for n in range(3)])
    assert plain.then_id is None and len(plain.ids) == 3
    not_follow_up = enqueue_jobs(dsn, Job("reduce", max_attempts=1))[0]
    with connection(dsn) as conn:
        with pytest.raises(ValueError, match="unique"):
            awa_pool.enqueue_batch(conn, [Job("tick", unique=Unique())])
        with pytest.raises(TypeError):
            awa_pool.enqueue_batch(conn, ["tick"])
    pools.start(app=APP, workers=1)
    assert wait_state(dsn, empty.then_id, "completed").result["ids"] == []
    record = wait_state(dsn, not_follow_up, "failed")
    assert "only available in the follow-up job of a batch" in record.errors[0]["error"]


class CountingCursor(psycopg2.extensions.cursor):
    executed = 0

    def execute(self, sql, args=None):
        CountingCursor.executed += 1
        return super().execute(sql, args)


def test_wait_returns_promptly_when_the_last_job_finishes_and_does_not_poll(dsn, pools):
    pools.start(app=APP, workers=2)
    ids = enqueue_jobs(dsn, *[Job("tick", {"n": n}) for n in range(5)],
                       Job("member", {"i": 99, "gate": "last"}))
    conn = psycopg2.connect(dsn, cursor_factory=CountingCursor)
    try:
        wait_for(lambda: any(r[0] == "member" for r in exec_records(pools.log_dir)), message="the last job")
        CountingCursor.executed = 0
        opener = time.monotonic()

        timer = threading.Timer(1.5, open_gate, (pools.log_dir, "last"))
        timer.start()
        records = awa_pool.wait(conn, ids, timeout=30)
        returned = time.time()
        waited = time.monotonic() - opener
        timer.join()
        assert [r.id for r in records] == ids and all(r.terminal for r in records)
        assert records[-1].result == {"i": 99, "square": 99 * 99}
        last = max(r.finalized_at for r in records).timestamp()
        assert returned - last < 1.0, f"wait returned {returned - last:.2f}s after the last job finished"
        assert waited >= 1.4  # it really blocked until the gate opened
        # LISTEN, one look per wake-up, UNLISTEN: no busy polling
        assert CountingCursor.executed <= 8, CountingCursor.executed
        assert conn.get_transaction_status() == psycopg2.extensions.TRANSACTION_STATUS_IDLE
    finally:
        conn.close()


def test_wait_times_out_cleanly(dsn):
    ids = enqueue_jobs(dsn, Job("tick", queue="nobody"), Job("tick", queue="nobody"))
    with connection(dsn) as conn:
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="2 job"):
            awa_pool.wait(conn, ids, timeout=0.5)
        assert 0.5 <= time.monotonic() - started < 2.0
        # the connection is as it was: usable, not autocommit, listening to nothing
        assert conn.autocommit is False
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_listening_channels()")
            assert cur.fetchone()[0] == 0
        conn.rollback()

        awa_pool.get_job(conn, ids[0])  # opens a transaction
        with pytest.raises(ValueError, match="outside a transaction"):
            awa_pool.wait(conn, ids, timeout=1)
        conn.rollback()
        with pytest.raises(ValueError, match="unknown job"):
            awa_pool.wait(conn, [10**12], timeout=1)
    assert query(dsn, "SELECT state::text FROM awa.jobs WHERE id = ANY(%s)", (ids,)) == [
        ("available",), ("available",)]
