"""Every awa-pool command against a real database, run as a user runs it
(`python -m awa_pool ...` in a subprocess): output, --json and exit codes.
The user-mistake cases are in test_cli_errors.py."""
from __future__ import annotations

import json
import signal
import subprocess
import sys

import psycopg2
import pytest

import awa_pool
from awa_pool.core.periodic import make_schedule
from awa_pool.api.periodic_admin import register_schedules
from cli_run import ROOT, assert_one_error_line, cli, cli_env, ok, parse_table, url_with_password
from helpers import query, scalar, wait_for
from terminal import Terminal

JOBS_RIGHT = ("ID", "PRI", "ATTEMPT")  # right-aligned (numbers)
QUEUES_RIGHT = ("AVAILABLE", "RUNNING", "SCHEDULED", "RETRYABLE", "WAITING", "FAILED", "JOBS/S (1m)", "LAG")
KINDS_RIGHT = ("RUNS", "OK", "FAILURES", "CRASHES", "TIMEOUTS", "WALL p50/p95", "CPU p50/p95", "PEAK RSS p50/p95",
               "RSS MAX")


def enqueue(dsn: str, *args: str) -> int:
    return int(ok("enqueue", *args, "--database-url", dsn).strip())


def terminal(dsn: str, *ids: int, timeout: float = 60) -> None:
    wait_for(lambda: scalar(dsn, "SELECT count(*) FROM awa.jobs WHERE id = ANY(%s) AND state IN "
                                 "('completed', 'failed', 'cancelled')", (list(ids),)) == len(ids),
             timeout=timeout, message=f"jobs {ids} to finish")


def test_version_help_and_completion() -> None:
    assert ok("--version").strip() == f"awa-pool {awa_pool.__version__}"
    help_text = ok("--help")
    for command in ("start", "migrate", "enqueue", "jobs", "queues", "dlq", "cron", "top", "kinds", "health"):
        assert command in help_text
    for group, commands in (("jobs", ("list", "show", "retry", "cancel")), ("queues", ("pause", "resume")),
                            ("dlq", ("list", "retry", "purge")),
                            ("cron", ("list", "pause", "resume", "trigger"))):
        text = ok(group, "--help")
        for command in commands:
            assert command in text, (group, command)
        assert "--database-url" in ok(group, commands[0], "--help")
    # shell completion as typer provides it
    completed = subprocess.run([sys.executable, "-m", "awa_pool"], capture_output=True, text=True,
                               env=cli_env({"_AWA_POOL_COMPLETE": "complete_bash",
                                            "COMP_WORDS": "awa-pool jo", "COMP_CWORD": "1"}))
    assert completed.returncode == 0 and completed.stdout.split() == ["jobs"]
    assert "complete" in ok("--show-completion", "bash")


@pytest.mark.embedded_smoke
def test_migrate_check_and_health(empty_dsn: str) -> None:
    assert_one_error_line(cli("migrate", "--check", "--database-url", empty_dsn), "schema is behind")
    assert_one_error_line(cli("health", "--database-url", empty_dsn), "run 'awa-pool migrate'")
    assert "applied" in ok("migrate", "--database-url", empty_dsn)
    assert "up to date" in ok("migrate", "--database-url", empty_dsn)
    assert "up to date" in ok("migrate", "--check", "--database-url", empty_dsn)
    assert ok("health", "--database-url", empty_dsn).startswith("ok")
    assert json.loads(ok("health", "--json", "--database-url", empty_dsn))["ok"] is True


@pytest.mark.embedded_smoke
def test_enqueue_list_and_show(dsn: str) -> None:
    first = enqueue(dsn, "send_email", "--args", '{"to": "a@example.com"}', "--queue", "mail",
                    "--priority", "1", "--tag", "welcome", "--max-attempts", "3", "--timeout", "5m")
    later = json.loads(ok("enqueue", "report", "--args", '{"n": 2}', "--delay", "1h", "--json",
                          "--database-url", dsn))["id"]
    assert later > first

    header, rows = parse_table(ok("jobs", "list", "--database-url", dsn), right=JOBS_RIGHT)
    assert header == ["ID", "KIND", "QUEUE", "STATE", "PRI", "ATTEMPT", "CREATED", "RUN/DONE", "LAST ERROR"]
    assert rows[0][:6] == [str(later), "report", "default", "scheduled", "2", "0/25"]  # newest first
    assert rows[0][7].startswith("in 59m")  # runs in an hour
    assert rows[1][:6] == [str(first), "send_email", "mail", "available", "1", "0/3"]

    listed = json.loads(ok("jobs", "list", "--json", "--database-url", dsn))
    assert [job["id"] for job in listed] == [later, first]
    assert listed[1]["args"] == {"to": "a@example.com"} and listed[1]["priority"] == 1
    assert listed[1]["tags"] == ["welcome"] and listed[1]["max_attempts"] == 3 and listed[1]["timeout"] == 300

    def ids(*filters: str) -> list:
        return [job["id"] for job in json.loads(ok("jobs", "list", "--json", *filters, "--database-url", dsn))]

    assert ids("--state", "scheduled") == [later]
    assert ids("--queue", "mail") == [first]
    assert ids("--kind", "report") == [later]
    assert ids("--limit", "1") == [later]
    assert ids("--newer-than", "1h") == [later, first]
    assert ids("--older-than", "1h") == []
    assert "no jobs match" in ok("jobs", "list", "--kind", "nothing", "--database-url", dsn)

    detail = ok("jobs", "show", str(first), "--database-url", dsn)
    assert detail.splitlines()[0] == f"job {first}: send_email in queue 'mail', available"
    assert '"to": "a@example.com"' in detail and "welcome" in detail
    for section in ("args:", "progress:", "result:", "attempts:", "errors:"):
        assert section in detail
    shown = json.loads(ok("jobs", "show", str(later), "--json", "--database-url", dsn))
    assert shown["id"] == later and shown["state"] == "scheduled" and shown["args"] == {"n": 2}


def test_enqueue_file_in_bulk_with_progress(dsn: str, tmp_path) -> None:
    lines = [json.dumps({"kind": "bulk", "args": {"i": i}}) for i in range(2500)]
    lines[10] = json.dumps({"kind": "special", "args": {"x": 1}, "queue": "vip", "priority": 1,
                            "tags": ["t1"], "metadata": {"source": "file"}, "max_attempts": 2,
                            "timeout": "30s"})
    lines[11] = json.dumps({"kind": "later", "delay": "2h"})
    lines[12] = json.dumps({"kind": "at", "run_at": "2099-01-01T00:00:00Z"})
    lines[13] = ""  # blank lines are skipped
    lines[14] = json.dumps({"kind": "dedup", "args": {"k": 1}, "unique": True})
    lines[15] = json.dumps({"kind": "dedup", "args": {"k": 1}, "unique": True})
    path = tmp_path / "jobs.jsonl"
    path.write_text("\n".join(lines) + "\n")

    result = cli("enqueue", "--file", str(path), "--queue", "bulkq", "--json", "--database-url", dsn)
    assert result.returncode == 0, result.stderr
    assert "enqueueing 2499 jobs" in result.stderr  # the progress bar's label
    out = json.loads(result.stdout)
    assert out["count"] == 2499 and len(out["ids"]) == 2499
    assert out["ids"][14] == out["ids"][13]  # the unique duplicate returned the existing id
    assert scalar(dsn, "SELECT count(*) FROM awa.jobs") == 2498
    assert scalar(dsn, "SELECT count(*) FROM awa.jobs WHERE queue = 'bulkq'") == 2497  # --queue is a default
    row = query(dsn, "SELECT queue, priority, tags, metadata, max_attempts, timeout_s FROM awa.jobs "
                     "WHERE kind = 'special'")[0]
    assert row == ("vip", 1, ["t1"], {"source": "file"}, 2, 30.0)
    assert query(dsn, "SELECT state::text FROM awa.jobs WHERE kind IN ('later', 'at') ORDER BY kind") == \
        [("scheduled",), ("scheduled",)]

    # stdin works too, and the summary line is human-readable
    piped = ok("enqueue", "--file", "-", "--database-url", dsn, input='{"kind": "piped"}\n{"kind": "piped"}\n')
    assert piped.startswith("enqueued 2 job(s) from stdin")


def test_jobs_show_after_running(pools, dsn: str) -> None:
    pools.start("--queue", "default")
    # --app applies the task's declared defaults (fail: max_attempts=2)
    failing = enqueue(dsn, "fail", "--args", '{"message": "disk on fire"}', "--app", "apps.basic")
    progress = enqueue(dsn, "progress", "--args", '{"steps": 4}')
    adding = enqueue(dsn, "add", "--args", '{"a": 2, "b": 3}')
    terminal(dsn, failing, progress, adding)

    detail = ok("jobs", "show", str(failing), "--database-url", dsn)
    assert f"job {failing}: fail in queue 'default', failed" in detail
    assert "attempt   2 of 2" in detail
    assert "ValueError: disk on fire" in detail
    assert "Traceback (most recent call last)" in detail and 'raise ValueError(message)' in detail
    attempts = detail.split("attempts:")[1].split("errors:")[0].splitlines()
    assert attempts[1].split()[:2] == ["#", "STARTED"]
    assert [line.split()[0] for line in attempts[2:4]] == ["1", "2"]
    assert all("MB" in line for line in attempts[2:4])  # peak RSS of each attempt

    shown = json.loads(ok("jobs", "show", str(failing), "--json", "--database-url", dsn))
    assert [a["attempt"] for a in shown["attempts"]] == [1, 2]
    for attempt in shown["attempts"]:
        assert attempt["wall_seconds"] is not None and attempt["cpu_seconds"] is not None
        assert attempt["peak_rss_bytes"] > 1_000_000
    assert len(shown["errors"]) == 2 and "disk on fire" in shown["errors"][0]["traceback"]

    detail = ok("jobs", "show", str(progress), "--database-url", dsn)
    assert "100%  step 4" in detail and '"step": 4' in detail
    assert '"resumed_from": 0' in detail
    assert '"sum": 5' in ok("jobs", "show", str(adding), "--database-url", dsn)


def test_jobs_retry_and_cancel(dsn: str) -> None:
    waiting = enqueue(dsn, "later", "--delay", "1h")
    other = enqueue(dsn, "later", "--delay", "1h")
    assert ok("jobs", "cancel", str(waiting), "--database-url", dsn).strip() == \
        f"job {waiting} cancelled (now cancelled)"
    assert_one_error_line(cli("jobs", "cancel", str(waiting), "--database-url", dsn),
                          f"job {waiting} is cancelled: nothing to cancel")
    assert ok("jobs", "retry", str(waiting), "--database-url", dsn).strip() == \
        f"job {waiting} retried (now available)"
    assert scalar(dsn, "SELECT state::text FROM awa.jobs WHERE id = %s", (waiting,)) == "available"

    # several ids: the known ones are acted on, the rest reported in one line
    result = cli("jobs", "cancel", str(waiting), str(other), "999999", str(other), "--json", "--database-url", dsn)
    assert_one_error_line(result, "2 of 4 job(s) not cancelled: no job with id 999999; "
                                  f"job {other} is cancelled: nothing to cancel")
    report = json.loads(result.stdout)
    assert [(r["id"], r["changed"]) for r in report] == \
        [(waiting, True), (other, True), (999999, False), (other, False)]
    assert scalar(dsn, "SELECT count(*) FROM awa.jobs WHERE state = 'cancelled'") == 2


@pytest.mark.embedded_smoke
def test_queues_counts_pause_and_resume(dsn: str) -> None:
    for _ in range(3):
        enqueue(dsn, "a_job", "--queue", "alpha")
    enqueue(dsn, "b_job", "--queue", "beta", "--delay", "1h")
    header, rows = parse_table(ok("queues", "--database-url", dsn), right=QUEUES_RIGHT)
    assert header == ["QUEUE", "PAUSED", "AVAILABLE", "RUNNING", "SCHEDULED", "RETRYABLE", "WAITING", "FAILED",
                      "JOBS/S (1m)", "LAG"]
    assert [row[:5] for row in rows] == [["alpha", "", "3", "0", "0"], ["beta", "", "0", "0", "1"]]

    stats = {q["queue"]: q for q in json.loads(ok("queues", "--json", "--database-url", dsn))}
    assert stats["alpha"]["available"] == 3 and stats["beta"]["scheduled"] == 1
    assert stats["alpha"]["lag_seconds"] > 0 and stats["beta"]["lag_seconds"] == 0
    assert stats["alpha"]["jobs_per_s"] == 0 and stats["alpha"]["paused"] is False

    assert "paused" in ok("queues", "pause", "alpha", "--database-url", dsn)
    assert json.loads(ok("queues", "--json", "--database-url", dsn))[0]["paused"] is True
    assert parse_table(ok("queues", "--database-url", dsn), right=QUEUES_RIGHT)[1][0][:2] == ["alpha", "paused"]
    # the group's own --database-url reaches its subcommands
    assert "resumed" in ok("queues", "--database-url", dsn, "resume", "alpha")
    assert json.loads(ok("queues", "--json", "--database-url", dsn))[0]["paused"] is False

    # a queue nothing knows is a typo unless --force
    assert_one_error_line(cli("queues", "pause", "alpah", "--database-url", dsn),
                          "unknown queue 'alpah'", "known: alpha, beta", "--force")
    assert "paused" in ok("queues", "pause", "future", "--force", "--database-url", dsn)
    assert "future" in ok("queues", "--database-url", dsn)


def test_tables_piped_are_plain_aligned_and_whole(dsn: str) -> None:
    """Off a terminal a table is plain text as wide as its longest row, whatever
    COLUMNS says: a script reading `jobs list` through a pipe gets every id
    and every name whole, on one line per job."""
    long_kind = "report_" + "x" * 193  # the longest name a kind may have (200)
    long_queue = "tenant_" + "y" * 93
    ids = [enqueue(dsn, long_kind, "--queue", long_queue)] + [enqueue(dsn, "short") for _ in range(11)]
    piped = cli("jobs", "list", "--database-url", dsn, env={"COLUMNS": "40"})
    assert piped.returncode == 0, piped.stderr
    header, rows = parse_table(piped.stdout, right=JOBS_RIGHT)
    assert len(rows) == 12 and [int(row[0]) for row in rows] == sorted(ids, reverse=True)
    assert rows[-1][1:4] == [long_kind, long_queue, "available"]
    assert all(row[1:3] == ["short", "default"] for row in rows[:-1])
    assert max(len(line) for line in piped.stdout.splitlines()) > 300

    header, rows = parse_table(ok("queues", "--database-url", dsn, env={"COLUMNS": "40"}), right=QUEUES_RIGHT)
    assert {row[0]: row[2] for row in rows} == {"default": "11", long_queue: "1"}
    assert ok("jobs", "list", "--kind", "nothing", "--database-url", dsn) == "no jobs match\n"


def test_tables_on_a_terminal_are_coloured_unless_no_color(dsn: str) -> None:
    enqueue(dsn, "noop", "--queue", "held")
    ok("queues", "pause", "held", "--database-url", dsn)
    with Terminal("queues", "--database-url", dsn) as term:
        assert term.wait() == 0
        assert b"\x1b[1mQUEUE" in term.output and "33" in term.colours()  # bold header, paused in yellow
        assert parse_table(term.text(), right=QUEUES_RIGHT)[1][0][:3] == ["held", "paused", "1"]
    with Terminal("queues", "--database-url", dsn, env={"NO_COLOR": "1"}) as term:
        assert term.wait() == 0
        assert term.colours() == [] and parse_table(term.text(), right=QUEUES_RIGHT)[1][0][1] == "paused"
    # a narrow terminal folds a long value inside its column instead of cutting it
    long_kind = "k" * 150
    enqueue(dsn, long_kind)
    with Terminal("jobs", "list", "--database-url", dsn, cols=80) as term:
        assert term.wait() == 0
        lines = term.text().splitlines()
        assert max(len(line) for line in lines) <= 80
        assert "".join(line[4:].split(" ")[0] for line in lines if line[4:5] == "k") == long_kind


def test_queues_throughput_and_top_once(pools, dsn: str) -> None:
    pools.start("--queue", "default")
    ids = [enqueue(dsn, "noop") for _ in range(5)]
    terminal(dsn, *ids)
    stats = {q["queue"]: q for q in json.loads(ok("queues", "--json", "--database-url", dsn))}
    assert stats["default"]["finished_60s"] == 5 and stats["default"]["jobs_per_s"] == pytest.approx(5 / 60, 0.01)

    wait_for(lambda: "leader" in ok("top", "--once", "--database-url", dsn), message="top to show the leader")
    frame = ok("top", "--once", "--database-url", dsn)
    assert "QUEUES" in frame and "SUPERVISORS (1 alive)" in frame
    sup_line = next(line for line in frame.splitlines() if "leader" in line and "running" in line)
    assert "/2" in sup_line  # busy/children of -w 2
    snapshot = json.loads(ok("top", "--json", "--database-url", dsn))
    assert snapshot["children"]["total"] == 2 and len(snapshot["supervisors"]) == 1
    assert snapshot["supervisors"][0]["is_leader"] is True
    assert {q["queue"] for q in snapshot["queues"]} == {"default"}


def test_dlq_list_retry_and_purge(pools, dsn: str) -> None:
    pools.start("--queue", "default,dlq", "--queue", "other,dlq")
    first = enqueue(dsn, "fail", "--max-attempts", "1")
    second = enqueue(dsn, "fail", "--max-attempts", "1", "--queue", "other")
    third = enqueue(dsn, "fail", "--max-attempts", "1", "--queue", "other")
    terminal(dsn, first, second, third)

    listed = json.loads(ok("dlq", "list", "--json", "--database-url", dsn))
    assert sorted(job["id"] for job in listed) == [first, second, third]
    assert all(job["dead_lettered"] and job["state"] == "failed" for job in listed)
    header, rows = parse_table(ok("dlq", "list", "--queue", "other", "--database-url", dsn), right=("ID", "ATTEMPTS"))
    assert header == ["ID", "KIND", "QUEUE", "ATTEMPTS", "FAILED", "LAST ERROR"]
    assert sorted(row[0] for row in rows) == sorted([str(second), str(third)])
    assert all(row[1:4] == ["fail", "other", "1/1"] and row[5] for row in rows)

    assert_one_error_line(cli("dlq", "purge", "--database-url", dsn), "--all")
    assert_one_error_line(cli("dlq", "retry", "--database-url", dsn), "--all")
    assert ok("dlq", "purge", str(third), "--database-url", dsn).strip() == "purged 1 dead-lettered job(s)"
    assert json.loads(ok("dlq", "retry", "--queue", "other", "--json", "--database-url", dsn)) == {"retried": 1}
    # the retried job runs again (and fails into the DLQ again)
    wait_for(lambda: scalar(dsn, "SELECT attempt FROM awa.jobs WHERE id = %s AND dead_lettered", (second,)) == 1
             and scalar(dsn, "SELECT jsonb_array_length(errors) FROM awa.jobs WHERE id = %s", (second,)) == 2,
             message="the retried job to fail again")
    assert json.loads(ok("dlq", "purge", "--all", "--json", "--database-url", dsn)) == {"purged": 2}
    assert "empty" in ok("dlq", "list", "--database-url", dsn)


def test_cron_list_pause_resume_trigger(dsn: str) -> None:
    conn = psycopg2.connect(dsn)
    try:
        register_schedules(conn, [
            make_schedule("nightly", "0 2 * * *", "build_report", {"fmt": "pdf"}, timezone="Europe/Paris",
                          queue="reports"),
            make_schedule("often", "*/5 * * * *", "ping"),
        ])
        conn.commit()
    finally:
        conn.close()
    header, rows = parse_table(ok("cron", "list", "--database-url", dsn))
    assert header == ["NAME", "SCHEDULE", "TZ", "KIND", "QUEUE", "MISSED", "LAST FIRE", "NEXT FIRE", "LAST JOB"]
    nightly = next(row for row in rows if row[0] == "nightly")
    assert nightly[1:5] == ["0 2 * * *", "Europe/Paris", "build_report", "reports"] and nightly[6] == "never"

    assert "paused" in ok("cron", "pause", "nightly", "--database-url", dsn)
    listed = {s["name"]: s for s in json.loads(ok("cron", "list", "--json", "--database-url", dsn))}
    assert listed["nightly"]["paused"] is True and listed["often"]["paused"] is False
    assert listed["nightly"]["args"] == {"fmt": "pdf"} and listed["often"]["next_fire_at"]

    job_id = int(ok("cron", "trigger", "nightly", "--database-url", dsn).strip())  # works while paused
    assert query(dsn, "SELECT kind, queue, args FROM awa.jobs WHERE id = %s", (job_id,)) == \
        [("build_report", "reports", {"fmt": "pdf"})]
    assert json.loads(ok("cron", "trigger", "often", "--json", "--database-url", dsn))["id"] > job_id
    assert "resumed" in ok("cron", "resume", "nightly", "--database-url", dsn)
    assert json.loads(ok("cron", "list", "--json", "--database-url", dsn))[0]["paused"] is False


def test_kinds_figures(pools, dsn: str) -> None:
    pools.start("--queue", "default")
    adds = [enqueue(dsn, "add", "--args", json.dumps({"a": i, "b": 1})) for i in range(4)]
    failed = enqueue(dsn, "fail", "--max-attempts", "1")
    crashed = enqueue(dsn, "self_kill", "--max-attempts", "1")
    timed_out = enqueue(dsn, "slow", "--max-attempts", "1")
    retried = enqueue(dsn, "retry_then_ok", "--args", '{"times": 1, "delay": 0}')
    terminal(dsn, *adds, failed, crashed, timed_out, retried)

    kinds = {k["kind"]: k for k in json.loads(ok("kinds", "--json", "--database-url", dsn))}
    assert kinds["add"]["runs"] == 4 and kinds["add"]["completed"] == 4 and kinds["add"]["failures"] == 0
    assert kinds["add"]["wall_p50"] is not None and kinds["add"]["cpu_p95"] is not None
    assert kinds["add"]["rss_p50"] > 1_000_000 and kinds["add"]["rss_max"] >= kinds["add"]["rss_p95"]
    assert kinds["fail"]["runs"] == 1 and kinds["fail"]["failures"] == 1
    assert kinds["self_kill"]["crashes"] == 1 and kinds["self_kill"]["completed"] == 0
    assert kinds["slow"]["timeouts"] == 1 and kinds["slow"]["wall_p50"] is None  # a killed attempt has no figures
    assert kinds["retry_then_ok"]["runs"] == 2 and kinds["retry_then_ok"]["failures"] == 1 \
        and kinds["retry_then_ok"]["completed"] == 1

    table_text, note = ok("kinds", "--database-url", dsn).rstrip("\n").split("\n\n")
    assert note.startswith("counts: every attempt on record; p50/p95 and RSS MAX: each kind's latest")
    header, rows = parse_table(table_text, right=KINDS_RIGHT)
    assert header == ["KIND", "RUNS", "OK", "FAILURES", "CRASHES", "TIMEOUTS", "WALL p50/p95", "CPU p50/p95",
                      "PEAK RSS p50/p95", "RSS MAX"]
    assert next(row for row in rows if row[0] == "self_kill")[1:6] == ["1", "0", "0", "1", "0"]
    assert next(row for row in rows if row[0] == "slow")[6] == "- / -"  # a killed attempt has no figures
    assert next(row for row in rows if row[0] == "add")[9].endswith("MB")
    assert [k["kind"] for k in json.loads(ok("kinds", "--kind", "add", "--json", "--database-url", dsn))] == ["add"]
    assert json.loads(ok("kinds", "--since", "1h", "--json", "--database-url", dsn))
    assert "no attempts" in ok("kinds", "--kind", "never_ran", "--database-url", dsn)


def test_start_migrates_with_flag_and_drains_on_sigterm(processes, empty_dsn: str, tmp_path) -> None:
    argv = [sys.executable, "-m", "awa_pool", "start", "--app", "apps.basic", "-w", "1",
            "--queue", "default", "--database-url", empty_dsn]
    refused = cli(*argv[3:])
    assert_one_error_line(refused, "run 'awa-pool migrate'")
    proc = processes.start(argv + ["--migrate"], name="migrating", env={"AWA_TEST_LOG_DIR": str(tmp_path)})
    wait_for(lambda: b"started" in proc.log_path.read_bytes(), message="the supervisor to start")
    job_id = enqueue(empty_dsn, "add", "--args", '{"a": 1, "b": 1}')
    terminal(empty_dsn, job_id)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0


def test_start_logs_one_line_per_event(processes, dsn: str, tmp_path) -> None:
    url, secret = url_with_password(dsn)
    argv = [sys.executable, "-m", "awa_pool", "start", "--app", "apps.basic", "-w", "1",
            "--queue", "default", "--max-tasks-per-child", "2", "--log-format", "json",
            "--database-url", url]
    proc = processes.start(argv, name="logging", env={"AWA_TEST_LOG_DIR": str(tmp_path)})

    def entries() -> list:
        return [json.loads(line) for line in proc.log_path.read_text().splitlines() if line.strip()]

    def logged(fragment: str) -> bool:
        return any(fragment in entry["message"] for entry in entries())

    wait_for(lambda: logged("is now the leader"), message="the leader line")
    crash = enqueue(dsn, "self_kill", "--max-attempts", "1")
    noops = [enqueue(dsn, "noop") for _ in range(3)]
    terminal(dsn, crash, *noops)
    wait_for(lambda: logged("recycling child"), message="a recycle line")
    assert logged("died: child process killed by SIGKILL")
    # a lost database connection and the reconnect, one line each
    query(dsn, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
               "WHERE datname = current_database() AND pid <> pg_backend_pid()")
    wait_for(lambda: logged("reconnected to the database"), message="the reconnect line")
    assert logged("lost the database connection")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0

    log_text = proc.log_path.read_text()
    assert secret not in log_text
    found = entries()  # every line is one JSON object
    started = [entry for entry in found if "started:" in entry["message"]]
    assert len(started) == 1 and started[0]["level"] == "info" and started[0]["pid"] == proc.pid
    assert {"ts", "level", "logger", "pid", "message"} <= set(started[0])
    assert any("stopped" in entry["message"] for entry in found)


@pytest.mark.embedded_smoke
def test_embedded_database_is_announced_in_one_line(tmp_path) -> None:
    """No URL anywhere: the CLI starts the embedded server and says where its data lives."""
    from awa_pool.core import embedded

    data = tmp_path / "pg"
    env = {"AWA_EMBEDDED_DIR": str(data)}
    try:
        result = subprocess.run([sys.executable, "-m", "awa_pool", "migrate"], capture_output=True, text=True,
                                env=cli_env(env), timeout=180, cwd=str(ROOT))
        assert result.returncode == 0, result.stderr
        assert result.stderr.splitlines() == [f"using the embedded Postgres (data in {data})"]
        assert "applied" in result.stdout
        assert "ok" in ok("health", env=env)
    finally:
        embedded.stop(data)
