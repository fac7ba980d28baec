"""Least privilege (SPEC §6): real roles, real connections. A producer role
can enqueue every way there is and do nothing else; a worker role runs a
real supervisor (leader maintenance included) and cannot touch the schema.
Roles are cluster-wide, so each test creates roles with unique names and
drops them afterwards."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import uuid
from typing import Callable, Iterator, List

import psycopg2
import psycopg2.errors
import psycopg2.extensions
import pytest
from psycopg2 import sql

import awa_pool
from awa_pool import Job
from awa_pool.api import grants
from awa_pool.worker.maintenance import Maintenance, Retention, default_services
from conftest import Pools
from helpers import connection, count_lines, query, scalar, states, wait_for


def _as_role(dsn: str, role: str) -> str:
    """The test database's DSN, logging in as `role` (the server trusts local logins)."""
    params = psycopg2.extensions.parse_dsn(dsn)
    params["user"] = role
    params.pop("password", None)
    return psycopg2.extensions.make_dsn(**params)


@pytest.fixture
def make_role(dsn: str) -> Iterator[Callable[..., str]]:
    """Create login roles with unique names; drop them (and what was granted
    to them in the test database, and in `also`: other databases the test
    grants in, which are dropped only later, in the background) at the end."""
    created: List[tuple] = []

    def make(prefix: str = "awa_role", *, also: tuple = ()) -> str:
        name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        query(dsn, sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
        created.append((name, also))
        return name

    yield make
    for name, also in created:
        _drop_role(dsn, name, also)


def _drop_role(dsn: str, name: str, also: tuple = ()) -> None:
    query(dsn, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (name,))
    for database in (*also, dsn):
        query(database, sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
    query(dsn, sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def _grant(dsn: str, role: str, profile: str) -> None:
    conn = psycopg2.connect(dsn)
    try:
        grants.grant(conn, role, profile)
        conn.commit()
    finally:
        conn.close()


@pytest.fixture
def producer(dsn: str, make_role) -> str:
    role = make_role("awa_producer")
    _grant(dsn, role, "producer")
    return role


@pytest.fixture
def worker(dsn: str, make_role) -> str:
    role = make_role("awa_worker")
    _grant(dsn, role, "worker")
    return role


def _refused(dsn: str, role: str, statement: str, params=None) -> str:
    """Run statement as role; it must fail with insufficient_privilege. Returns the message."""
    conn = psycopg2.connect(_as_role(dsn, role))
    try:
        with conn.cursor() as cur, pytest.raises(psycopg2.errors.InsufficientPrivilege) as caught:
            cur.execute(statement, params)
        return str(caught.value)
    finally:
        conn.close()


# -- the producer ---------------------------------------------------------------------------

def test_producer_enqueues_every_way(dsn, producer, tmp_path) -> None:
    conn = psycopg2.connect(_as_role(dsn, producer))
    try:
        one = awa_pool.enqueue(conn, Job("noop", {"i": 1}, tags=["t"], metadata={"m": 1}))
        many = awa_pool.enqueue_many(conn, [Job("noop", {"i": i}) for i in range(5)] + [Job("noop", delay=60)])
        unique = [awa_pool.enqueue(conn, Job("noop", {"u": 1}, unique=awa_pool.Unique())) for _ in range(2)]
        batch = awa_pool.enqueue_batch(conn, [Job("noop", {"b": i}) for i in range(3)], then=Job("add", {"a": 1, "b": 2}))
        empty_batch = awa_pool.enqueue_batch(conn, [], then=Job("noop"))
        with conn.cursor() as cur:
            cur.execute("SELECT awa.insert_job('raw_sql', '{\"x\": 1}', queue => 'raw')")
            raw = cur.fetchone()[0]
            # SPEC §12: INSERT INTO awa.jobs, every column a producer may give, RETURNING id
            cur.execute("INSERT INTO awa.jobs (kind, args, queue, priority, run_at, max_attempts, timeout_s, tags, "
                        "metadata, ordering_key, retry_policy, expires_at, unique_opts) VALUES ('raw_insert', '{}', "
                        "'raw', 1, NULL, 3, 5, '{t}', '{}', 'k', '{\"backoff\": \"constant\", \"base\": 1}', "
                        "now() + interval '1 day', NULL), ('raw_insert', '{\"u\": 1}', 'raw', 2, "
                        "now() + interval '1 hour', 3, NULL, '{}', '{}', NULL, NULL, NULL, '{}') RETURNING id")
            inserted = [row[0] for row in cur.fetchall()]
        conn.commit()
    finally:
        conn.close()
    assert unique[0] == unique[1]
    cli = subprocess.run([sys.executable, "-m", "awa_pool", "enqueue", "noop", "--args", '{"cli": true}',
                          "--database-url", _as_role(dsn, producer)], capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0, cli.stderr
    ids = [one, *many, unique[0], *batch.ids, batch.then_id, empty_batch.then_id, raw, *inserted,
           int(cli.stdout)]
    found = query(dsn, "SELECT id, state::text FROM awa.jobs WHERE id = ANY(%s)", (ids,))
    assert len(found) == len(ids)
    assert scalar(dsn, "SELECT then_id FROM awa.batches WHERE id = %s", (batch.id,)) == batch.then_id


@pytest.mark.parametrize("what,statement", [
    ("read jobs", "SELECT * FROM awa.jobs"),
    ("read a job's kind", "SELECT kind FROM awa.jobs"),
    ("insert a job with a state", "INSERT INTO awa.jobs (kind, state) VALUES ('x', 'running')"),
    ("insert a job into a batch", "INSERT INTO awa.jobs (kind, batch_id) VALUES ('x', 1)"),
    ("return more than the id", "INSERT INTO awa.jobs (kind) VALUES ('x') RETURNING kind"),
    ("read the inbox", "SELECT * FROM awa.jobs_inbox"),
    ("write the inbox", "INSERT INTO awa.jobs_inbox (kind) VALUES ('x')"),
    ("read the hot table", "SELECT id FROM awa.jobs_hot"),
    ("read history", "SELECT count(*) FROM awa.jobs_done"),
    ("delete jobs", "DELETE FROM awa.jobs_hot"),
    ("change a job", "UPDATE awa.jobs_deferred SET run_at = now()"),
    ("insert a row directly", "INSERT INTO awa.jobs_hot (kind, state) VALUES ('x', 'running')"),
    ("claim", "SELECT * FROM awa.claim('default', 10, 1)"),
    ("complete", "SELECT awa.complete_jobs('{1}', '{1}', '{0}', '{0}', '{0}')"),
    ("settle", "SELECT * FROM awa.settle_jobs('[]')"),
    ("cancel", "SELECT awa.cancel_job(1)"),
    ("retry", "SELECT awa.retry_job(1)"),
    ("resolve a callback", "SELECT * FROM awa.resolve_callback(gen_random_uuid(), 'complete')"),
    ("rescue", "SELECT * FROM awa.rescue_lost(0, 500, NULL)"),
    ("pause a queue", "INSERT INTO awa.queues (name, paused) VALUES ('default', true)"),
    ("register a supervisor", "INSERT INTO awa.supervisors (hostname, pid, version, workers) VALUES ('h', 1, 'v', 1)"),
    ("read batches", "SELECT remaining FROM awa.batches"),
    ("tamper with a batch", "UPDATE awa.batches SET remaining = 0"),
    ("forge a batch", "INSERT INTO awa.batches (total, remaining) VALUES (5, 0)"),
    ("read unique keys", "SELECT * FROM awa.unique_keys"),
    ("truncate", "TRUNCATE awa.jobs_hot"),
    ("drop a table", "DROP TABLE awa.jobs_hot"),
    ("create a table", "CREATE TABLE awa.evil (x int)"),
    ("grant itself more", "SELECT awa.grant_worker(current_user)"),
    ("revoke", "SELECT awa.revoke_privileges(current_user)"),
])
def test_producer_is_refused_everything_else(dsn, producer, what, statement) -> None:
    _refused(dsn, producer, statement)


def test_producer_cannot_hijack_another_batch(dsn, producer) -> None:
    owner = psycopg2.connect(dsn)
    try:
        batch = awa_pool.enqueue_batch(owner, [Job("noop")])   # no follow-up yet
        held = awa_pool.enqueue_batch(owner, [Job("noop")], then=Job("noop"))
        owner.commit()
    finally:
        owner.close()
    conn = psycopg2.connect(_as_role(dsn, producer))
    try:
        stranger = awa_pool.enqueue(conn, Job("noop"))
        conn.commit()
    finally:
        conn.close()
    # a job that does not name the batch cannot become its follow-up
    message = _refused(dsn, producer, "UPDATE awa.batches SET then_id = %s WHERE id = %s", (stranger, batch.id))
    assert "is not the follow-up" in message
    # a batch's follow-up cannot be replaced
    message = _refused(dsn, producer, "UPDATE awa.batches SET then_id = %s WHERE id = %s", (stranger, held.id))
    assert "already has its follow-up" in message
    assert scalar(dsn, "SELECT then_id FROM awa.batches WHERE id = %s", (held.id,)) == held.then_id
    # no job can join a sealed batch, one at a time or in bulk, ready or not
    for statement in ("SELECT awa.insert_job('noop', batch_id => %s)",
                      "SELECT * FROM awa.insert_jobs('[{\"kind\": \"noop\", \"delay_s\": 60}]', %s)",
                      "SELECT * FROM awa.insert_ready_jobs('[{\"kind\": \"noop\"}]', %s)"):
        assert "is sealed" in _refused(dsn, producer, statement, (held.id,))
    # and a sealed batch cannot be reopened
    assert "cannot be reopened" in _refused(dsn, producer, "UPDATE awa.batches SET sealed = false WHERE id = %s",
                                            (held.id,))
    # a batch id that does not exist (or is not committed yet) is refused too
    conn = psycopg2.connect(_as_role(dsn, producer))
    try:
        with conn.cursor() as cur, pytest.raises(psycopg2.errors.ForeignKeyViolation, match="unknown batch"):
            cur.execute("SELECT awa.insert_job('noop', batch_id => %s)", (held.id + 1000,))
    finally:
        conn.close()
    assert scalar(dsn, "SELECT count(*) FROM awa.jobs WHERE batch_id = %s", (held.id,)) == 1
    assert scalar(dsn, "SELECT remaining FROM awa.batches WHERE id = %s", (held.id,)) == 1


def test_revoke_takes_everything_back(dsn, producer) -> None:
    conn = psycopg2.connect(dsn)
    try:
        grants.revoke(conn, producer)
        conn.commit()
        assert grants.privileges(conn, producer) == []
    finally:
        conn.close()
    _refused(dsn, producer, "SELECT awa.insert_job('noop')")


# -- the worker -------------------------------------------------------------------------------

def test_worker_runs_a_real_supervisor_with_leader_maintenance(dsn, worker, processes, tmp_path) -> None:
    """Jobs complete, fail and retry, a delayed job is promoted, a callback is
    registered and resolved, a dead supervisor's job is rescued and cron
    fires: all by a supervisor logged in as the worker role."""
    owner = psycopg2.connect(dsn)
    try:
        ids = awa_pool.enqueue_many(owner, [Job("noop") for _ in range(10)] + [
            Job("add", {"a": 2, "b": 3}), Job("fail", max_attempts=2), Job("noop", delay=1),
            Job("progress", {"steps": 3}), Job("cb_wait")])
        owner.commit()
    finally:
        owner.close()
    dead = scalar(dsn, "INSERT INTO awa.supervisors (hostname, pid, version, workers, heartbeat_at) "
                       "VALUES ('gone', 1, 'x', 1, now() - interval '1 hour') RETURNING id")
    orphan = scalar(dsn, "SELECT id FROM awa.claim('default', 1, %s)", (dead,))
    assert orphan in ids[:10]
    log_dir = tmp_path / "exec"
    log_dir.mkdir()
    pools = Pools(processes, _as_role(dsn, worker), log_dir)
    supervisor = pools.start(app="apps.basic,apps.cron,apps.features", workers=2)
    callback = wait_for(lambda: scalar(dsn, "SELECT callback_id::text FROM awa.jobs WHERE id = %s "
                                            "AND state = 'waiting_external'", (ids[-1],)),
                        timeout=30, message="the callback job to wait")
    owner = psycopg2.connect(dsn)
    try:
        awa_pool.complete_external(owner, callback, {"ok": True})
        owner.commit()
    finally:
        owner.close()
    wait_for(lambda: states(dsn).get("completed", 0) >= len(ids) - 1 and states(dsn).get("failed") == 1,
             timeout=60, message=f"the jobs to finish (now {states(dsn)})")
    wait_for(lambda: count_lines(log_dir, "cron_tick") >= 1, timeout=30, message="a cron fire")
    assert scalar(dsn, "SELECT result FROM awa.jobs WHERE id = %s", (ids[10],)) == {"sum": 5}
    assert scalar(dsn, "SELECT errors->0->>'kind' FROM awa.jobs WHERE id = %s", (orphan,)) == "lost"
    assert scalar(dsn, "SELECT count(*) FROM awa.jobs WHERE state NOT IN ('completed', 'failed') "
                       "AND kind <> 'cron_tick'") == 0
    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(timeout=30) == 0
    log = supervisor.log_path.read_text()
    # The one traceback per attempt of the planned failure follows its
    # failure line (issue 41); any other would be the supervisor's own.
    failure_lines = log.count(f"job {ids[11]} (kind fail, queue default) failed on attempt")
    assert failure_lines == 2, log[-3000:]
    assert "permission denied" not in log and log.count("Traceback") == failure_lines, log[-3000:]
    assert "is now the leader" in log


def test_worker_role_runs_every_maintenance_service(dsn, worker) -> None:
    """Each leader service, retention's TRUNCATE of a ring segment included."""
    # one completed job, two days old, in the segment the next rotation empties
    job_id = scalar(dsn, "SELECT awa.insert_job('old')")
    owner_id = scalar(dsn, "INSERT INTO awa.supervisors (hostname, pid, version, workers) "
                           "VALUES ('h', 1, 'v', 1) RETURNING id")
    lease = scalar(dsn, "SELECT lease FROM awa.claim('default', 1, %s)", (owner_id,))
    query(dsn, "SELECT awa.complete_jobs(ARRAY[%s]::bigint[], ARRAY[%s]::bigint[], '{0}', '{0}', '{0}')",
          (job_id, lease))
    query(dsn, "UPDATE awa.jobs_done SET finalized_at = now() - interval '2 days', "
               "segment = (SELECT (current + 1) % segments FROM awa.done_ring)")
    conn = psycopg2.connect(_as_role(dsn, worker))
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            maintenance = Maintenance(default_services(heartbeat_staleness=10))
            maintenance.run_due(cur)
            assert maintenance.last_error is None
            dropped = Retention(completed_s=3600, failed_s=3600).rotate(cur, period_s=0.0)
    finally:
        conn.close()
    assert dropped == 1
    assert scalar(dsn, "SELECT count(*) FROM awa.jobs_done") == 0


@pytest.mark.parametrize("what,statement", [
    ("drop a table", "DROP TABLE awa.jobs_hot"),
    ("drop the schema", "DROP SCHEMA awa CASCADE"),
    ("alter a table", "ALTER TABLE awa.jobs_hot ADD COLUMN evil int"),
    ("create a table", "CREATE TABLE awa.evil (x int)"),
    ("create a function", "CREATE FUNCTION awa.evil() RETURNS int LANGUAGE sql AS 'SELECT 1'"),
    ("replace a function", "CREATE OR REPLACE FUNCTION awa.backoff_s(attempt integer) RETURNS double precision "
                           "LANGUAGE sql AS 'SELECT 0.0'"),
    ("drop a trigger", "DROP TRIGGER jobs_done_batches ON awa.jobs_done"),
    ("truncate live jobs", "TRUNCATE awa.jobs_hot"),
    ("delete history", "DELETE FROM awa.jobs_done"),
    ("rewrite migrations", "DELETE FROM awa.schema_migrations"),
    ("grant itself more", "SELECT awa.grant_producer(current_user)"),
])
def test_worker_cannot_change_the_schema(dsn, worker, what, statement) -> None:
    _refused(dsn, worker, statement)


def test_worker_cannot_pass_its_privileges_on(dsn, worker) -> None:
    conn = psycopg2.connect(_as_role(dsn, worker))
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute("GRANT SELECT ON awa.jobs_hot TO PUBLIC")  # Postgres only warns: nothing granted
            assert "no privileges were granted" in " ".join(conn.notices)
    finally:
        conn.close()
    assert query(dsn, "SELECT a.grantee FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a "
                      "WHERE c.oid = 'awa.jobs_hot'::regclass AND a.grantee = 0") == []


# -- the functions themselves ---------------------------------------------------------------

def test_unknown_role_is_a_clear_error(dsn) -> None:
    conn = psycopg2.connect(dsn)
    try:
        with pytest.raises(psycopg2.errors.UndefinedObject, match="does not exist"):
            grants.grant_producer(conn, "awa_no_such_role_" + uuid.uuid4().hex[:8])
        conn.rollback()
        with pytest.raises(ValueError):
            grants.grant_worker(conn, "")
    finally:
        conn.close()


def test_role_names_are_quoted_not_interpolated(dsn) -> None:
    name = f'we"ird; DROP TABLE awa.jobs_hot; -- {uuid.uuid4().hex[:6]}'
    query(dsn, sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
    try:
        conn = psycopg2.connect(dsn)
        try:
            grants.grant_producer(conn, name)
            conn.commit()
            assert {p.name for p in grants.privileges(conn, name)} >= {"awa", "awa.schema_migrations"}
        finally:
            conn.close()
        assert scalar(dsn, "SELECT to_regclass('awa.jobs_hot') IS NOT NULL")
        producer = psycopg2.connect(_as_role(dsn, name))
        try:
            assert awa_pool.enqueue(producer, Job("noop")) > 0
            producer.commit()
        finally:
            producer.close()
    finally:
        _drop_role(dsn, name)


def test_no_function_is_public_and_definers_pin_their_search_path(dsn) -> None:
    public = query(dsn, "SELECT p.proname FROM pg_proc p WHERE p.pronamespace = 'awa'::regnamespace "
                        "AND (p.proacl IS NULL OR EXISTS (SELECT 1 FROM aclexplode(p.proacl) a "
                        "WHERE a.grantee = 0))")
    assert public == [], "functions executable by PUBLIC"
    definers = query(dsn, "SELECT p.proname, p.proconfig FROM pg_proc p "
                          "WHERE p.pronamespace = 'awa'::regnamespace AND p.prosecdef")
    assert {name for name, _ in definers} >= {"insert_job", "insert_jobs"}
    for name, config in definers:
        assert config and any(c.startswith("search_path=pg_catalog") for c in config), name


def test_cli_grant_and_revoke(dsn, make_role) -> None:
    producer, worker = make_role("awa_cli_p"), make_role("awa_cli_w")

    def run(*argv):
        return subprocess.run([sys.executable, "-m", "awa_pool", "grant", *argv, "--database-url", dsn],
                              capture_output=True, text=True, timeout=60)

    done = run("--producer", producer, "--worker", worker)
    assert done.returncode == 0, done.stderr
    assert producer in done.stdout and worker in done.stdout and "awa.insert_job" in done.stdout
    conn = psycopg2.connect(_as_role(dsn, producer))
    try:
        awa_pool.enqueue(conn, Job("noop"))
        conn.commit()
    finally:
        conn.close()
    as_json = run("--producer", producer, "--json")
    assert as_json.returncode == 0
    granted = json.loads(as_json.stdout)
    assert any(entry["name"] == "awa.batches" for entry in granted[0]["privileges"])
    missing = run("--worker", "awa_nobody_" + uuid.uuid4().hex[:6])
    assert missing.returncode == 1
    assert missing.stderr.startswith("error: ") and len(missing.stderr.strip().splitlines()) == 1
    assert "does not exist" in missing.stderr
    nothing = run()
    assert nothing.returncode != 0 and "Traceback" not in nothing.stderr
    revoked = run("--revoke", producer)
    assert revoked.returncode == 0, revoked.stderr
    _refused(dsn, producer, "SELECT awa.insert_job('noop')")


def test_a_worker_granted_before_a_new_hot_path_function_may_call_it_after_migrating(
        empty_dsn, make_role) -> None:  # empty_dsn first: torn down after the roles
    """0011 adds awa.complete_job: a worker role granted on a v10 database
    keeps completing jobs after `migrate`, without being granted again."""
    from awa_pool.api.migrate import MIGRATIONS, migrate

    role = make_role("awa_worker", also=(empty_dsn,))
    conn = psycopg2.connect(empty_dsn)
    try:
        migrate(conn)
        with conn.cursor() as cur:  # back to version 10, as a database made before 0011
            cur.execute("DROP FUNCTION awa.complete_job(bigint, bigint, real, real, bigint, jsonb)")
            cur.execute("DELETE FROM awa.schema_migrations WHERE version = 11")
        conn.commit()
        assert MIGRATIONS[10][0] == 11 and MIGRATIONS[10][1] == "single_completion"
        _grant(empty_dsn, role, "worker")
        assert migrate(conn) == [11]
    finally:
        conn.close()
    owner = psycopg2.connect(empty_dsn)
    try:
        job_id = awa_pool.enqueue(owner, Job("noop"))
        owner.commit()
    finally:
        owner.close()
    worker_conn = psycopg2.connect(_as_role(empty_dsn, role))
    try:
        with worker_conn.cursor() as cur:
            cur.execute("SELECT id, lease FROM awa.claim('default', 1, 1, 60.0, 0::smallint, 5)")
            assert cur.fetchall() == [(job_id, 5)]
            cur.execute("SELECT awa.complete_job(%s, 5, 0.1, 0.1, 0)", (job_id,))
            assert cur.fetchall() == [(job_id,)]
        worker_conn.commit()
    finally:
        worker_conn.close()
    assert scalar(empty_dsn, "SELECT state::text FROM awa.jobs WHERE id = %s", (job_id,)) == "completed"


def _migrate_until(dsn: str, version: int) -> None:
    """Apply the migrations before `version` only, as `migrate` would have
    on a database made before that migration existed."""
    from awa_pool.api.migrate import MIGRATIONS
    from awa_pool.core.sql import QUERIES

    with connection(dsn) as conn:
        with conn.cursor() as cur:
            cur.execute(QUERIES["bootstrap_migrations"])
            for number, name, text in MIGRATIONS:
                if number < version:
                    cur.execute(text)
                    cur.execute(QUERIES["record_migration"], {"version": number, "name": name})
        conn.commit()


def test_roles_granted_before_0027_keep_enqueueing_and_working_after_migrating(
        empty_dsn, make_role) -> None:  # empty_dsn first: torn down after the roles
    """0027 replaces awa.insert_job and awa.insert_uniform_jobs (new
    parameters: expiry and retry policy) and adds the functions that apply
    them: a producer and a worker granted before it keep enqueueing (one
    job, the uniform and the JSON bulk paths) and settling and expiring
    after `migrate`, without being granted again."""
    from awa_pool.api.migrate import migrate
    from awa_pool.core.retry import RetryPolicy

    producer_role = make_role("awa_producer", also=(empty_dsn,))
    worker_role = make_role("awa_worker", also=(empty_dsn,))
    _migrate_until(empty_dsn, 27)
    _grant(empty_dsn, producer_role, "producer")
    _grant(empty_dsn, worker_role, "worker")
    with connection(empty_dsn) as conn:
        assert 27 in migrate(conn)
    policy = RetryPolicy(backoff="constant", base=5)
    producer_conn = psycopg2.connect(_as_role(empty_dsn, producer_role))
    try:
        ids = [awa_pool.enqueue(producer_conn, Job("noop", retry=policy, expires_in=60))]
        ids += awa_pool.enqueue_many(producer_conn, [Job("noop", {"i": i}, retry=policy) for i in range(3)])
        ids += awa_pool.enqueue_many(producer_conn, [Job("noop", {"i": i}, expires_in=i + 1) for i in range(3)])
        producer_conn.commit()
    finally:
        producer_conn.close()
    assert scalar(empty_dsn, "SELECT count(*) FROM awa.jobs WHERE id = ANY(%s)", (ids,)) == 7
    worker_conn = psycopg2.connect(_as_role(empty_dsn, worker_role))
    try:
        with worker_conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM awa.expire_jobs(10)")
            cur.execute("SELECT awa.backoff_s(1, retry_policy) FROM awa.jobs_hot WHERE id = %s", (ids[1],))
            assert 5.0 <= cur.fetchone()[0] <= 5.0 * 1.25
        worker_conn.commit()
    finally:
        worker_conn.close()
