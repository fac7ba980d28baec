"""The dashboard's pages and actions through Flask's test client, against a
real database: what each page shows, keyset pagination, bad input (400),
unknown jobs (404), and every action changing the database as it says."""
from __future__ import annotations

import re

import pytest

import awa_pool
from awa_pool.dashboard import create_app
from awa_pool.core.periodic import make_schedule
from awa_pool.api.periodic_admin import register_schedules
from dashboard_helpers import drain, enqueue, failed_job, post, text, visible
from helpers import connection, query, scalar


@pytest.fixture
def client(dsn):
    return create_app(dsn).test_client()


def test_overview_shows_queues_counts_and_the_throughput_chart(dsn, client):
    enqueue(dsn, *[awa_pool.Job("noop", queue="render") for _ in range(3)],
            awa_pool.Job("noop", queue="mail", delay=3600))
    failed_job(dsn, queue="mail")
    page = client.get("/")
    assert page.status_code == 200
    html = text(page)
    rows = {m.group(1): visible(m.group(0)) for m in re.finditer(
        r'<tr class="[^"]*">\s*<td><a href="/jobs\?queue=(\w+)">.*?</tr>', html, re.S)}
    assert set(rows) == {"mail", "render"}
    assert rows["render"].split()[:2] == ["render", "3"]        # 3 available
    assert rows["mail"].split()[1:7] == ["0", "0", "1", "0", "0", "1"]  # 1 scheduled, 1 failed
    assert "<svg" in html and "Jobs finished per minute" in html
    assert 'data-refresh="/fragment/overview"' in html

    fragment = client.get("/fragment/overview")
    assert fragment.status_code == 200 and "<html" not in text(fragment)
    assert "render" in text(fragment)


def test_overview_lists_live_supervisors(dsn, pools, client):
    from helpers import wait_for

    pools.start(workers=2)
    wait_for(lambda: scalar(dsn, "SELECT count(*) FROM awa.supervisors WHERE stopped_at IS NULL "
                                 "AND (stats ->> 'children')::int = 2"),
             message="the supervisor's first heartbeat with its 2 children")
    html = visible(text(client.get("/fragment/overview")))
    assert "1 alive" in html and "leader" in html
    host = scalar(dsn, "SELECT hostname FROM awa.supervisors")
    assert host in html


def test_jobs_filters_by_state_queue_kind_tag_and_age(dsn, client):
    enqueue(dsn, awa_pool.Job("noop", queue="a", tags=["blue"]), awa_pool.Job("add", {"a": 1, "b": 2}, queue="b"),
            awa_pool.Job("noop", queue="b", tags=["red", "blue"]))
    failed = failed_job(dsn, queue="c")

    def ids(**filters):
        html = text(client.get("/jobs", query_string=filters))
        return [int(i) for i in re.findall(r'<td class="num mono"><a href="/jobs/(\d+)"', html)]

    assert ids() == [4, 3, 2, 1]
    assert ids(queue="b") == [3, 2]
    assert ids(kind="noop") == [3, 1]
    assert ids(tag="blue") == [3, 1]
    assert ids(state="failed") == [failed]
    assert ids(state="available", queue="b", tag="red") == [3]
    assert ids(older_than="1h") == []
    assert ids(newer_than="1h") == [4, 3, 2, 1]


def test_keyset_pages_cover_every_job_once(dsn, client):
    enqueue(dsn, *[awa_pool.Job("noop", {"n": i}) for i in range(120)])
    seen, path, pages = [], "/jobs", 0
    while path:
        html = text(client.get(path))
        seen += [int(i) for i in re.findall(r'<a href="/jobs/(\d+)"', html)]
        found = re.search(r'href="(/jobs\?before=\d+)">Older', html)
        path = found.group(1) if found else None
        pages += 1
    assert pages == 3 and seen == list(range(120, 0, -1))


def test_jump_to_id_and_unknown_job(dsn, client):
    (job_id,) = enqueue(dsn, awa_pool.Job("noop"))
    jump = client.get("/jobs", query_string={"id": f" #{job_id} "})
    assert jump.status_code == 302 and jump.headers["Location"].endswith(f"/jobs/{job_id}")
    missing = client.get("/jobs/987654")
    assert missing.status_code == 404 and "no job with id 987654" in text(missing)
    assert client.get("/nowhere").status_code == 404


@pytest.mark.parametrize("path, reason", [
    ("/jobs?state=exploded", "unknown state 'exploded'"),
    ("/jobs?older_than=yesterday", "older than must be a duration"),
    ("/jobs?before=abc", "the page cursor (before) must be a positive whole number"),
    ("/jobs?id=12x", "job id must be a positive whole number"),
    ("/jobs?kind=" + "k" * 201, "kind must be at most 200 characters"),
    ("/kinds?window=3y", "unknown window '3y'"),
    ("/jobs/cancel", "cancelling by filter needs at least one filter"),
    ("/jobs/cancel?state=completed", "jobs in state completed are finished"),
    ("/dlq/confirm?action=explode", "action must be retry or purge"),
])
def test_malformed_filters_get_400_with_the_reason(client, path, reason):
    response = client.get(path)
    assert response.status_code == 400
    assert reason in visible(text(response)).replace("&#39;", "'")


def test_job_page_shows_traceback_attempt_costs_args_and_retry(dsn, client):
    job_id = failed_job(dsn, message="the disk is full")
    html = text(client.get(f"/jobs/{job_id}"))
    page = visible(html)
    assert "ValueError: the disk is full" in page
    assert "Traceback (most recent call last)" in html and "raise ValueError(message)" in html
    assert re.search(r"the disk is full", page)
    attempts = re.search(r"<h2>Attempts</h2>.*?</table>", html, re.S).group(0)
    row = visible(re.findall(r"<tr><td class=\"num\">1</td>.*?</tr>", attempts, re.S)[0]).split()
    # wall and CPU (peak RSS is measured by a pool's child; drain runs in-process)
    assert "failed" in row and row[-2].endswith("s") and row[-3].endswith("s")
    assert "Retry now" in html and "Cancel</button>" not in html   # terminal: no cancel

    retried = post(client, f"/jobs/{job_id}/retry")
    assert retried.status_code == 302
    assert scalar(dsn, "SELECT state::text FROM awa.jobs WHERE id = %s", (job_id,)) == "available"
    shown = text(client.get(retried.headers["Location"]))
    assert f"Job {job_id} will run again." in shown


def test_job_page_shows_result_and_its_batch(dsn, client):
    with connection(dsn) as conn:
        batch = awa_pool.enqueue_batch(conn, [awa_pool.Job("add", {"a": i, "b": 1}) for i in range(3)],
                                       then=awa_pool.Job("noop"))
        conn.commit()
    drain(dsn)
    member = text(client.get(f"/jobs/{batch.ids[0]}"))
    assert f"Batch {batch.id}" in member and "3 of 3 member(s) finished" in visible(member)
    assert f'href="/jobs/{batch.then_id}"' in member and "&#34;sum&#34;: 1" in member
    follow_up = text(client.get(f"/jobs/{batch.then_id}"))
    assert f"Follow-up of batch {batch.id}" in follow_up
    for member_id in batch.ids:
        assert f'href="/jobs/{member_id}"' in follow_up


def test_cancel_one_job_and_cancel_by_filter_with_its_count(dsn, client):
    one, *_ = enqueue(dsn, awa_pool.Job("noop", queue="x"))
    done = post(client, f"/jobs/{one}/cancel")
    assert done.status_code == 302 and "done=cancelled" in done.headers["Location"]
    assert scalar(dsn, "SELECT state::text FROM awa.jobs WHERE id = %s", (one,)) == "cancelled"
    again = post(client, f"/jobs/{one}/cancel")
    assert "Job %d was not cancelled: it is already cancelled." % one in text(client.get(again.headers["Location"]))

    targets = enqueue(dsn, *[awa_pool.Job("noop", queue="bulk", tags=["t"]) for _ in range(5)])
    spared = enqueue(dsn, awa_pool.Job("noop", queue="other", tags=["t"]))
    confirm = text(client.get("/jobs/cancel", query_string={"tag": "t", "queue": "bulk"}))
    assert "Cancel 5 job(s)?" in confirm and f'name="max_id" value="{max(targets)}"' in confirm
    late = enqueue(dsn, awa_pool.Job("noop", queue="bulk", tags=["t"]))   # after the operator saw 5
    result = post(client, "/jobs/cancel", {"tag": "t", "queue": "bulk", "max_id": max(targets)})
    assert result.status_code == 302
    assert "Cancelled 5 job(s)." in text(client.get(result.headers["Location"]))
    states = dict(query(dsn, "SELECT id, state::text FROM awa.jobs WHERE queue IN ('bulk', 'other')"))
    assert [states[i] for i in targets] == ["cancelled"] * 5
    assert states[spared[0]] == "available" and states[late[0]] == "available"


def test_pause_and_resume_a_queue(dsn, client):
    enqueue(dsn, awa_pool.Job("noop", queue="render"))
    paused = post(client, "/queues/pause", {"queue": "render"})
    assert paused.status_code == 302
    assert scalar(dsn, "SELECT paused FROM awa.queues WHERE name = 'render'") is True
    html = text(client.get(paused.headers["Location"]))
    assert "Queue render is paused" in html and "paused</span>" in html and ">Resume</button>" in html
    post(client, "/queues/resume", {"queue": "render"})
    assert scalar(dsn, "SELECT paused FROM awa.queues WHERE name = 'render'") is False
    assert post(client, "/queues/pause", {"queue": ""}).status_code == 400


def test_dead_letters_list_retry_and_purge(dsn, client):
    query(dsn, "INSERT INTO awa.queues (name, dlq) VALUES ('mail', true)")
    first = failed_job(dsn, "smtp down", queue="mail")
    second = failed_job(dsn, "smtp down again", queue="mail")
    html = text(client.get("/dlq"))
    assert f'href="/jobs/{first}"' in html and f'href="/jobs/{second}"' in html and "smtp down again" in html

    post(client, "/dlq/retry", {"id": first})
    assert scalar(dsn, "SELECT state::text FROM awa.jobs WHERE id = %s", (first,)) == "available"
    confirm = visible(text(client.get("/dlq/confirm", query_string={"action": "purge", "queue": "mail"})))
    assert "Delete 1 dead-lettered job(s)?" in confirm
    assert post(client, "/dlq/purge", {}).status_code == 400            # no filter, no 'all'
    purged = post(client, "/dlq/purge", {"queue": "mail"})
    assert "Deleted 1 dead-lettered job(s)." in text(client.get(purged.headers["Location"]))
    assert scalar(dsn, "SELECT count(*) FROM awa.jobs WHERE id = %s", (second,)) == 0


def test_cron_page_pause_resume_and_trigger(dsn, client):
    with connection(dsn) as conn:
        register_schedules(conn, [make_schedule("nightly", "0 2 * * *", "noop", {"fmt": "pdf"})])
        conn.commit()
    html = visible(text(client.get("/cron")))
    assert "nightly 0 2 * * * UTC noop default coalesce active" in html and "Run now" in html
    post(client, "/cron/pause", {"name": "nightly"})
    assert scalar(dsn, "SELECT paused FROM awa.cron_jobs WHERE name = 'nightly'") is True
    post(client, "/cron/resume", {"name": "nightly"})
    assert scalar(dsn, "SELECT paused FROM awa.cron_jobs WHERE name = 'nightly'") is False
    fired = post(client, "/cron/trigger", {"name": "nightly"})
    job_id = scalar(dsn, "SELECT max(id) FROM awa.jobs WHERE kind = 'noop'")
    assert f"Periodic job nightly enqueued job {job_id}." in text(client.get(fired.headers["Location"]))
    assert post(client, "/cron/pause", {"name": "nope"}).status_code == 404


def test_kinds_page_counts_failures_and_draws_trends(dsn, client):
    enqueue(dsn, *[awa_pool.Job("add", {"a": i, "b": i}) for i in range(6)])
    drain(dsn)
    failed_job(dsn)
    html = text(client.get("/kinds"))
    rows = {m.group(1): visible(m.group(0)).split() for m in re.finditer(
        r'<tr>\s*<td><a href="#kind-\d+">(\w+)</a>.*?</tr>', html, re.S)}
    assert rows["add"][1:6] == ["6", "6", "0", "0", "0"]     # finished, attempts, failures, crashes, timeouts
    assert rows["fail"][1:4] == ["1", "1", "1"]
    assert html.count('<svg class="chart"') == 8           # four charts per kind
    assert client.get("/kinds?window=7d").status_code == 200


def test_job_page_shows_progress_and_a_cancel_button_while_unfinished(dsn, client):
    (job_id,) = enqueue(dsn, awa_pool.Job("snooze_once", {"delay": 3600}))
    drain(dsn)   # sets progress 50 % "snoozed once", then snoozes for an hour
    html = text(client.get(f"/jobs/{job_id}"))
    assert '<progress max="100" value="50">' in html and "snoozed once" in html
    assert "Cancel</button>" in html and 'data-confirm="Cancel job %d?"' % job_id in html


def test_throughput_keeps_closed_minutes_and_reads_the_current_one(dsn):
    from awa_pool.dashboard.throughput import MINUTES, ThroughputMinutes

    enqueue(dsn, *[awa_pool.Job("add", {"a": i, "b": i}) for i in range(3)])
    drain(dsn)
    failed_job(dsn)
    minutes = ThroughputMinutes()
    with connection(dsn) as conn:
        first = minutes.read(conn, ["default", "idle"])
        assert minutes.minutes_read == MINUTES
        conn.rollback()
        again = minutes.read(conn, ["default", "idle"])
        assert minutes.minutes_read <= 2          # the current minute, and the last one if it just closed
    for series in (first, again):
        assert sum(series["default"].completed) == 3 and sum(series["default"].failed) == 1
        assert series["idle"].total == 0 and len(series["idle"].completed) == MINUTES
