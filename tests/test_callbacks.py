"""Callbacks and external waits (SPEC §1), end to end with real supervisors:
parking without a child, every way to resolve a callback, timeouts on the
leader, clear errors, the lease guard, and the resume-versus-timeout race."""
from __future__ import annotations

import json
import threading
import uuid

import psycopg2
import pytest

import awa_pool
from awa_pool import Job, JobState, UnknownCallback
from awa_pool.worker.maintenance import ExpireCallbacks
from feature_helpers import (APP, connection, enqueue_jobs, get, job_rows, open_gate, stop_pool,
                             wait_all, wait_state)
from helpers import count_lines, exec_records, wait_for


def _resolve(dsn, fn, *args):
    with connection(dsn) as conn:
        state = fn(conn, *args)
        conn.commit()
    return state


def _raises_unknown(dsn, fn, *args, match):
    with connection(dsn, autocommit=True) as conn:
        with pytest.raises(UnknownCallback, match=match):
            fn(conn, *args)


def test_waiting_job_holds_no_child_and_complete_external_stores_the_result(dsn, pools):
    waiting = enqueue_jobs(dsn, Job("cb_wait"))[0]
    pools.start(app=APP, workers=1)
    record = wait_state(dsn, waiting, "waiting_external")
    callback = record.callback_id
    assert callback and uuid.UUID(callback)

    # the only child is free: other jobs run while the first one waits
    ticks = enqueue_jobs(dsn, *[Job("tick", {"n": n}) for n in range(5)])
    wait_all(dsn, ticks, "completed")
    assert get(dsn, waiting).state == "waiting_external"

    # runs in the caller's transaction: a rollback undoes it
    with connection(dsn) as conn:
        assert awa_pool.complete_external(conn, callback, {"answer": 42}) == JobState.COMPLETED
        conn.rollback()
    assert get(dsn, waiting).state == "waiting_external"

    assert _resolve(dsn, awa_pool.complete_external, callback, {"answer": 42}) == "completed"
    record = get(dsn, waiting)
    assert record.state == "completed" and record.result == {"answer": 42}
    assert record.finalized_at is not None and record.errors == []
    assert count_lines(pools.log_dir, "cb_wait") == 1  # completing did not run the handler again


def test_fail_external_is_a_failed_attempt_retried_then_failed(dsn, pools):
    job_id = enqueue_jobs(dsn, Job("cb_wait", max_attempts=2))[0]
    pools.start(app=APP, workers=1)
    first = wait_state(dsn, job_id, "waiting_external").callback_id

    assert _resolve(dsn, awa_pool.fail_external, first, "card declined") == "retryable"
    record = get(dsn, job_id)
    assert record.attempt == 1
    assert record.errors[-1]["error"] == "card declined" and record.errors[-1]["kind"] == "failed"

    # after the backoff, the handler runs again and waits on a new callback
    record = wait_for(lambda: (r := get(dsn, job_id)).state == "waiting_external" and r.attempt == 2 and r,
                      timeout=30, message="the second attempt to wait")
    second = record.callback_id
    assert second != first
    _raises_unknown(dsn, awa_pool.fail_external, first, "late", match="already used")

    assert _resolve(dsn, awa_pool.fail_external, second, "card declined again") == "failed"
    record = get(dsn, job_id)
    assert record.state == "failed" and record.attempt == 2 and not record.dead_lettered
    assert [e["error"] for e in record.errors] == ["card declined", "card declined again"]
    assert count_lines(pools.log_dir, "cb_wait") == 2


def test_retry_external_runs_the_handler_again(dsn, pools):
    job_id = enqueue_jobs(dsn, Job("cb_wait"))[0]
    pools.start(app=APP, workers=1)
    first = wait_state(dsn, job_id, "waiting_external").callback_id
    assert _resolve(dsn, awa_pool.retry_external, first) in ("available", "running")
    record = wait_for(lambda: (r := get(dsn, job_id)).state == "waiting_external" and r.attempt == 2 and r,
                      timeout=20, message="the handler to run again and wait")
    assert record.callback_id != first
    assert _resolve(dsn, awa_pool.complete_external, record.callback_id, "done") == "completed"
    assert get(dsn, job_id).result == "done"
    assert [r[4] for r in exec_records(pools.log_dir) if r[0] == "cb_wait"] == [
        "attempt=1 result=null", "attempt=2 result=null"]


def test_resume_external_runs_the_handler_with_the_payload(dsn, pools):
    job_id = enqueue_jobs(dsn, Job("cb_wait"))[0]
    pools.start(app=APP, workers=1)
    callback = wait_state(dsn, job_id, "waiting_external").callback_id
    payload = {"token": "abc", "rows": [1, 2, 3]}
    assert _resolve(dsn, awa_pool.resume_external, callback, payload) in ("available", "running")

    record = wait_state(dsn, job_id, "completed")
    # the handler saw ctx.callback_result == payload; the resumed run
    # continues the same attempt
    assert record.result == {"resumed_with": payload, "attempt": 1}
    assert record.attempt == 1
    runs = [r[4].split(" result=") for r in exec_records(pools.log_dir) if r[0] == "cb_wait"]
    assert [(attempt, json.loads(seen)) for attempt, seen in runs] == [
        ("attempt=1", None), ("attempt=1", payload)]
    _raises_unknown(dsn, awa_pool.resume_external, callback, payload, match="already used")


def test_callback_timeout_is_a_failed_attempt_handled_by_the_leader(dsn, pools):
    job_id = enqueue_jobs(dsn, Job("cb_wait", {"timeout": 0.5}, max_attempts=2))[0]
    pools.start(app=APP, workers=1)
    record = wait_state(dsn, job_id, "failed", timeout=40)
    assert record.attempt == 2
    assert [e["kind"] for e in record.errors] == ["callback_timeout", "callback_timeout"]
    assert all(e["error"] == "callback timed out" for e in record.errors)
    assert count_lines(pools.log_dir, "cb_wait") == 2
    _raises_unknown(dsn, awa_pool.complete_external, record.callback_id, None, match="already used")


def test_unknown_malformed_and_used_ids_raise_clearly_and_leave_the_transaction_usable(dsn, pools):
    job_id = enqueue_jobs(dsn, Job("cb_wait"))[0]
    pools.start(app=APP, workers=1)
    used = wait_state(dsn, job_id, "waiting_external").callback_id
    _resolve(dsn, awa_pool.complete_external, used, 1)

    for autocommit in (False, True):
        with connection(dsn, autocommit=autocommit) as conn:
            before = awa_pool.enqueue(conn, Job("tick", {"n": 1}, queue="parked"))
            attempts = [
                (awa_pool.complete_external, (str(uuid.uuid4()), None), "unknown callback id"),
                (awa_pool.resume_external, ("not-a-uuid", {}), "malformed callback id"),
                (awa_pool.fail_external, (used, "x"), "already used"),
                (awa_pool.retry_external, (used,), "already used"),
            ]
            for fn, args, match in attempts:
                with pytest.raises(UnknownCallback, match=match):
                    fn(conn, *args)
            after = awa_pool.enqueue(conn, Job("tick", {"n": 2}, queue="parked"))
            conn.commit()
        assert get(dsn, before).state == get(dsn, after).state == "available"

    with connection(dsn) as conn:
        with pytest.raises(TypeError):
            awa_pool.complete_external(conn, 123)
        with pytest.raises(TypeError):
            awa_pool.fail_external(conn, used, "")
        with pytest.raises((TypeError, ValueError)):
            awa_pool.complete_external(conn, used, {"not json": {1, 2}})
        with pytest.raises(ValueError):
            awa_pool.resume_external(conn, used, {"nan": float("nan")})
        with pytest.raises(awa_pool.PayloadTooLarge, match="over the 1048576-byte limit"):
            awa_pool.complete_external(conn, used, "x" * (1024 * 1024 + 1))
    assert get(dsn, job_id).result == 1


def test_a_late_call_with_an_old_callback_cannot_touch_a_newer_attempt(dsn, pools):
    # waits on cb1, retried -> waits on cb2, retried -> third attempt runs (blocked)
    job_id = enqueue_jobs(dsn, Job("cb_plan", {"plan": ["wait", "wait", "block"]}))[0]
    pools.start(app=APP, workers=1)
    cb1 = wait_state(dsn, job_id, "waiting_external").callback_id
    _resolve(dsn, awa_pool.retry_external, cb1)
    cb2 = wait_for(lambda: (r := get(dsn, job_id)).state == "waiting_external" and r.attempt == 2
                   and r.callback_id, timeout=20, message="the second wait")
    assert cb2 != cb1
    for fn, args in ((awa_pool.complete_external, (cb1, "late")), (awa_pool.fail_external, (cb1, "late")),
                     (awa_pool.retry_external, (cb1,)), (awa_pool.resume_external, (cb1, "late"))):
        _raises_unknown(dsn, fn, *args, match="already used")
    assert get(dsn, job_id).state == "waiting_external"

    _resolve(dsn, awa_pool.retry_external, cb2)
    wait_for(lambda: any(r[1] == job_id and r[4] == "attempt=3 step=block"
                         for r in exec_records(pools.log_dir)), message="the third attempt to run")
    for old in (cb1, cb2):
        for fn, args in ((awa_pool.complete_external, (old, "late")), (awa_pool.fail_external, (old, "late")),
                         (awa_pool.resume_external, (old, "late"))):
            _raises_unknown(dsn, fn, *args, match="already used")
    assert get(dsn, job_id).state == "running"
    open_gate(pools.log_dir, f"{job_id}-3")
    record = wait_state(dsn, job_id, "completed")
    assert record.result == {"finished_attempt": 3} and record.errors == []


def test_a_callback_registered_by_a_failed_attempt_cannot_touch_the_next_one(dsn, pools):
    # attempt 1 registers a callback and then raises; attempt 2 runs (blocked)
    job_id = enqueue_jobs(dsn, Job("cb_plan", {"plan": ["raise", "block"]}))[0]
    pools.start(app=APP, workers=1)
    wait_for(lambda: any(r[1] == job_id and r[4] == "attempt=2 step=block"
                         for r in exec_records(pools.log_dir)), timeout=30,
             message="the second attempt to run")
    record = get(dsn, job_id)
    assert record.state == "running" and record.callback_id is not None  # attempt 1's callback
    for fn, args in ((awa_pool.complete_external, (record.callback_id, "late")),
                     (awa_pool.fail_external, (record.callback_id, "late")),
                     (awa_pool.resume_external, (record.callback_id, "late"))):
        _raises_unknown(dsn, fn, *args, match="already used")
    assert get(dsn, job_id).state == "running"
    open_gate(pools.log_dir, f"{job_id}-2")
    assert wait_state(dsn, job_id, "completed").result == {"finished_attempt": 2}


def test_a_callback_resolved_before_the_handler_returned_wins(dsn, pools):
    # The external system may answer before the handler returns
    # WaitForCallback: the callback applies, the handler's outcome is ignored.
    completed, resumed = enqueue_jobs(dsn, Job("cb_plan", {"plan": ["early"]}),
                                      Job("cb_plan", {"plan": ["early"]}))
    pools.start(app=APP, workers=2)
    for job_id, fn, args, expected in ((completed, awa_pool.complete_external, ("early bird",), "completed"),
                                       (resumed, awa_pool.resume_external, ({"early": True},), "available")):
        callback = wait_for(lambda: (r := get(dsn, job_id)).state == "running" and r.callback_id,
                            message=f"job {job_id} to register its callback")
        assert _resolve(dsn, fn, callback, *args) == expected
        open_gate(pools.log_dir, f"{job_id}-1")

    record = wait_state(dsn, completed, "completed")
    assert record.result == "early bird"
    record = wait_state(dsn, resumed, "completed")
    assert record.result == {"callback_result": {"early": True}, "attempt": 1}
    # the parked outcome of the first run was dropped: nothing is left waiting
    wait_for(lambda: count_lines(pools.log_dir, "cb_plan") == 3, message="three runs in all")
    assert get(dsn, completed).state == "completed" and job_rows(dsn, completed) == 1


RACE_JOBS = 90


def _lock_waiting(dsn, backend_pid):
    with connection(dsn, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (backend_pid,))
        row = cur.fetchone()
        return row is not None and row[0] == "Lock"


def test_callback_resumed_while_its_timeout_fires(dsn, pools):
    """resume_external on one connection, the leader's ExpireCallbacks.tick
    on another, again and again: exactly one wins each time, and the job is
    in exactly the state the winner gave it."""
    ids = enqueue_jobs(dsn, *[Job("cb_wait", {"label": str(n)}) for n in range(RACE_JOBS)])
    proc = pools.start(app=APP, workers=2)
    records = wait_all(dsn, ids, "waiting_external", timeout=40)
    assert stop_pool(proc) == 0  # no leader of its own may join the race
    callbacks = {r.id: r.callback_id for r in records}

    service = ExpireCallbacks()
    resumer = psycopg2.connect(dsn)
    leader = psycopg2.connect(dsn)
    clock = psycopg2.connect(dsn)
    clock.autocommit = True
    wins = {"resume": 0, "expire": 0}
    try:
        for n, job_id in enumerate(ids):
            with clock.cursor() as cur:  # move this job's callback deadline into the past
                cur.execute("UPDATE awa.jobs_deferred SET callback_timeout_at = now() - interval '1 ms'"
                            " WHERE id = %s", (job_id,))
            payload = {"n": n}
            outcome = {}

            def resume():
                try:
                    outcome["resume"] = awa_pool.resume_external(resumer, callbacks[job_id], payload)
                except UnknownCallback as exc:
                    outcome["resume_error"] = str(exc)
                resumer.commit()

            def expire():
                with leader.cursor() as cur:
                    outcome["expired"] = service.tick(cur)

            mode = n % 3
            if mode == 0:    # resume holds the row first; the tick must skip it
                resume_thread = None
                outcome["resume"] = awa_pool.resume_external(resumer, callbacks[job_id], payload)
                expire()
                leader.commit()
                resumer.commit()
            elif mode == 1:  # the tick takes the row first; resume waits for it
                expire()
                resume_thread = threading.Thread(target=resume)
                resume_thread.start()
                wait_for(lambda: _lock_waiting(dsn, resumer.get_backend_pid()) or not resume_thread.is_alive(),
                         timeout=10, message="resume to wait for the tick's row lock")
                leader.commit()
                resume_thread.join(10)
            else:            # both at once
                barrier = threading.Barrier(2)
                resume_thread = threading.Thread(target=lambda: (barrier.wait(), resume()))
                resume_thread.start()
                barrier.wait()
                expire()
                leader.commit()
                resume_thread.join(10)
            assert resume_thread is None or not resume_thread.is_alive()

            resumed = "resume" in outcome
            expired = outcome["expired"] == 1
            assert resumed != expired, f"iteration {n}: both or neither won: {outcome}"
            record = get(dsn, job_id)
            assert job_rows(dsn, job_id) == 1
            if resumed:
                wins["resume"] += 1
                assert outcome["resume"] == "available"
                assert record.state == "available" and record.errors == []
            else:
                wins["expire"] += 1
                assert "already used" in outcome["resume_error"]
                assert record.state == "retryable" and record.attempt == 1
                assert [e["kind"] for e in record.errors] == ["callback_timeout"]
            if mode == 0:
                assert resumed
            elif mode == 1:
                assert expired
    finally:
        for conn in (resumer, leader, clock):
            conn.close()
    assert wins["resume"] >= RACE_JOBS // 3 and wins["expire"] >= RACE_JOBS // 3
    with connection(dsn, autocommit=True) as conn, conn.cursor() as cur:
        # resumed jobs carry their payload; expired ones carry nothing
        cur.execute("SELECT count(*) FROM awa.jobs WHERE state = 'available' AND callback_result IS NOT NULL")
        assert cur.fetchone()[0] == wins["resume"]
        cur.execute("SELECT count(*) FROM awa.jobs WHERE state = 'retryable' AND callback_result IS NULL")
        assert cur.fetchone()[0] == wins["expire"]
