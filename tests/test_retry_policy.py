"""Retry policies (SPEC §13): each field of awa_pool.RetryPolicy, on a real
pool and in the SQL that computes the delays; bad policies are refused at
declaration, before anything starts."""
from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any, List

import psycopg2
import pytest

import awa_pool
from awa_pool import Job, RetryPolicy
from cli_run import cli
from helpers import count_lines, enqueue_jobs, record, scalar, wait_for

# Slack above a delay for the leader's promotion (every 0.25 s) and the claim
# after it, on a busy machine; the lower bound is exact (see _delays).
SLACK_S = 3.0


def _delays(job_id: int, dsn: str) -> List[float]:
    """Seconds between each attempt's end and the next one's start. The
    settle that retries a job writes the attempt's end and its next run_at
    with the same now(), and a claim stamps the start after run_at: each
    figure is at least the delay the policy gave."""
    attempts = record(dsn, job_id).attempts
    return [(_at(later["started_at"]) - _at(earlier["finished_at"])).total_seconds()
            for earlier, later in zip(attempts, attempts[1:])]


def _at(value: Any) -> datetime:
    """A timestamp of JobRecord.attempts: a datetime, or ISO text from the
    attempt log (its fraction padded to the six digits Python 3.9 reads)."""
    if isinstance(value, datetime):
        return value
    text = re.sub(r"\.(\d+)", lambda m: "." + m.group(1).ljust(6, "0")[:6], value)
    return datetime.fromisoformat(text)


def _terminal(dsn: str, ids: List[int], timeout: float = 60.0) -> None:
    wait_for(lambda: scalar(dsn, "SELECT count(*) FROM awa.jobs WHERE id = ANY(%s) AND state IN "
                                 "('completed', 'failed', 'cancelled')", (ids,)) == len(ids),
             timeout=timeout, message=f"jobs {ids} to finish")


def test_constant_linear_exponential_and_capped_delays_between_attempts(pools, dsn) -> None:
    from apps import retrying  # noqa: F401  (registers the tasks: their policies go with the jobs)

    kinds = {"fail_constant": [1, 1], "fail_linear": [1, 2], "fail_exponential": [2, 4], "fail_capped": [1.5, 1.5]}
    ids = enqueue_jobs(dsn, [Job(kind) for kind in kinds])  # the tasks' policies apply
    pools.start(app="apps.retrying", workers=2)
    _terminal(dsn, ids)
    for (kind, expected), job_id in zip(kinds.items(), ids):
        job = record(dsn, job_id)
        assert job.state == "failed" and job.attempt == 3, (kind, job.state, job.errors)
        assert job.retry_policy is not None and job.retry_policy["jitter"] == 0
        delays = _delays(job_id, dsn)
        assert len(delays) == 2, (kind, job.attempts)
        for delay, wanted in zip(delays, expected):
            assert wanted <= delay < wanted + SLACK_S, (kind, delays, expected)
    assert count_lines(pools.log_dir, "fail_exponential") == 3


def test_give_up_on_and_retry_on_decide_in_the_child_and_retry_delay_wins(pools, dsn) -> None:
    from apps import retrying  # noqa: F401

    ids = enqueue_jobs(dsn, [Job("give_up"), Job("only_network", {"fail_with": "KeyError"}),
                             Job("only_network", {"until": 3}), Job("retry_wins")])
    pools.start(app="apps.retrying", workers=2)
    _terminal(dsn, ids)
    given_up, outside, inside, retried = (record(dsn, job_id) for job_id in ids)

    # give_up_on: failed at attempt 1 of 5, the reason in the error, the traceback kept
    assert (given_up.state, given_up.attempt) == ("failed", 1)
    [error] = given_up.errors
    assert error["kind"] == "fatal" and error["attempt"] == 1
    assert error["error"] == ("ValueError: this input will never parse "
                              "(not retried: ValueError is in the task's give_up_on)")
    assert "raise ValueError" in error["traceback"]
    assert count_lines(pools.log_dir, "give_up") == 1

    # an Exception outside retry_on gives up; one inside is retried with the policy's delay
    assert (outside.state, outside.attempt) == ("failed", 1)
    assert "not retried: KeyError is not in the task's retry_on" in outside.errors[-1]["error"]
    assert (inside.state, inside.attempt, inside.result) == ("completed", 3, "done at attempt 3")
    assert all(0.2 <= delay < 0.2 + SLACK_S for delay in _delays(ids[2], dsn))

    # Retry(delay=0.2) from the handler wins over the policy's hour
    assert (retried.state, retried.attempt, retried.result) == ("completed", 2, "second attempt")
    [delay] = _delays(ids[3], dsn)
    assert 0.2 <= delay < 0.2 + SLACK_S


def test_the_sql_backoff_follows_each_field(dsn) -> None:
    def delays(attempt: int, policy: str, n: int = 1) -> List[float]:
        return [row for (row,) in _rows(dsn, "SELECT awa.backoff_s(%s, %s::jsonb) FROM generate_series(1, %s)",
                                        (attempt, policy, n))]

    assert delays(3, '{"backoff": "constant", "base": 7, "jitter": 0}') == [7.0]
    assert delays(3, '{"backoff": "linear", "base": 7, "jitter": 0}') == [21.0]
    assert delays(3, '{"backoff": "exponential", "base": 3, "jitter": 0}') == [27.0]
    assert delays(900, '{"backoff": "exponential", "base": 10, "jitter": 0, "max_delay": 60}') == [60.0]
    assert delays(2, '{"backoff": "linear", "base": 50, "jitter": 0, "max_delay": 60}') == [60.0]
    # jitter adds up to that fraction, spread over the range, still capped
    spread = delays(2, '{"backoff": "constant", "base": 10, "jitter": 0.5}', n=2000)
    assert 10.0 <= min(spread) < 10.5 and 14.5 < max(spread) <= 15.0
    capped = delays(2, '{"backoff": "constant", "base": 10, "jitter": 1, "max_delay": 12}', n=500)
    assert max(capped) == 12.0 and min(capped) >= 10.0
    # no policy: the standard 2^n s plus up to 25 %; RetryPolicy() stores the same
    for policy in (None, RetryPolicy().as_json()):
        standard = delays(4, policy, n=500)
        assert 16.0 <= min(standard) and max(standard) <= 20.0
    # a policy a raw producer slipped past the checks still settles (clamped, never raising)
    assert delays(2, '{"backoff": "bogus", "base": "x", "jitter": 9, "max_delay": -1}')[0] == 0.001


def _rows(dsn: str, sql: str, params: tuple) -> list:
    from helpers import query

    return query(dsn, sql, params)


def test_every_enqueue_path_stores_the_policy_and_sql_producers_are_checked(conn, dsn) -> None:
    policy = RetryPolicy(backoff="linear", base=30, jitter=0.1)
    stored = {"backoff": "linear", "base": 30.0, "max_delay": 86400.0, "jitter": 0.1}
    ids = [awa_pool.enqueue(conn, Job("p", retry=policy)),                       # insert_job_now
           awa_pool.enqueue(conn, Job("p", retry=policy, delay=5))]              # insert_job
    ids += awa_pool.enqueue_many(conn, [Job("p", {"i": i}, retry=policy) for i in range(3)])   # uniform
    ids += awa_pool.enqueue_many(conn, [Job("p", {"i": i}, retry=policy, tags=[str(i)]) for i in range(3)])
    ids += awa_pool.enqueue_many(conn, [Job("p", {"i": i}, retry=policy, delay=5) for i in range(3)])
    conn.commit()
    assert [record(dsn, job_id).retry_policy for job_id in ids] == [stored] * len(ids)

    with conn.cursor() as cur:
        cur.execute("""SELECT awa.insert_job('raw', retry_policy => '{"backoff": "constant", "base": 9}')""")
        raw_id = cur.fetchone()[0]
    conn.commit()
    assert record(dsn, raw_id).retry_policy == {"backoff": "constant", "base": 9}
    for bad, message in (('{"backoff": "nope"}', 'backoff must be "exponential", "linear" or "constant"'),
                         ('{"base": -1, "backoff": "linear"}', "base must be >= 0 with backoff linear"),
                         ('{"base": 0.5}', "base must be >= 1 with backoff exponential"),
                         ('{"jitter": 2}', "jitter must be from 0 to 1"),
                         ('{"max_delay": 0}', "max_delay must be over 0"),
                         ('{"tries": 3}', 'unknown key "tries"'),
                         ('[1]', "retry_policy must be a JSON object")):
        with pytest.raises(psycopg2.errors.InvalidParameterValue, match=message):
            with conn.cursor() as cur:
                cur.execute("SELECT awa.insert_job('raw', retry_policy => %s::jsonb)", (bad,))
        conn.rollback()


@pytest.mark.parametrize("make, error, message", [
    (lambda: RetryPolicy(backoff="nope"), ValueError,
     "RetryPolicy backoff must be 'exponential', 'linear' or 'constant', got 'nope'"),
    (lambda: RetryPolicy(base=-1, backoff="constant"), ValueError, "RetryPolicy base must be >= 0 seconds, got -1"),
    (lambda: RetryPolicy(base=0.5), ValueError, "RetryPolicy base must be >= 1 for an exponential backoff"),
    (lambda: RetryPolicy(base="2"), TypeError, "RetryPolicy base must be a number, not str"),
    (lambda: RetryPolicy(give_up_on="ValueError"), TypeError,
     "RetryPolicy give_up_on must be exception classes (like ValueError), got 'ValueError' (str)"),
    (lambda: RetryPolicy(retry_on=(ValueError, 3)), TypeError, "RetryPolicy retry_on must be exception classes"),
    (lambda: RetryPolicy(jitter=2), ValueError, "RetryPolicy jitter must be from 0 to 1"),
    (lambda: RetryPolicy(max_delay=0), ValueError, "RetryPolicy max_delay must be > 0 seconds"),
    (lambda: RetryPolicy(max_delay=timedelta(days=400)), ValueError, "at most 366 days"),
    (lambda: Job("k", retry=RetryPolicy(give_up_on=KeyError)), ValueError,
     "a Job's retry policy sets its backoff only"),
    (lambda: Job("k", retry="exponential"), TypeError, "retry must be an awa_pool.RetryPolicy, not str"),
    (lambda: awa_pool.task("bad_retry_kind", retry={"backoff": "linear"}), TypeError,
     "task retry must be an awa_pool.RetryPolicy, not dict"),
])
def test_bad_policies_are_one_line_errors_at_declaration(make, error, message) -> None:
    with pytest.raises(error) as raised:
        make()
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_a_task_keeps_its_filters_and_its_jobs_store_the_backoff() -> None:
    policy = RetryPolicy(backoff="constant", base=4, give_up_on=(KeyError,))

    @awa_pool.task("policy_defaults", retry=policy, expires_in=60)
    def handler() -> None:
        pass

    assert handler.retry is policy
    job = handler.job()
    assert job.retry == RetryPolicy(backoff="constant", base=4) and job.expires_in == 60.0
    own = Job("policy_defaults", retry=RetryPolicy(backoff="linear", base=1)).with_defaults(handler.defaults)
    assert own.retry.backoff == "linear"  # a Job's own policy wins, as its other fields do


def test_a_bad_policy_in_the_app_stops_start_with_one_line(dsn) -> None:
    result = cli("start", "--app", "apps.bad_retry", "-w", "1", "--database-url", dsn, timeout=60)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert lines == ["error: app module 'apps.bad_retry' failed to import: ValueError: RetryPolicy backoff "
                     "must be 'exponential', 'linear' or 'constant', got 'nope'"], result.stderr
    assert scalar(dsn, "SELECT count(*) FROM awa.supervisors") == 0  # nothing started
