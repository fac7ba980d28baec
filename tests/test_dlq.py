"""The dead-letter queue (SPEC §1 "Records and details"): opt-in per queue,
exhausted jobs keep their errors, dlq_list/dlq_retry/dlq_purge with filters."""
from __future__ import annotations

import pytest

import awa_pool
from awa_pool import Job
from feature_helpers import APP, connection, enqueue_jobs, get, open_gate, wait_all, wait_state
from helpers import count_lines, scalar

QUEUES = ("--queue", "emails,dlq", "--queue", "sms,dlq", "--queue", "plain")


def _dlq_ids(dsn, **filters):
    with connection(dsn, autocommit=True) as conn:
        return [record.id for record in awa_pool.dlq_list(conn, **filters)]


def test_exhausted_jobs_are_dead_lettered_only_where_the_queue_asks(dsn, pools):
    lettered, fatal, plain = enqueue_jobs(
        dsn, Job("fail", {"message": "smtp down"}, queue="emails", max_attempts=2),
        Job("bad_result", queue="emails"), Job("fail", {"message": "nope"}, queue="plain", max_attempts=1))
    pools.start(*QUEUES, app=APP, workers=2)

    record = wait_state(dsn, lettered, "failed", timeout=40)
    assert record.dead_lettered and record.attempt == 2
    assert [e["error"] for e in record.errors] == ["ValueError: smtp down"] * 2  # errors kept
    assert all("Traceback" in e["traceback"] for e in record.errors)
    record = wait_state(dsn, fatal, "failed")
    assert record.dead_lettered and "not JSON-serializable" in record.errors[0]["error"]
    record = wait_state(dsn, plain, "failed")
    assert not record.dead_lettered  # no dlq option: stays an ordinary failed job

    assert set(_dlq_ids(dsn)) == {lettered, fatal}
    assert _dlq_ids(dsn)[0] == lettered  # most recently dead-lettered first
    assert _dlq_ids(dsn, kind="bad_result") == [fatal]
    assert _dlq_ids(dsn, queue="plain") == []
    assert len(_dlq_ids(dsn, limit=1)) == 1
    with connection(dsn) as conn, pytest.raises(ValueError):
        awa_pool.dlq_list(conn, limit=0)
    with connection(dsn, autocommit=True) as conn:
        listed = {r.id: r for r in awa_pool.dlq_list(conn)}
    assert listed[lettered].state == "failed" and listed[lettered].errors == get(dsn, lettered).errors


def test_dlq_retry_gives_fresh_attempts_and_the_job_runs_again(dsn, pools):
    flaky_email, flaky_sms, fail_email = enqueue_jobs(
        dsn, Job("flaky", {"gate": "smtp"}, queue="emails", max_attempts=1),
        Job("flaky", {"gate": "smtp"}, queue="sms", max_attempts=1),
        Job("fail", queue="emails", max_attempts=1))
    pools.start(*QUEUES, app=APP, workers=2)
    wait_all(dsn, [flaky_email, flaky_sms, fail_email], "failed")
    assert set(_dlq_ids(dsn)) == {flaky_email, flaky_sms, fail_email}

    # runs in the caller's transaction: a rollback undoes it
    with connection(dsn) as conn:
        assert awa_pool.dlq_retry(conn, queue="emails", kind="flaky") == 1
        conn.rollback()
    assert get(dsn, flaky_email).state == "failed"

    open_gate(pools.log_dir, "smtp")
    with connection(dsn) as conn:
        # filters combine with AND: only the flaky job of the emails queue
        assert awa_pool.dlq_retry(conn, queue="emails", kind="flaky") == 1
        conn.commit()
    record = wait_state(dsn, flaky_email, "completed")
    assert record.result == {"ok_on_attempt": 1}  # a fresh attempt counter
    assert record.attempt == 1 and not record.dead_lettered
    assert [e["error"] for e in record.errors] == ["ConnectionError: gate smtp closed"]  # history kept
    assert count_lines(pools.log_dir, "flaky") == 3
    assert set(_dlq_ids(dsn)) == {flaky_sms, fail_email}

    with connection(dsn) as conn:
        assert awa_pool.dlq_retry(conn, ids=[flaky_sms, flaky_email]) == 1  # flaky_email is no letter now
        conn.commit()
    assert wait_state(dsn, flaky_sms, "completed").result == {"ok_on_attempt": 1}
    assert _dlq_ids(dsn) == [fail_email]


def test_dlq_purge_removes_only_what_the_filter_names(dsn, pools):
    jobs = {
        "email_fail_1": Job("fail", queue="emails", max_attempts=1),
        "email_fail_2": Job("fail", queue="emails", max_attempts=1),
        "email_flaky": Job("flaky", {"gate": "never"}, queue="emails", max_attempts=1),
        "sms_fail": Job("fail", queue="sms", max_attempts=1),
        "sms_flaky": Job("flaky", {"gate": "never"}, queue="sms", max_attempts=1),
        "plain_fail": Job("fail", queue="plain", max_attempts=1),
        "email_ok": Job("tick", queue="emails"),
    }
    ids = dict(zip(jobs, enqueue_jobs(dsn, *jobs.values())))
    pools.start(*QUEUES, app=APP, workers=2)
    wait_all(dsn, [i for name, i in ids.items() if name != "email_ok"], "failed")
    wait_state(dsn, ids["email_ok"], "completed")

    def purge(**filters):
        with connection(dsn) as conn:
            n = awa_pool.dlq_purge(conn, **filters)
            conn.commit()
        return n

    with connection(dsn) as conn:
        with pytest.raises(ValueError, match="all=True"):
            awa_pool.dlq_purge(conn)
    assert purge(ids=[]) == 0
    assert purge(queue="emails", kind="fail") == 2
    assert set(_dlq_ids(dsn)) == {ids["email_flaky"], ids["sms_fail"], ids["sms_flaky"]}
    assert get(dsn, ids["email_fail_1"]) is None and get(dsn, ids["email_fail_2"]) is None
    assert purge(ids=[ids["sms_flaky"], ids["plain_fail"], ids["email_ok"]]) == 1  # only letters
    assert purge(kind="flaky") == 1
    assert _dlq_ids(dsn) == [ids["sms_fail"]]
    assert purge(all=True) == 1
    assert _dlq_ids(dsn) == []
    # what was never dead-lettered is untouched
    assert get(dsn, ids["plain_fail"]).state == "failed"
    assert get(dsn, ids["email_ok"]).state == "completed"
    assert scalar(dsn, "SELECT count(*) FROM awa.jobs") == 2
