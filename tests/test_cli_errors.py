"""User mistakes end with exactly one line on stderr, starting with
"error: ", a non-zero exit and no traceback; passwords never show."""
from __future__ import annotations

import socket
import time

import pytest

from cli_run import assert_one_error_line, cli, url_with_password

UNREACHABLE = "postgresql://awa_user:s3cret-pw@127.0.0.1:1/nowhere"


@pytest.mark.embedded_smoke
@pytest.mark.parametrize("args, fragments", [
    (["jobs", "show", "999999"], ["no job with id 999999"]),
    (["jobs", "retry", "999999"], ["no job with id 999999"]),
    (["jobs", "cancel", "999999"], ["no job with id 999999"]),
    (["jobs", "show", "abc"], ["Invalid value for 'ID'"]),
    (["jobs", "list", "--state", "nope"], ["unknown state 'nope'"]),
    (["jobs", "list", "--older-than", "2x"], ["--older-than must be a duration"]),
    (["jobs", "frobnicate"], ["No such command 'frobnicate'"]),
    (["kinds", "--since", "soon"], ["--since must be a duration"]),
    (["queues", "pause", "nosuch"], ["unknown queue 'nosuch'"]),
    (["queues", "resume", "nosuch"], ["unknown queue 'nosuch'"]),
    (["cron", "pause", "nosuch"], ["no periodic job named 'nosuch'"]),
    (["cron", "resume", "nosuch"], ["no periodic job named 'nosuch'"]),
    (["cron", "trigger", "nosuch"], ["no periodic job named 'nosuch'"]),
    (["dlq", "purge"], ["--all"]),
    (["enqueue", "k", "--args", "{bad"], ["--args is not valid JSON"]),
    (["enqueue", "k", "--args", "[1, 2]"], ["--args must be a JSON object", "got list"]),
    (["enqueue", "k", "--priority", "9"], ["priority"]),
    (["enqueue", "k", "--delay", "tomorrow"], ["--delay must be a duration"]),
    (["enqueue"], ["give a job KIND"]),
    (["enqueue", "--file", "/nonexistent/jobs.jsonl"], ["cannot read /nonexistent/jobs.jsonl"]),
    (["enqueue", "k", "--app", "no_such_app_module"], ["app module 'no_such_app_module' not found"]),
    (["start", "--app", "apps.basic", "--queue", "a,min=x"], ["--queue 'a,min=x'", "min must be an integer"]),
    (["start", "--app", "apps.basic", "--queue", "a,colour=red"], ["unknown option 'colour'"]),
    (["start", "--app", "apps.basic", "--shutdown-timeout", "abc"], ["--shutdown-timeout must be a duration"]),
    (["start", "--app", "apps.basic", "--log-format", "xml"], ["--log-format must be text or json"]),
    (["start", "--app", "no_such_app_module"], ["app module 'no_such_app_module' not found"]),
    (["start", "--app", "apps.broken_import"],
     ["app module 'apps.broken_import' failed to import", "ImportError", "this_name_does_not_exist"]),
])
def test_user_mistakes_against_a_database(dsn: str, args, fragments) -> None:
    assert_one_error_line(cli(*args, "--database-url", dsn), *fragments)


@pytest.mark.parametrize("name, content, fragments", [
    ("bad_json.jsonl", '{"kind": "a"}\n{"kind": \n', ["line 2", "not valid JSON"]),
    ("not_object.jsonl", '{"kind": "a"}\n{"kind": "b"}\n[1]\n', ["line 3", "expected a JSON object"]),
    ("no_kind.jsonl", '{"args": {}}\n', ["line 1", '"kind" is missing']),
    ("bad_key.jsonl", '{"kind": "a", "colour": 1}\n', ["line 1", "unknown key(s) 'colour'"]),
    ("bad_priority.jsonl", '{"kind": "a"}\n\n{"kind": "a", "priority": 7}\n', ["line 3", "priority"]),
    ("bad_args.jsonl", '{"kind": "a", "args": [1]}\n', ["line 1", "args"]),
    ("bad_run_at.jsonl", '{"kind": "a", "run_at": "next tuesday"}\n', ["line 1", "ISO 8601"]),
    ("empty.jsonl", "\n\n", ["has no jobs"]),
])
def test_bad_jobs_file_names_the_line(dsn: str, tmp_path, name: str, content: str, fragments) -> None:
    path = tmp_path / name
    path.write_text(content)
    assert_one_error_line(cli("enqueue", "--file", str(path), "--database-url", dsn), str(path), *fragments)
    from helpers import scalar

    assert scalar(dsn, "SELECT count(*) FROM awa.jobs") == 0  # nothing is inserted


@pytest.mark.parametrize("args", [["health"], ["jobs", "list"], ["queues"], ["kinds"], ["top", "--once"],
                                  ["start", "--app", "apps.basic", "--log-level", "warning"]])
def test_unmigrated_database_says_to_migrate(empty_dsn: str, args) -> None:
    assert_one_error_line(cli(*args, "--database-url", empty_dsn), "run 'awa-pool migrate'")


@pytest.mark.parametrize("url, fragments", [
    ("mysql://root:s3cret-pw@localhost/db", ["unsupported database URL scheme 'mysql'"]),
    ("postgresql://awa_user:s3cret-pw@127.0.0.1:notaport/db", ["notaport"]),
    ("host=127.0.0.1 password=s3cret-pw port", ["invalid database URL", "password=***"]),
    ("postgresql://awa_user:s3cret-pw@127.0.0.1:5432/db?sslmode=bogus",
     ["invalid database URL", 'invalid sslmode value: "bogus"']),
    (UNREACHABLE, ["cannot connect to awa_user@127.0.0.1:1/nowhere"]),
])
@pytest.mark.parametrize("args", [["health"], ["jobs", "list"], ["migrate"]])
def test_bad_or_unreachable_database_url(url: str, fragments, args) -> None:
    result = cli(*args, "--database-url", url)
    line = assert_one_error_line(result, *fragments)
    assert "s3cret-pw" not in result.stdout + result.stderr, line


def test_database_url_from_the_environment_is_checked_too() -> None:
    result = cli("health", env={"DATABASE_URL": UNREACHABLE})
    assert_one_error_line(result, "cannot connect")
    assert "s3cret-pw" not in result.stderr


def test_start_gives_up_on_an_unreachable_database_after_connect_timeout() -> None:
    result = cli("start", "--app", "apps.basic", "--connect-timeout", "1s", "--log-level", "warning",
                 "--database-url", UNREACHABLE)
    assert_one_error_line(result, "cannot connect")
    assert "s3cret-pw" not in result.stderr


def test_start_does_not_wait_out_the_connect_timeout_on_a_bad_url_option() -> None:
    """libpq rejects an option's value before reaching any server: no retry
    can help, so `start` says so at once instead of after --connect-timeout."""
    started = time.monotonic()
    result = cli("start", "--app", "apps.basic", "--connect-timeout", "120s", "--database-url",
                 "postgresql://awa_user:s3cret-pw@127.0.0.1:5432/db?target_session_attrs=sometimes")
    assert_one_error_line(result, "invalid database URL", "target_session_attrs")
    assert time.monotonic() - started < 60, "start retried a URL libpq had rejected"
    assert "s3cret-pw" not in result.stderr


def test_start_says_once_that_it_waits_for_the_database() -> None:
    """Not a line per retry (there are about ten in 4 s): one saying what it
    waits for and for how long, then the error."""
    result = cli("start", "--app", "apps.basic", "--connect-timeout", "4s", "--database-url", UNREACHABLE)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode != 0
    assert len(lines) == 2, result.stderr
    assert "waiting for the database at awa_user@127.0.0.1:1/nowhere (up to 4s)" in lines[0]
    assert lines[1].startswith("error: cannot connect")
    assert "s3cret-pw" not in result.stderr


def test_metrics_port_in_use(dsn: str) -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = cli("start", "--app", "apps.basic", "--metrics-port", str(port), "--log-level", "warning",
                     "--database-url", dsn)
    assert_one_error_line(result, f"cannot serve metrics on port {port}", "in use")


def test_password_never_printed_in_errors(dsn: str) -> None:
    url, secret = url_with_password(dsn)
    for args in (["jobs", "show", "424242"], ["queues", "pause", "nosuch"], ["enqueue", "k", "--args", "{"]):
        result = cli(*args, "--database-url", url)
        assert_one_error_line(result)
        assert secret not in result.stdout + result.stderr
