"""Hostile input (SPEC §6): strings built to break SQL, logs or parsers go
through a real pool and the CLI and come back byte-identical; a handler that
cannot take its args fails the job, not the child; nothing read from the
database is unpickled or evaluated; a database password shows up in no log
line, error, CLI output or metric."""
from __future__ import annotations

import ast
import json
import os
import pickle
import re
import signal
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path
from typing import Iterator, List
from urllib.parse import urlsplit, urlunsplit

import psycopg2
import pytest
from psycopg2 import sql as pgsql

import awa_pool
from awa_pool import Job, Unique
from apps.hostile import HOSTILE
from helpers import count_lines, pool_connection, query, scalar, wait_for

PACKAGE = Path(__file__).resolve().parent.parent / "awa_pool"


def _cli(*argv: str, env: dict = None, timeout: float = 60) -> subprocess.CompletedProcess:
    full_env = dict(os.environ)
    for name in ("AWA_DATABASE_URL", "DATABASE_URL"):
        full_env.pop(name, None)
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "awa_pool", *argv], capture_output=True, text=True,
                          timeout=timeout, env=full_env)


def _wait_done(conn, ids: List[int]) -> List[awa_pool.JobRecord]:
    records = awa_pool.wait(conn, ids, timeout=60)
    conn.rollback()
    return records


# -- hostile strings through SQL, a real pool and the CLI ------------------------------------

@pytest.fixture
def hostile_pool(pools, dsn) -> Iterator[psycopg2.extensions.connection]:
    with pool_connection(pools, dsn, "apps.hostile") as conn:
        yield conn


def test_hostile_names_and_values_round_trip_through_a_real_pool(hostile_pool, dsn) -> None:
    conn = hostile_pool
    jobs = [Job(h, {h: h, "nested": {h: [h, {"k": h}]}}, queue=h, tags=[h, "plain"], metadata={h: h, "m": [h]},
                ordering_key=h) for h in HOSTILE]
    ids = [awa_pool.enqueue(conn, job) for job in jobs[:6]] + awa_pool.enqueue_many(conn, jobs[6:])
    unique = [awa_pool.enqueue(conn, Job(h, {h: 1}, queue=h, unique=Unique(by_queue=True))) for h in HOSTILE[:4]]
    again = [awa_pool.enqueue(conn, Job(h, {h: 1}, queue=h, unique=Unique(by_queue=True))) for h in HOSTILE[:4]]
    conn.commit()
    assert unique == again, "a hostile unique key must deduplicate like any other"
    records = _wait_done(conn, ids + unique)
    for h, record in zip(HOSTILE, records):
        assert record.state == "completed", (h, record.errors)
        assert record.kind == h and record.queue == h and record.tags == (h, "plain")
        assert record.args == {h: h, "nested": {h: [h, {"k": h}]}} and record.metadata == {h: h, "m": [h]}
        assert record.ordering_key == h
        seen = record.result  # what the handler received, in the child
        assert seen["kind"] == h and seen["queue"] == h and seen["tags"] == [h, "plain"]
        assert seen["args"] == record.args and seen["metadata"] == record.metadata
    expected = {h: 2 if index < 4 else 1 for index, h in enumerate(HOSTILE)}
    for h in HOSTILE:
        listed = awa_pool.list_jobs(conn, kind=h, queue=h)
        assert {r.kind for r in listed} == {h} and len(listed) == expected[h]
        awa_pool.pause_queue(conn, h)
    conn.commit()
    stats = {s.queue: s for s in awa_pool.queue_stats(conn)}
    assert all(stats[h].paused and stats[h].completed == expected[h] for h in HOSTILE)
    for h in HOSTILE:
        awa_pool.resume_queue(conn, h)
    conn.commit()
    assert scalar(dsn, "SELECT count(*) FROM awa.jobs_hot") == 0  # the table is still there


def test_hostile_strings_through_the_cli(dsn) -> None:
    for h in HOSTILE:
        enqueued = _cli("enqueue", h, "--args", json.dumps({h: h}), "--queue", h, "--tag", h,
                        "--database-url", dsn, "--json")
        assert enqueued.returncode == 0, enqueued.stderr
        job_id = json.loads(enqueued.stdout)["id"]
        shown = _cli("jobs", "show", str(job_id), "--database-url", dsn, "--json")
        assert shown.returncode == 0, shown.stderr
        record = json.loads(shown.stdout)
        assert (record["kind"], record["queue"], record["args"], record["tags"]) == (h, h, {h: h}, [h])
        listed = _cli("jobs", "list", "--kind", h, "--queue", h, "--database-url", dsn, "--json")
        assert [r["id"] for r in json.loads(listed.stdout)] == [job_id]
        paused = _cli("queues", "pause", h, "--database-url", dsn)
        assert paused.returncode == 0, paused.stderr
        cancelled = _cli("jobs", "cancel", str(job_id), "--database-url", dsn, "--json")
        assert cancelled.returncode == 0 and json.loads(cancelled.stdout)[0]["state"] == "cancelled"
    queues = {q["queue"]: q for q in json.loads(_cli("queues", "--database-url", dsn, "--json").stdout)}
    assert all(queues[h]["paused"] for h in HOSTILE)
    assert query(dsn, "SELECT kind FROM awa.jobs ORDER BY id") == [(h,) for h in HOSTILE]


def test_hostile_callback_ids_are_refused_before_sql(dsn) -> None:
    conn = psycopg2.connect(dsn)
    try:
        for bad in [*HOSTILE, "00000000-0000-0000-0000-000000000000'; DROP TABLE awa.jobs_hot; --", "", "\\x00"]:
            with pytest.raises((awa_pool.UnknownCallback, TypeError)) as caught:
                awa_pool.complete_external(conn, bad, {"x": 1})
            assert "\n" not in str(caught.value).replace(bad, "")
        with pytest.raises(awa_pool.UnknownCallback, match="unknown callback id"):
            awa_pool.resume_external(conn, "0b4d6f6e-2f1c-4c43-9f3e-3b1f1a9a2c77", {"x": 1})
        conn.commit()  # the transaction is still usable
    finally:
        conn.close()
    assert scalar(dsn, "SELECT to_regclass('awa.jobs_hot') IS NOT NULL")


def test_every_execute_takes_a_named_query_never_built_text() -> None:
    """No statement is assembled from values: every execute() gets a named
    query (QUERIES[...]) or a psycopg2.sql composition of identifiers."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr in ("execute", "executemany", "mogrify") and node.args:
                first = node.args[0]
                built = isinstance(first, (ast.JoinedStr, ast.BinOp)) or (
                    isinstance(first, ast.Call) and isinstance(first.func, ast.Attribute)
                    and first.func.attr == "format" and not _is_sql_composition(first))
                if built or isinstance(first, ast.Constant):
                    offenders.append(f"{path.name}:{node.lineno}")
    assert offenders == []


def _is_sql_composition(call: ast.Call) -> bool:
    """sql.SQL(QUERIES[...]).format(sql.Identifier(...)) and the like."""
    inner = call.func.value
    return isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute) and inner.func.attr == "SQL"


# -- handlers that cannot take their args -------------------------------------------------------

def test_args_the_handler_cannot_take_fail_the_job_not_the_child(pools, dsn) -> None:
    supervisor = pools.start(workers=1)
    conn = psycopg2.connect(dsn)
    try:
        before = awa_pool.enqueue(conn, Job("whoami"))
        bad = [awa_pool.enqueue(conn, Job("add", args, max_attempts=attempts)) for args, attempts in (
            ({"x": 1}, 5), ({"a": 1}, 5), ({"a": 1, "b": 2, "c": 3}, 5), ({"a": "text", "b": 2}, 1))]
        after = awa_pool.enqueue(conn, Job("whoami"))
        conn.commit()
        records = _wait_done(conn, [before, *bad, after])
    finally:
        conn.close()
    first, *failed, last = records
    assert first.result["pid"] == last.result["pid"], "the child must survive bad args"
    for record in failed[:3]:
        assert record.state == "failed" and record.attempt == 1 and record.crashes == 0, record
        error = record.errors[-1]["error"]
        assert "cannot take args" in error and "add(" in error and "\n" not in error, error
    # args of the wrong type reach the handler: its own TypeError is an ordinary failure (with a
    # traceback, retried while attempts remain), not a refusal of the args
    assert failed[3].state == "failed" and failed[3].errors[0]["error"].startswith("TypeError")
    assert "cannot take args" not in failed[3].errors[0]["error"] and failed[3].errors[0].get("traceback")
    assert supervisor.poll() is None


# -- nothing from the database is unpickled or evaluated ----------------------------------------

DANGEROUS = {("pickle", "loads"), ("pickle", "load"), ("marshal", "loads"), ("marshal", "load"),
             ("dill", "loads"), ("dill", "load"), ("yaml", "load"), ("shelve", "open"),
             ("jsonpickle", "decode"), ("cloudpickle", "loads")}


def test_only_the_private_pipe_protocol_unpickles_and_nothing_evaluates() -> None:
    found = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                func = node.func
                if isinstance(func, ast.Name) and func.id in ("eval", "exec", "compile", "__import__"):
                    found.append((path.name, func.id))
                elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and \
                        (func.value.id, func.attr) in DANGEROUS:
                    found.append((path.name, f"{func.value.id}.{func.attr}"))
            if isinstance(node, ast.ImportFrom) and node.module in ("pickle", "marshal", "dill", "shelve"):
                found.append((path.name, f"from {node.module} import"))
    # protocol.py unpickles frames from the pipes between a supervisor and its own forked children
    assert set(found) == {("protocol.py", "pickle.loads")}, found
    protocol = (PACKAGE / "worker" / "protocol.py").read_text()
    tree = ast.parse(protocol)
    for function in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]:
        if "pickle.loads" in ast.unparse(function):
            assert function.name in ("recv_blocking", "_parse"), function.name
            assert "os.read" in protocol  # frames come from file descriptors, not from SQL
    assert "psycopg2" not in protocol and "QUERIES" not in protocol


def test_a_pickle_payload_comes_back_as_plain_json(pools, dsn, tmp_path) -> None:
    """The classic pickle code-execution payload, as args, metadata and a
    result, is only ever a string."""
    marker = tmp_path / "pwned"
    payload = pickle.dumps(_Pwn(str(marker)), protocol=0).decode("latin-1")
    assert payload.startswith("c") or "posix" in payload or "system" in payload
    pools.start(app="apps.echo", workers=1)
    conn = psycopg2.connect(dsn)
    try:
        job_id = awa_pool.enqueue(conn, Job("echo", {"p": payload}, queue="echo", metadata={"p": payload}))
        value_id = awa_pool.enqueue(conn, Job("echo_value", {"value": payload}, queue="echo"))
        with conn.cursor() as cur:  # a raw SQL producer, too
            cur.execute("SELECT awa.insert_job('echo', jsonb_build_object('p', %s::text), queue => 'echo')",
                        (payload,))
            raw_id = cur.fetchone()[0]
        conn.commit()
        echoed, value, raw = _wait_done(conn, [job_id, value_id, raw_id])
    finally:
        conn.close()
    assert echoed.result["args"] == {"p": payload} and echoed.result["metadata"] == {"p": payload}
    assert value.result == payload and isinstance(value.result, str)
    assert raw.result["args"] == {"p": payload}
    assert not marker.exists(), "something unpickled a payload"
    stored = scalar(dsn, "SELECT jsonb_typeof(result->'args'->'p') FROM awa.jobs WHERE id = %s", (job_id,))
    assert stored == "string"


class _Pwn:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


# -- passwords never leak -------------------------------------------------------------------------

PASSWORD = "Zq9-hunter2-S3cr3t-pw"
ENCODED = "p%40ss%3Aw0rd%2Fodd"          # p@ss:w0rd/odd, percent-encoded in the URL
DECODED = "p@ss:w0rd/odd"


def _with_password(dsn: str, password: str, *, port=None, database=None, scheme=None) -> str:
    parts = urlsplit(dsn)
    host = parts.hostname or "127.0.0.1"
    netloc = f"{parts.username or 'postgres'}:{password}@{host}:{port or parts.port or 5432}"
    path = "/" + database if database else parts.path
    return urlunsplit((scheme or parts.scheme, netloc, path, parts.query, parts.fragment))


def _leaks(text: str) -> List[str]:
    return [secret for secret in (PASSWORD, ENCODED, DECODED) if secret in text]


@pytest.fixture
def secret_url(dsn) -> str:
    if not dsn.startswith("postgresql://") or urlsplit(dsn).hostname is None:
        pytest.skip("needs a TCP database URL (the server trusts local logins, so any password works)")
    return _with_password(dsn, PASSWORD)


def test_no_password_in_supervisor_logs_or_metrics(secret_url, dsn, processes) -> None:
    argv = [sys.executable, "-m", "awa_pool", "start", "--app", "apps.basic", "-w", "1", "--database-url",
            secret_url, "--log-level", "debug", "--metrics-port", "0", "--connect-timeout", "5s"]
    supervisor = processes.start(argv, name="secret-supervisor")
    port = int(wait_for(lambda: re.search(r"metrics on http://[^:]+:(\d+)/metrics", supervisor.log_path.read_text()),
                        timeout=30, message="the metrics endpoint").group(1))
    conn = psycopg2.connect(dsn)
    try:
        ids = awa_pool.enqueue_many(conn, [Job("noop"), Job("fail", max_attempts=1), Job("exit_hard", max_attempts=1),
                                           Job("add", {"nope": 1})])
        conn.commit()
        _wait_done(conn, ids)
    finally:
        conn.close()
    # lose every connection, so the reconnect path logs too
    query(dsn, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
               "WHERE datname = current_database() AND application_name LIKE 'awa-pool%%'")
    wait_for(lambda: "reconnected" in supervisor.log_path.read_text(), timeout=30, message="a reconnection")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        metrics = response.read().decode()
    assert "awa_jobs_completed" in metrics
    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(timeout=30) == 0
    log = supervisor.log_path.read_text()
    assert "lost the database connection" in log and "DEBUG" in log
    assert _leaks(log) == [] and _leaks(metrics) == []


def test_no_password_in_failing_supervisors(secret_url, dsn, processes) -> None:
    cases = {
        "unreachable": _with_password(dsn, PASSWORD, port=1),
        "no such database": _with_password(dsn, PASSWORD, database="awa_no_such_db_xyz"),
        "encoded password": _with_password(dsn, ENCODED, port=1),
        "bad scheme": _with_password(dsn, PASSWORD, scheme="mysql"),
        "bad port": secret_url.replace(f":{urlsplit(secret_url).port}/", ":notaport/"),
    }
    for what, url in cases.items():
        for log_format in ("text", "json"):
            proc = processes.start([sys.executable, "-m", "awa_pool", "start", "--app", "apps.basic", "-w", "1",
                                    "--database-url", url, "--connect-timeout", "1s", "--log-level", "debug",
                                    "--log-format", log_format], name="failing")
            assert proc.wait(timeout=60) != 0, what
            output = proc.log_path.read_text()
            assert "error:" in output or '"level": "error"' in output, (what, output)
            assert _leaks(output) == [], (what, output)


def test_no_password_in_cli_output(secret_url, dsn) -> None:
    job_id = str(scalar(dsn, "SELECT awa.insert_job('noop')"))
    runs = {
        "migrate --check": ["migrate", "--check"], "migrate": ["migrate"], "health": ["health"],
        "health --json": ["health", "--json"], "enqueue": ["enqueue", "noop", "--args", "{}"],
        "enqueue bad json": ["enqueue", "noop", "--args", "{nope"], "jobs list": ["jobs", "list"],
        "jobs show": ["jobs", "show", job_id], "jobs show missing": ["jobs", "show", "999999"],
        "jobs retry missing": ["jobs", "retry", "999999"], "queues": ["queues"], "queues --json": ["queues", "--json"],
        "pause unknown": ["queues", "pause", "no_such_queue"], "kinds": ["kinds"], "top": ["top", "--once"],
        "cron": ["cron", "list"], "dlq": ["dlq", "list"], "grant unknown role": ["grant", "--producer", "no_such_role_x"],
    }
    for what, argv in runs.items():
        done = _cli(*argv, "--database-url", secret_url)
        assert _leaks(done.stdout + done.stderr) == [], (what, done.stdout, done.stderr)
        assert "Traceback" not in done.stderr, (what, done.stderr)
    failing = {
        "unreachable": _with_password(dsn, PASSWORD, port=1),
        "encoded": _with_password(dsn, ENCODED, port=1),
        "no database": _with_password(dsn, PASSWORD, database="awa_no_such_db_xyz"),
        "bad scheme": _with_password(dsn, PASSWORD, scheme="mysql"),
        "bad port": secret_url.replace(f":{urlsplit(secret_url).port}/", ":notaport/"),
        "query password": f"postgresql://postgres@127.0.0.1:1/db?password={PASSWORD}",
        "key=value": f"host=127.0.0.1 port=1 user=postgres password={PASSWORD} dbname=x",
        "key=value quoted": f"host=127.0.0.1 port=1 user=postgres password='{PASSWORD} x' dbname=x",
    }
    for what, url in failing.items():
        for argv in (["health"], ["jobs", "list"], ["enqueue", "noop"]):
            done = _cli(*argv, "--database-url", url)
            assert done.returncode != 0, (what, argv)
            assert done.stderr.startswith("error: ") and len(done.stderr.strip().splitlines()) == 1, \
                (what, done.stderr)
            assert _leaks(done.stdout + done.stderr) == [], (what, done.stderr)
        from_env = _cli("health", env={"AWA_DATABASE_URL": url})
        assert from_env.returncode != 0 and _leaks(from_env.stdout + from_env.stderr) == [], (what, from_env.stderr)


# -- notifications are not commands -----------------------------------------------------------

def test_a_forged_cancel_notification_does_not_touch_a_running_job(pools, dsn) -> None:
    """Any role that can connect may NOTIFY on any channel (Postgres has no
    privilege for it). A cancel notification for a job nobody cancelled must
    not reach the handler nor kill its child."""
    role = f"awa_nobody_{uuid.uuid4().hex[:10]}"
    admin = psycopg2.connect(dsn)
    admin.autocommit = True
    try:
        with admin.cursor() as cur:
            cur.execute(pgsql.SQL("CREATE ROLE {} LOGIN").format(pgsql.Identifier(role)))  # granted nothing
        supervisor = pools.start(app="apps.features", workers=1)
        job_id = awa_pool.enqueue(admin, Job("cooperative", {"limit_s": 4}))
        wait_for(lambda: count_lines(pools.log_dir, "cooperative_start") == 1, timeout=30,
                 message="the job to start")
        params = psycopg2.extensions.parse_dsn(dsn)
        params["user"] = role
        forger = psycopg2.connect(psycopg2.extensions.make_dsn(**params))
        forger.autocommit = True
        try:
            with forger.cursor() as cur:
                cur.execute("SELECT pg_notify('awa_cancel', %s)", (json.dumps({"id": job_id, "lease": 1}),))
        finally:
            forger.close()
        record = awa_pool.wait(admin, [job_id], timeout=60)[0]
        assert record.state == "completed" and record.result == "never cancelled", record
        assert count_lines(pools.log_dir, "cooperative_saw_cancel") == 0
        assert "ignoring a cancel notification" in supervisor.log_path.read_text()
    finally:
        with admin.cursor() as cur:
            cur.execute(pgsql.SQL("DROP ROLE IF EXISTS {}").format(pgsql.Identifier(role)))
        admin.close()


def test_log_lines_cannot_be_forged_by_names() -> None:
    """A queue or kind name carrying newlines or terminal escapes is logged
    as escapes: one event stays one line."""
    import logging

    from awa_pool.ops.logs import RedactingFilter

    record = logging.LogRecord("awa_pool.x", logging.INFO, __file__, 1, "queue %s drained",
                               ("evil\nERROR fake line\x1b[31m\r",), None)
    assert RedactingFilter().filter(record)
    message = record.getMessage()
    assert "\n" not in message and "\x1b" not in message and "\r" not in message
    assert message == "queue evil\\nERROR fake line\\x1b[31m\\x0d drained"
