"""SPEC §13: each failed attempt, crash, timeout and poison verdict is one
line from a real `awa-pool start` (kind, id, attempt/max, queue, error),
WARNING while the job will be retried and ERROR when it failed for good,
with the child's traceback after the line (text) or in a field (JSON)."""
from __future__ import annotations

import json
import re

import pytest

from awa_pool import Job
from helpers import enqueue_jobs, scalar, wait_for

FAILURE_LINE = re.compile(r"^\S+ \S+ (WARNING|ERROR) \[\d+\] awa_pool\.failures: (.*)$")


def _failing_jobs(dsn):
    """One supervisor's worth of failures: an exception twice, a SIGKILL
    twice (out of attempts), a segfault twice with attempts left (poison at
    --max-crashes 2), a timeout twice. Returns {name: job id}."""
    ids = enqueue_jobs(dsn, [Job("fail", {"message": "boom"}, max_attempts=2),
                             Job("self_kill", max_attempts=2),
                             Job("segfault", max_attempts=5),
                             Job("slow", {"seconds": 30}, max_attempts=2)])
    return dict(zip(("fail", "self_kill", "segfault", "slow"), ids))


def _count(dsn, ids, state):
    return scalar(dsn, "SELECT count(*) FROM awa.jobs WHERE id = ANY(%s) AND state::text = %s", (ids, state))


def _run_until_failed(dsn, pools, fmt):
    jobs = _failing_jobs(dsn)
    supervisor = pools.start("--max-crashes", "2", "--log-format", fmt, "--log-level", "info", workers=2)
    wait_for(lambda: _count(dsn, list(jobs.values()), "failed") == len(jobs), timeout=60, message=f"the four jobs {jobs} to fail for good")
    return jobs, supervisor


def _text_lines(path, expected):
    """The failure lines of a text log, each with the lines that follow it
    up to the next log line (its traceback), once `expected` are there."""
    def parsed():
        lines = path.read_text(errors="replace").splitlines()
        found = []
        for number, line in enumerate(lines):
            match = FAILURE_LINE.match(line)
            if match:
                after = []
                for following in lines[number + 1:]:
                    if re.match(r"^\d{4}-\d\d-\d\d ", following):
                        break
                    after.append(following)
                found.append((match.group(1), match.group(2), after))
        return found if len(found) >= expected else None
    return wait_for(parsed, timeout=20, message=f"{expected} failure lines in {path}")


def test_failure_lines_in_text(dsn, pools):
    jobs, supervisor = _run_until_failed(dsn, pools, "text")
    found = _text_lines(supervisor.log_path, 8)
    by_job = {}
    for level, message, after in found:
        job_id = int(re.match(r"job (\d+) ", message).group(1))
        by_job.setdefault(job_id, []).append((level, message, after))
    assert sorted(by_job) == sorted(jobs.values()), found
    assert {name: len(by_job[i]) for name, i in jobs.items()} == {
        "fail": 2, "self_kill": 2, "segfault": 2, "slow": 2}   # one line per attempt, none for more

    (l1, m1, tb1), (l2, m2, tb2) = by_job[jobs["fail"]]
    assert (l1, l2) == ("WARNING", "ERROR")
    assert m1 == (f"job {jobs['fail']} (kind fail, queue default) failed on attempt 1/2, will retry: "
                  "ValueError: boom")
    assert m2 == (f"job {jobs['fail']} (kind fail, queue default) failed on attempt 2/2, "
                  "failed for good (out of attempts): ValueError: boom")
    for trace in (tb1, tb2):   # the child's traceback follows its line
        assert trace[0] == "Traceback (most recent call last):", trace
        assert trace[-1] == "ValueError: boom", trace
        assert any("raise ValueError(message)" in line for line in trace), trace

    (k1, n1, t1), (k2, n2, t2) = by_job[jobs["self_kill"]]
    assert (k1, k2) == ("WARNING", "ERROR")
    assert "crashed on attempt 1/2, will retry: child process killed by SIGKILL (9)" in n1
    assert "crashed on attempt 2/2, failed for good (out of attempts): child process killed by SIGKILL" in n2
    assert t1 == [] or not t1[0].startswith("Traceback"), t1   # a crash has no Python traceback

    (s1, p1, _), (s2, p2, _) = by_job[jobs["segfault"]]
    assert (s1, s2) == ("WARNING", "ERROR")
    assert "(kind segfault, queue default) crashed on attempt 1/5, will retry: " \
           "child process killed by SIGSEGV (11)" in p1
    assert "crashed on attempt 2/5, failed for good (poison: it crashed its child 2 times): " \
           "child process killed by SIGSEGV" in p2

    (w1, o1, _), (w2, o2, _) = by_job[jobs["slow"]]
    assert (w1, w2) == ("WARNING", "ERROR")
    assert "(kind slow, queue default) timed out on attempt 1/2, will retry: timed out after 1s" in o1
    assert "timed out on attempt 2/2, failed for good (out of attempts): timed out after 1s" in o2
    assert supervisor.poll() is None


def test_failure_lines_in_json(dsn, pools):
    jobs, supervisor = _run_until_failed(dsn, pools, "json")

    def failure_entries():
        entries = []
        for line in supervisor.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                entry = json.loads(line)   # every record is one JSON object, tracebacks too
                if entry["logger"] == "awa_pool.failures":
                    entries.append(entry)
        return entries if len(entries) >= 8 else None
    entries = wait_for(failure_entries, timeout=20, message="8 failure entries in the JSON log")
    assert len(entries) == 8, entries
    by_kind = {}
    for entry in entries:
        by_kind.setdefault(entry["kind"], []).append(entry)

    first, last = by_kind["fail"]
    assert {k: first[k] for k in ("level", "job_id", "queue", "attempt", "max_attempts", "outcome",
                                  "final", "error")} == {
        "level": "warning", "job_id": jobs["fail"], "queue": "default", "attempt": 1, "max_attempts": 2,
        "outcome": "failed", "final": False, "error": "ValueError: boom"}
    assert (last["level"], last["attempt"], last["final"]) == ("error", 2, True)
    for entry in (first, last):
        assert entry["exception"].startswith("Traceback (most recent call last):\n"), entry
        assert entry["exception"].endswith("ValueError: boom"), entry
        assert entry["message"].split(": ", 1)[1] == "ValueError: boom"

    poison = by_kind["segfault"][1]
    assert (poison["level"], poison["outcome"], poison["attempt"], poison["max_attempts"], poison["final"]) \
        == ("error", "crash", 2, 5, True)
    assert "SIGSEGV" in poison["error"] and "poison" in poison["message"]
    assert "exception" not in poison
    assert [(e["level"], e["outcome"]) for e in by_kind["self_kill"]] == [("warning", "crash"), ("error", "crash")]
    assert "SIGKILL" in by_kind["self_kill"][0]["error"]
    assert [(e["level"], e["outcome"], e["attempt"]) for e in by_kind["slow"]] == [
        ("warning", "timeout", 1), ("error", "timeout", 2)]
    assert supervisor.poll() is None


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_no_line_for_successes_and_handler_retries(dsn, pools, fmt):
    """Successes and a handler's own Retry that is retried write no failure line."""
    ids = enqueue_jobs(dsn, [Job("noop") for _ in range(20)] + [Job("retry_then_ok", {"times": 1})])
    supervisor = pools.start("--log-format", fmt, "--log-level", "info")
    wait_for(lambda: _count(dsn, ids, "completed") == len(ids), timeout=30,
             message="the jobs to complete")
    supervisor.terminate()
    supervisor.wait(timeout=30)
    assert "awa_pool.failures" not in supervisor.log_path.read_text(errors="replace")
