"""The documented Sentry recipe (docs/errors.md, examples/sentry_errors.py)
in a real pool: each child sets sentry-sdk up in on_child_start, and a
handler's exception becomes an event with the job's kind, id and attempt
as tags, captured by a transport that writes files (no network)."""
from __future__ import annotations

import json

import pytest

from awa_pool import Job
from helpers import enqueue_jobs, scalar, wait_for


def _events(log_dir, expected):
    def read():
        events = []
        for path in sorted(log_dir.glob("sentry-*.jsonl")):
            events += [json.loads(line) for line in path.read_text().splitlines()]
        return events if len(events) >= expected else None
    return wait_for(read, timeout=30, message=f"{expected} Sentry events in {log_dir}")


def _run(dsn, pools, every):
    ids = enqueue_jobs(dsn, [Job("sentry_fail", {"n": 7}, max_attempts=2),
                             Job("sentry_ok")])
    supervisor = pools.start("--log-level", "info", app="apps.sentry_app",
                             env={"AWA_TEST_SENTRY_EVERY": "1" if every else "0"})
    wait_for(lambda: scalar(dsn, "SELECT count(*) FROM awa.jobs WHERE id = ANY(%s) AND state::text IN "
                                 "('failed', 'completed')", (ids,)) == 2,
             timeout=40, message="the failing job to fail twice and the other to complete")
    return ids, supervisor


@pytest.mark.parametrize("every", [True, False])
def test_sentry_recipe_tags_handler_failures(dsn, pools, every):
    (failing, _), supervisor = _run(dsn, pools, every)
    events = _events(pools.log_dir, 2 if every else 1)
    supervisor.terminate()
    assert supervisor.wait(timeout=30) == 0
    events = _events(pools.log_dir, 1)
    assert len(events) == (2 if every else 1), events   # nothing for the success
    for event in events:
        assert event["logger"] == "awa_pool.handler"
        assert event["tags"]["awa.kind"] == "sentry_fail"
        assert event["tags"]["awa.job_id"] == str(failing)
        assert event["tags"]["awa.queue"] == "default"
        exception = event["exception"]["values"][-1]
        assert (exception["type"], exception["value"]) == ("ValueError", "sentry says 7")
        frames = exception["stacktrace"]["frames"]
        assert frames[-1]["function"] == "sentry_fail", frames[-1]   # the handler's own frame
    by_attempt = {event["tags"]["awa.attempt"]: event["level"] for event in events}
    assert by_attempt == ({"1": "warning", "2": "error"} if every else {"2": "error"})
    # the log itself has the supervisor's one line per attempt, not the child's record
    text = supervisor.log_path.read_text(errors="replace")
    assert "awa_pool.handler" not in text
    assert text.count(f"awa_pool.failures: job {failing} ") == 2
