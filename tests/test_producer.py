"""Transactional enqueue, bulk enqueue, uniqueness and the raw SQL entry point."""
from __future__ import annotations

import contextlib
import select
from datetime import datetime, timedelta, timezone
from typing import Any, Iterator, List

import psycopg2
import psycopg2.extensions
import pytest

import awa_pool
from awa_pool import Job, Unique, enqueue, enqueue_many
pytestmark = pytest.mark.embedded_smoke

from helpers import job_row, query, scalar, wait_for


def test_commit_makes_job_visible(conn, dsn) -> None:
    with conn:
        with conn.cursor() as cur:
            cur.execute("CREATE TABLE orders (id int)")
            cur.execute("INSERT INTO orders VALUES (42)")
        job_id = enqueue(conn, Job("send_receipt", {"order_id": 42}))
        # not visible to others before commit
        assert scalar(dsn, "SELECT count(*) FROM awa.jobs WHERE id = %s", (job_id,)) == 0
    row = job_row(dsn, job_id)
    assert row["state"] == "available"
    assert row["args"] == {"order_id": 42}
    assert row["kind"] == "send_receipt" and row["queue"] == "default"
    assert scalar(dsn, "SELECT count(*) FROM orders") == 1


def test_rollback_leaves_nothing(conn, dsn) -> None:
    with pytest.raises(RuntimeError):
        with conn:
            enqueue(conn, Job("a"))
            enqueue_many(conn, [Job("b"), Job("c", delay=60)])
            raise RuntimeError("boom")
    assert scalar(dsn, "SELECT count(*) FROM awa.jobs") == 0


def test_enqueue_never_commits(conn, dsn) -> None:
    enqueue(conn, Job("a"))
    assert conn.get_transaction_status() == psycopg2.extensions.TRANSACTION_STATUS_INTRANS
    conn.rollback()
    assert scalar(dsn, "SELECT count(*) FROM awa.jobs") == 0


def test_enqueue_with_cursor(conn, dsn) -> None:
    with conn.cursor() as cur:
        job_id = enqueue(cur, Job("via_cursor"))
    conn.commit()
    assert job_row(dsn, job_id)["kind"] == "via_cursor"


def test_enqueue_refuses_objects_that_only_look_like_connections(conn) -> None:
    """Real Django and SQLAlchemy objects are tested in tests/test_drivers_*.py;
    an object that merely has a `.connection` is refused, naming what is accepted."""

    class LooksWrapped:
        def __init__(self, raw):
            self.connection = raw
            self.driver_connection = raw

    for bad in (LooksWrapped(conn), object(), None, "postgresql://"):
        with pytest.raises(TypeError, match="psycopg2 or psycopg 3 connection or cursor"):
            enqueue(bad, Job("x"))


def test_all_fields_stored(conn, dsn) -> None:
    run_at = datetime.now(timezone.utc) + timedelta(hours=1)
    job_id = enqueue(conn, Job("full", {"a": [1, 2]}, queue="q1", priority=4, run_at=run_at,
                               max_attempts=3, timeout=12.5, tags=["x", "y"],
                               metadata={"m": True}, ordering_key="key"))
    conn.commit()
    row = job_row(dsn, job_id)
    assert row["state"] == "scheduled"
    assert row["queue"] == "q1" and row["priority"] == 4 and row["max_attempts"] == 3
    assert row["timeout_s"] == 12.5 and row["tags"] == ["x", "y"]
    assert row["metadata"] == {"m": True} and row["ordering_key"] == "key"
    assert abs((row["run_at"] - run_at).total_seconds()) < 0.001


def test_delay_uses_database_clock(conn, dsn) -> None:
    job_id = enqueue(conn, Job("later", delay=30))
    conn.commit()
    seconds = scalar(dsn, "SELECT extract(epoch FROM run_at - created_at) FROM awa.jobs WHERE id = %s", (job_id,))
    assert 29.9 < float(seconds) < 30.5
    assert job_row(dsn, job_id)["state"] == "scheduled"


def test_a_ready_job_runs_from_its_transaction_start(conn, dsn) -> None:
    """A job with neither run_at nor delay takes the shorter statement; it
    must land exactly where a zero delay does: available from the
    transaction's start on the database clock."""
    with conn.cursor() as cur:
        cur.execute("SELECT now()")
        started = cur.fetchone()[0]
    ids = [enqueue(conn, Job("now")), enqueue(conn, Job("zero", delay=0))]
    conn.commit()
    for job_id in ids:
        row = job_row(dsn, job_id)
        assert row["state"] == "available" and row["run_at"] == started


def test_enqueue_many_ids_in_input_order(conn, dsn) -> None:
    jobs = []
    for i in range(300):
        if i % 3 == 0:
            jobs.append(Job("later", {"i": i}, delay=3600))
        elif i % 3 == 1:
            jobs.append(Job("now", {"i": i}, queue="other", priority=1))
        else:
            jobs.append(Job("unique", {"i": i}, unique=Unique()))
    ids = enqueue_many(conn, jobs)
    conn.commit()
    assert len(ids) == 300 and len(set(ids)) == 300
    rows = dict(query(dsn, "SELECT id, (args->>'i')::int FROM awa.jobs"))
    assert [rows[job_id] for job_id in ids] == list(range(300))
    by_state = dict(query(dsn, "SELECT state::text, count(*) FROM awa.jobs GROUP BY 1"))
    assert by_state == {"scheduled": 100, "available": 200}


def test_enqueue_many_empty(conn) -> None:
    assert enqueue_many(conn, []) == []


def test_enqueue_many_chunks(conn, dsn, monkeypatch) -> None:
    monkeypatch.setattr(awa_pool.api.producer, "MANY_CHUNK", 7)
    ids = enqueue_many(conn, [Job("c", {"i": i}) for i in range(30)])
    conn.commit()
    rows = dict(query(dsn, "SELECT id, (args->>'i')::int FROM awa.jobs"))
    assert [rows[job_id] for job_id in ids] == list(range(30))


def test_unique_by_args(conn, dsn) -> None:
    first = enqueue(conn, Job("u", {"a": 1, "b": 2}, unique=Unique()))
    # same args in another key order: the same canonical key
    assert enqueue(conn, Job("u", {"b": 2, "a": 1}, unique=Unique())) == first
    other = enqueue(conn, Job("u", {"a": 2}, unique=Unique()))
    assert other != first
    conn.commit()
    assert scalar(dsn, "SELECT count(*) FROM awa.jobs") == 2


def test_unique_ignoring_args(conn) -> None:
    first = enqueue(conn, Job("u", {"a": 1}, unique=Unique(by_args=False)))
    assert enqueue(conn, Job("u", {"a": 2}, unique=Unique(by_args=False))) == first


def test_unique_by_queue(conn) -> None:
    first = enqueue(conn, Job("u", queue="a", unique=Unique(by_queue=True)))
    assert enqueue(conn, Job("u", queue="a", unique=Unique(by_queue=True))) == first
    assert enqueue(conn, Job("u", queue="b", unique=Unique(by_queue=True))) != first
    # without by_queue, the queue is not part of the key
    plain = enqueue(conn, Job("v", queue="a", unique=Unique()))
    assert enqueue(conn, Job("v", queue="b", unique=Unique())) == plain


def test_unique_within_period(conn, dsn) -> None:
    first = enqueue(conn, Job("p", unique=Unique(period=3600)))
    assert enqueue(conn, Job("p", unique=Unique(period=3600))) == first
    conn.commit()
    # The key of another time bucket differs: compute it at a time one period later.
    with conn.cursor() as cur:
        cur.execute("SELECT awa.unique_key('p', 'default', '{}', true, false, 3600, now()) ="
                    " awa.unique_key('p', 'default', '{}', true, false, 3600, now() + interval '1 hour')")
        assert cur.fetchone()[0] is False
    conn.rollback()


def test_unique_released_after_leaving_states(conn, dsn) -> None:
    unique = Unique(states=["available", "scheduled"])
    first = enqueue(conn, Job("r", unique=unique))
    conn.commit()
    assert enqueue(conn, Job("r", unique=unique)) == first
    conn.commit()
    # the first job leaves the unique states (it is now running)
    query(dsn, "SELECT * FROM awa.claim('default', 10, 1)")
    second = enqueue(conn, Job("r", unique=unique))
    conn.commit()
    assert second != first
    assert enqueue(conn, Job("r", unique=unique)) == second


def test_unique_default_states_block_completed_not_failed(conn, dsn) -> None:
    first = enqueue(conn, Job("d", unique=Unique()))
    conn.commit()
    query(dsn, "SELECT * FROM awa.claim('default', 10, 1)")
    query(dsn, "SELECT awa.complete_jobs(ARRAY[%s]::bigint[], ARRAY[1]::bigint[],"
               " ARRAY[0]::real[], ARRAY[0]::real[], ARRAY[0]::bigint[])", (first,))
    assert enqueue(conn, Job("d", unique=Unique())) == first  # completed still holds the key
    conn.commit()
    # a failed job does not
    query(dsn, "UPDATE awa.jobs_done SET state = 'failed' WHERE id = %s", (first,))
    second = enqueue(conn, Job("d", unique=Unique()))
    assert second != first


def test_unique_duplicate_inserts_nothing_in_bulk(conn, dsn) -> None:
    ids = enqueue_many(conn, [Job("m", {"x": 1}, unique=Unique()) for _ in range(5)])
    conn.commit()
    assert len(set(ids)) == 1
    assert scalar(dsn, "SELECT count(*) FROM awa.jobs") == 1


def test_raw_sql_insert_is_identical_to_enqueue(conn, dsn) -> None:
    columns = ("kind", "queue", "args", "state", "priority", "max_attempts", "timeout_s",
               "tags", "metadata", "unique_key", "lane", "ordering_key", "attempt", "lease")
    py_id = enqueue(conn, Job("same", {"z": 1, "a": [1, "two"]}, queue="q", priority=3,
                              max_attempts=7, timeout=9, tags=["t"], metadata={"m": 1},
                              unique=Unique(by_queue=True), ordering_key="k"))
    with conn.cursor() as cur:
        cur.execute("DELETE FROM awa.unique_keys")  # let the raw insert take the key too
        cur.execute("""SELECT awa.insert_job('same', '{"a": [1, "two"], "z": 1}', 'q', 3, NULL, 7, 9,
                       ARRAY['t'], '{"m": 1}', '{"by_queue": true}', 'k')""")
        raw_id = cur.fetchone()[0]
    conn.commit()
    py_row, raw_row = job_row(dsn, py_id), job_row(dsn, raw_id)
    assert raw_id != py_id
    for column in columns:
        assert py_row[column] == raw_row[column], column


@contextlib.contextmanager
def awa_jobs_listener(dsn: str) -> Iterator[Any]:
    """A connection listening on awa_jobs, the supervisors' wake-up channel."""
    listener = psycopg2.connect(dsn)
    listener.autocommit = True
    try:
        with listener.cursor() as cur:
            cur.execute("LISTEN awa_jobs")
        yield listener
    finally:
        listener.close()


def wake_ups(listener: Any) -> List[str]:
    """The queues woken so far (what arrived within 50 ms is read first)."""
    if select.select([listener], [], [], 0.05)[0]:
        listener.poll()
    return [n.payload for n in listener.notifies]


def test_notify_reaches_listener_at_commit(conn, dsn) -> None:
    with awa_jobs_listener(dsn) as listener:
        enqueue(conn, Job("wake", queue="images"))
        assert select.select([listener], [], [], 0.2) == ([], [], [])  # nothing before commit
        conn.commit()

        def received():
            return wake_ups(listener)

        assert wait_for(received, timeout=5, message="NOTIFY after commit") == ["images"]
        listener.notifies.clear()
        enqueue(conn, Job("future", queue="images", delay=60))  # not ready: no wake-up
        conn.commit()
        assert select.select([listener], [], [], 0.2)[0] == []

        # bulk, all ready (the fast path): one wake-up per queue
        enqueue_many(conn, [Job("a", queue="q1"), Job("b", queue="q2"), Job("c", queue="q1")])
        conn.commit()
        assert sorted(wait_for(lambda: received() if len(received()) >= 2 else None, timeout=5,
                               message="bulk NOTIFY")) == ["q1", "q2"]
        listener.notifies.clear()
        # bulk, mixed: only the queue that got a ready job is woken
        enqueue_many(conn, [Job("d", queue="q3"), Job("e", queue="q4", delay=60)])
        conn.commit()
        assert wait_for(received, timeout=5, message="mixed bulk NOTIFY") == ["q3"]
        assert select.select([listener], [], [], 0.2)[0] == [] and received() == ["q3"]


def test_task_defaults_apply_to_plain_jobs(conn, dsn) -> None:
    @awa_pool.task("test_producer_defaults", queue="tq", priority=1, max_attempts=4, timeout=30)
    def handler() -> None:
        pass

    plain = enqueue(conn, Job("test_producer_defaults"))
    override = enqueue(conn, Job("test_producer_defaults", queue="other", priority=3))
    via_task = handler.enqueue(conn)
    conn.commit()
    row = job_row(dsn, plain)
    assert (row["queue"], row["priority"], row["max_attempts"], row["timeout_s"]) == ("tq", 1, 4, 30.0)
    row = job_row(dsn, override)
    assert (row["queue"], row["priority"], row["max_attempts"]) == ("other", 3, 4)
    assert job_row(dsn, via_task)["queue"] == "tq"


def test_bulk_path_matches_insert_job_row_for_row(conn, dsn) -> None:
    """enqueue_many's rows (awa.insert_jobs, set-based) must be the rows
    awa.insert_job writes one at a time, whatever the payload holds."""
    BULK = 64

    nasty = {"tab": "a\tb", "newline": "x\ny", "backslash": "c:\\dir\\", "quote": 'say "hi"',
             "unicode": "ünï ✓ \U0001F600", "empty": "", "nested": {"l": [1, None, "\\N"]}}
    past = datetime.now(timezone.utc) - timedelta(minutes=5)
    future = datetime.now(timezone.utc) + timedelta(hours=1)
    variants = [
        lambda i: Job("copy", dict(nasty, i=i), queue="q", priority=1 + i % 4, max_attempts=3,
                      timeout=2.5, tags=["t\t1", 'q"2', "\\3"], metadata={"m\n": "v\t"},
                      ordering_key=f"key\t{i}"),
        lambda i: Job("copy", {"i": i}, delay=120),
        lambda i: Job("copy", {"i": i}, run_at=past),
        lambda i: Job("copy", {"i": i}, run_at=future),
        lambda i: Job("copy", {"i": i}, unique=Unique()),
    ]
    jobs = [variants[i % len(variants)](i) for i in range(BULK * 5)]
    ids = enqueue_many(conn, jobs)
    conn.commit()
    assert len(set(ids)) == len(jobs)
    columns = ("kind", "queue", "args", "state", "priority", "max_attempts", "timeout_s", "tags",
               "metadata", "lane", "ordering_key", "attempt", "lease", "batch_id")
    for job, job_id in zip(jobs[:len(variants) * 3], ids):
        copied = job_row(dsn, job_id)
        with conn.cursor() as cur:
            cur.execute("DELETE FROM awa.unique_keys")
        raw_id = enqueue(conn, job)  # one at a time: through awa.insert_job
        conn.commit()
        single = job_row(dsn, raw_id)
        for column in columns:
            assert copied[column] == single[column], (column, copied[column], single[column])
        assert copied["args"]["i"] == job.args["i"]
        if job.run_at is not None:
            assert abs((copied["run_at"] - job.run_at).total_seconds()) < 0.001
        elif job.delay:
            waited = (copied["run_at"] - copied["created_at"]).total_seconds()
            assert 119.5 < waited < 121


def assert_rows_as_insert_job_writes(conn, dsn: str, jobs: List[Job], ids: List[int]) -> None:
    """Each bulk-inserted row equals the row awa.insert_job writes for the
    same Job (enqueued again, one at a time)."""
    columns = ("kind", "queue", "args", "state", "priority", "max_attempts", "timeout_s", "tags",
               "metadata", "lane", "ordering_key", "attempt", "lease", "batch_id", "run_at")
    for job, job_id in zip(jobs, ids):
        bulk = job_row(dsn, job_id)
        single_id = enqueue(conn, job)
        conn.commit()
        single = job_row(dsn, single_id)
        for column in columns:
            if column == "run_at":  # now() of two transactions
                assert abs((bulk[column] - single[column]).total_seconds()) < 60
            else:
                assert bulk[column] == single[column], (column, bulk[column], single[column])


def test_ready_fast_path_matches_insert_job_row_for_row(conn, dsn) -> None:
    """A bulk of ready, non-unique jobs takes awa.insert_ready_jobs; its rows
    must equal awa.insert_job's, and its ids follow the input order."""
    variants = [
        lambda i: Job("fast", {"i": i, "s": "ünï\t\\"}, queue="fq", priority=1 + i % 4, max_attempts=3,
                      timeout=1.5, tags=["a", 'b"'], metadata={"m": [i]}, ordering_key=f"k{i}"),
        lambda i: Job("fast", {"i": i}),
    ]
    jobs = [variants[i % 2](i) for i in range(500)]
    ids = enqueue_many(conn, jobs)
    conn.commit()
    rows = dict(query(dsn, "SELECT id, (args->>'i')::int FROM awa.jobs"))
    assert [rows[job_id] for job_id in ids] == list(range(500))
    assert_rows_as_insert_job_writes(conn, dsn, jobs[:4], ids)


def test_bulk_path_respects_sharded_queues(conn, dsn) -> None:
    from awa_pool import set_queue_shards

    BULK = 64

    set_queue_shards(conn, "sharded", 4)
    jobs = [Job("s", {"i": i}, queue="sharded", ordering_key=f"k{i % 8}") for i in range(BULK)]
    jobs += [Job("p", {"i": i}, queue="plain") for i in range(BULK)]
    ids = enqueue_many(conn, jobs)
    conn.commit()
    lanes = dict(query(dsn, "SELECT ordering_key, count(DISTINCT lane) FROM awa.jobs "
                            "WHERE queue = 'sharded' GROUP BY 1"))
    assert lanes == {f"k{k}": 1 for k in range(8)}  # one lane per key
    assert scalar(dsn, "SELECT count(DISTINCT lane) FROM awa.jobs WHERE queue = 'sharded'") > 1
    assert scalar(dsn, "SELECT max(lane) FROM awa.jobs WHERE queue = 'plain'") == 0
    rows = dict(query(dsn, "SELECT id, (args->>'i')::int FROM awa.jobs"))
    assert [rows[i] for i in ids] == [i for i in range(BULK)] * 2


def test_uniform_fast_path_matches_insert_job_row_for_row(conn, dsn) -> None:
    """A chunk of one shape (kind, queue, priority, attempts, timeout, ready,
    nothing but args) takes awa.insert_uniform_jobs: the rows must equal
    awa.insert_job's, ids follow the input order, a sharded queue's jobs
    spread over its lanes, and the queue is woken once, at commit."""
    from awa_pool import set_queue_shards

    set_queue_shards(conn, "uniform_sharded", 4)
    conn.commit()
    nasty = {"tab": "a\tb", "backslash": "c:\\dir\\", "quote": 'say "hi"', "unicode": "ünï ✓ \U0001F600",
             "nested": {"l": [1, None, "\\N"]}}
    jobs = [Job("uni", dict(nasty, i=i), queue="uq", priority=1, max_attempts=3, timeout=2.5)
            for i in range(300)]
    assert len({job.bulk_shape() for job in jobs}) == 1
    with awa_jobs_listener(dsn) as listener:
        ids = enqueue_many(conn, jobs)
        assert select.select([listener], [], [], 0.2)[0] == []  # nothing before commit
        conn.commit()
        assert wait_for(lambda: wake_ups(listener), timeout=5,
                        message="NOTIFY after the uniform insert") == ["uq"]
    rows = dict(query(dsn, "SELECT id, (args->>'i')::int FROM awa.jobs"))
    assert [rows[job_id] for job_id in ids] == list(range(300)) and ids == sorted(ids)
    assert_rows_as_insert_job_writes(conn, dsn, jobs[:3], ids)
    enqueue_many(conn, [Job("uni", {"i": i}, queue="uniform_sharded") for i in range(200)])
    conn.commit()
    assert scalar(dsn, "SELECT count(DISTINCT lane) FROM awa.jobs WHERE queue = 'uniform_sharded'") > 1
    assert scalar(dsn, "SELECT max(lane) FROM awa.jobs WHERE queue = 'uq'") == 0


def _bulk_functions_called(conn, jobs: List[Job]) -> tuple:
    """enqueue_many in the connection's transaction; returns the ids and
    which awa functions it called, as the server counted them (counts not
    yet reported may carry over from earlier transactions: the difference)."""
    def calls() -> dict:
        with conn.cursor() as cur:
            cur.execute("SELECT funcname, calls FROM pg_stat_xact_user_functions WHERE schemaname = 'awa'")
            return dict(cur.fetchall())

    with conn.cursor() as cur:
        cur.execute("SET LOCAL track_functions = 'all'")
    before = calls()
    ids = enqueue_many(conn, jobs)
    called = {name: n - before.get(name, 0) for name, n in calls().items() if n > before.get(name, 0)}
    conn.commit()
    return ids, called


def test_jobs_sharing_tags_and_metadata_still_take_the_uniform_path(conn, dsn) -> None:
    """A traced enqueue_many stamps one traceparent on every job, and a bulk
    producer tags a whole import: such a chunk goes args-only
    (awa.insert_uniform_jobs, tags and metadata sent once), and its rows
    equal awa.insert_job's. Jobs whose metadata differ keep their own."""
    shared = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
              "nested": {"ünï": [1, None, 'q"t']}}
    jobs = [Job("tagged", {"i": i}, queue="tq", tags=["import", 'b"\\'], metadata=shared) for i in range(300)]
    ids, called = _bulk_functions_called(conn, jobs)
    assert called.get("insert_uniform_jobs") == 1 and "insert_ready_jobs" not in called, called
    rows = {row[0]: row[1:] for row in query(dsn, "SELECT id, (args->>'i')::int, tags, metadata FROM awa.jobs")}
    assert [rows[job_id] for job_id in ids] == [(i, ["import", 'b"\\'], shared) for i in range(300)]
    assert_rows_as_insert_job_writes(conn, dsn, jobs[:2], ids)

    mixed = [Job("tagged", {"i": i}, queue="mq", metadata={"n": i % 2}) for i in range(4)]
    ids, called = _bulk_functions_called(conn, mixed)
    assert "insert_uniform_jobs" not in called and called.get("insert_ready_jobs") == 1, called
    stored = dict(query(dsn, "SELECT id, metadata FROM awa.jobs WHERE queue = 'mq'"))
    assert [stored[job_id] for job_id in ids] == [{"n": 0}, {"n": 1}, {"n": 0}, {"n": 1}]


def test_a_chunk_of_several_shapes_keeps_each_job_s_own_fields(conn, dsn) -> None:
    jobs = [Job("shape", {"i": i}, priority=1 + i % 2) for i in range(10)]
    jobs.append(Job("shape", {"i": 10}, tags=["t"]))
    ids = enqueue_many(conn, jobs)
    conn.commit()
    stored = {row[0]: row[1:] for row in query(
        dsn, "SELECT id, (args->>'i')::int, priority, tags FROM awa.jobs")}
    assert [stored[job_id] for job_id in ids] == [
        (i, 1 + i % 2, []) for i in range(10)] + [(10, 2, ["t"])]
