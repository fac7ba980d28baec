"""The running counts of terminal history (awa.done_counts and
awa.done_kinds, migration 0019):
exact after every way history changes, per-session rows folded by the
rotation, and the operator reads built on them (queue_stats, kind_stats)
agreeing with a count of the rows themselves without reading them all."""
from __future__ import annotations

import json
import re
from typing import Any, Callable, Dict, List, Tuple

import psycopg2
import pytest

import awa_pool
from awa_pool import Job
from awa_pool.ops.stats import kind_stats
from helpers import query, scalar

FAILURES = ("failed", "fatal", "retry", "lost", "deadline", "callback_timeout")

# The rules of `awa-pool kinds`, applied to the rows: a terminal job's own
# attempt counts when it was attempted and has figures or failed (its
# outcome: its state, a failed job's the kind of its last error), and each
# attempt_log entry counts with its own outcome.
RECOUNT_KINDS = """
WITH attempts AS (
    SELECT kind, CASE WHEN state = 'failed' THEN coalesce(errors -> -1 ->> 'kind', 'failed')
                      WHEN state = 'cancelled' THEN 'cancel' ELSE state::text END AS outcome
      FROM awa.jobs_done WHERE attempted_at IS NOT NULL AND (wall_s IS NOT NULL OR state = 'failed')
    UNION ALL
    SELECT kind, e ->> 'outcome' FROM awa.jobs_done, jsonb_array_elements(attempt_log) e
     WHERE attempt_log IS NOT NULL
)
SELECT kind, count(*), count(*) FILTER (WHERE outcome = 'completed'),
       count(*) FILTER (WHERE outcome = ANY (%(failures)s)),
       count(*) FILTER (WHERE outcome = 'crash'), count(*) FILTER (WHERE outcome = 'timeout')
  FROM attempts GROUP BY kind"""

ROLLED_KINDS = """
SELECT kind, sum(runs), sum(ok), sum(failures), sum(crashes), sum(timeouts)
  FROM awa.done_kinds GROUP BY kind HAVING sum(runs) <> 0"""


def check_counts(dsn: str) -> None:
    """awa.done_counts and awa.done_kinds say what a count of awa.jobs_done says."""
    rows = dict(((q, s), n) for q, s, n in query(
        dsn, "SELECT queue, state::text, count(*) FROM awa.jobs_done GROUP BY 1, 2"))
    rolled = dict(((q, s), n) for q, s, n in query(
        dsn, "SELECT queue, state::text, sum(jobs) FROM awa.done_counts GROUP BY 1, 2 HAVING sum(jobs) <> 0"))
    assert rolled == rows
    recount = {k: tuple(v) for k, *v in query(dsn, RECOUNT_KINDS, {"failures": list(FAILURES)})}
    kinds = {k: tuple(int(x) for x in v) for k, *v in query(dsn, ROLLED_KINDS)}
    assert kinds == recount


def history_rows_read(dsn: str, read: Callable[[Any], Any]) -> Tuple[Any, int]:
    """read(conn)'s result, and how many rows of awa.jobs_done it read (the
    transaction's own counters of every ring segment)."""
    conn = psycopg2.connect(dsn)
    try:
        result = read(conn)
        with conn.cursor() as cur:
            cur.execute("SELECT sum(pg_stat_get_xact_tuples_fetched(i.inhrelid) "
                        "+ pg_stat_get_xact_tuples_returned(i.inhrelid)) "
                        "FROM pg_inherits i WHERE i.inhparent = 'awa.jobs_done'::regclass")
            return result, cur.fetchone()[0]
    finally:
        conn.close()


def claim(dsn: str, queue: str, count: int) -> Dict[int, int]:
    return dict(query(dsn, "SELECT id, lease FROM awa.claim(%s, %s, 1)", (queue, count)))


def complete(dsn: str, leases: Dict[int, int], wall: float = 0.2) -> None:
    ids = list(leases)
    query(dsn, "SELECT * FROM awa.complete_jobs(%s, %s, %s::real[], %s::real[], %s)",
          (ids, [leases[i] for i in ids], [wall] * len(ids), [wall / 2] * len(ids), [50_000_000] * len(ids)))


def settle(dsn: str, outcomes: List[dict]) -> None:
    query(dsn, "SELECT * FROM awa.settle_jobs(%s::jsonb)", (json.dumps(outcomes),))


def rotate(dsn: str, keep_completed_s: float, keep_failed_s: float) -> Tuple:
    return query(dsn, "SELECT rotated, dropped, carried FROM awa.rotate_done_ring(%s, %s, %s, '200ms', 0)",
                 (keep_completed_s, keep_failed_s, keep_failed_s))[0]


def test_counts_stay_exact_through_every_change_of_history(auto, dsn: str) -> None:
    awa_pool.enqueue_many(auto, [Job("resize", queue="images") for _ in range(6)]
                          + [Job("mail", queue="emails", max_attempts=1) for _ in range(6)]
                          + [Job("flaky", queue="images", max_attempts=3) for _ in range(4)])
    check_counts(dsn)
    images, emails = claim(dsn, "images", 10), claim(dsn, "emails", 6)
    resize = [i for i in images if scalar(dsn, "SELECT kind FROM awa.jobs_hot WHERE id = %s", (i,)) == "resize"]
    flaky = [i for i in images if i not in resize]
    complete(dsn, {i: images[i] for i in resize[:4]})
    mail = list(emails)
    settle(dsn, [{"id": mail[0], "lease": emails[mail[0]], "outcome": "crash", "error": "signal 9"},
                 {"id": mail[1], "lease": emails[mail[1]], "outcome": "timeout", "error": "300 s"},
                 {"id": mail[2], "lease": emails[mail[2]], "outcome": "failed", "error": "boom", "wall_s": 0.1},
                 {"id": mail[3], "lease": emails[mail[3]], "outcome": "cancel", "wall_s": 0.3},
                 {"id": resize[4], "lease": images[resize[4]], "outcome": "fatal", "error": "bad args",
                  "wall_s": 0.2}]
           + [{"id": i, "lease": images[i], "outcome": "retry", "delay_s": 0, "error": "again",
               "wall_s": 0.05} for i in flaky])
    check_counts(dsn)
    again = claim(dsn, "images", 10)  # the retried ones, with an attempt_log entry each
    assert set(again) == set(flaky)
    complete(dsn, {i: again[i] for i in flaky[:3]})
    settle(dsn, [{"id": flaky[3], "lease": again[flaky[3]], "outcome": "failed", "error": "x", "wall_s": 0.1}])
    check_counts(dsn)
    assert awa_pool.cancel_job(auto, resize[5]).value == "cancelled"   # running: no figures of its own
    assert awa_pool.retry_job(auto, mail[0]).value == "available"        # out of history again
    check_counts(dsn)
    auto.cursor().execute("DELETE FROM awa.jobs_done WHERE id = %s", (mail[1],))  # an operator's purge
    auto.cursor().execute("UPDATE awa.jobs_done SET queue = 'moved' WHERE id = %s", (mail[2],))
    check_counts(dsn)
    for _ in range(8):  # once round the ring: completed rows dropped, failed ones carried
        rotate(dsn, 0.0, 3600.0)
        check_counts(dsn)
    assert scalar(dsn, "SELECT count(*) FROM awa.jobs_done WHERE state = 'completed'") == 0
    auto.cursor().execute("TRUNCATE awa.jobs_done")
    check_counts(dsn)
    assert scalar(dsn, "SELECT (SELECT count(*) FROM awa.done_counts) + (SELECT count(*) FROM awa.done_kinds)") == 0


def test_each_session_writes_its_own_rows_and_the_rotation_folds_them(dsn: str) -> None:
    producer = psycopg2.connect(dsn)
    producer.autocommit = True
    awa_pool.enqueue_many(producer, [Job("k", queue="q") for _ in range(4)])
    producer.close()
    leases = claim(dsn, "q", 4)
    ids = sorted(leases)
    complete(dsn, {i: leases[i] for i in ids[:2]})   # query() opens a session per call:
    complete(dsn, {i: leases[i] for i in ids[2:]})   # two sessions, two slots
    slots = query(dsn, "SELECT slot, jobs FROM awa.done_counts WHERE queue = 'q' ORDER BY slot")
    assert len(slots) == 2 and all(slot != 0 and jobs == 2 for slot, jobs in slots)
    current = scalar(dsn, "SELECT current FROM awa.done_ring")
    assert rotate(dsn, 3600.0, 3600.0)[0]   # nothing dropped: the rows keep their segment
    assert query(dsn, "SELECT segment, slot, jobs FROM awa.done_counts WHERE queue = 'q'") == [(current, 0, 4)]
    check_counts(dsn)


def test_queue_stats_and_kind_stats_agree_with_the_rows(auto, dsn: str) -> None:
    awa_pool.enqueue_many(auto, [Job("a", queue="one") for _ in range(5)] + [Job("b", queue="two")])
    leases = claim(dsn, "one", 5)
    ids = sorted(leases)
    complete(dsn, {i: leases[i] for i in ids[:3]}, wall=0.4)
    settle(dsn, [{"id": ids[3], "lease": leases[ids[3]], "outcome": "retry", "delay_s": 3600,
                  "error": "later", "wall_s": 0.1}])   # live, with one earlier attempt
    stats = {s.queue: s for s in awa_pool.queue_stats(auto)}
    assert (stats["one"].completed, stats["one"].running, stats["one"].retryable) == (3, 1, 1)
    assert stats["two"].available == 1 and stats["two"].completed == 0
    assert stats["one"].finished_60s == 3
    kinds = {k.kind: k for k in kind_stats(auto)}
    assert (kinds["a"].runs, kinds["a"].completed, kinds["a"].failures) == (4, 3, 1)
    assert kinds["a"].wall_p50 == pytest.approx(0.4) and kinds["a"].sampled == 3
    windowed = {k.kind: k for k in kind_stats(auto, since_s=3600.0)}
    assert (windowed["a"].runs, windowed["a"].failures) == (4, 1)
    assert "b" not in kinds  # never ran


def test_kind_stats_reads_a_bounded_sample_not_all_of_history(auto, dsn: str) -> None:
    """3 kinds x 400 finished jobs: without a window the figures read each
    kind's latest 50 rows (sample=50), the counts still cover all 1,200."""
    auto.cursor().execute("""
        INSERT INTO awa.jobs_done (id, kind, queue, state, attempt, attempted_at, finalized_at,
                                   wall_s, cpu_s, peak_rss, segment)
        SELECT nextval('awa.job_id_seq'), 'k' || (g % 3), 'q', 'completed', 1,
               now() - make_interval(secs => g + 1), now() - make_interval(secs => g),
               g, g / 2.0, 1000, (SELECT current FROM awa.done_ring)
          FROM generate_series(1, 1200) g""")
    auto.cursor().execute("ANALYZE awa.jobs_done")
    for since_s in (None, 600.0):   # everything; the last 10 minutes (about 600 of the jobs)
        kinds, read = history_rows_read(dsn, lambda conn: kind_stats(conn, sample=50, since_s=since_s))
        assert [(k.kind, k.sampled) for k in kinds] == [("k0", 50), ("k1", 50), ("k2", 50)]
        assert read <= 3 * 50 + 10, f"kind_stats read {read} history rows"
        if since_s is None:
            assert [k.runs for k in kinds] == [400, 400, 400]
        else:  # counted in whole minutes: the window's first minute counts whole
            assert all(200 <= k.runs <= 220 for k in kinds), [k.runs for k in kinds]
    # the latest 50 of k1 finished 1..148 s ago (g = 1, 4, ..., 148): wall p50 is their median
    assert next(k for k in kinds if k.kind == "k1").wall_p50 == pytest.approx(74.5)


def test_list_jobs_age_filters_read_only_the_ids_of_that_age(auto, dsn) -> None:
    """3,000 finished jobs created a minute apart: each age filter gives the
    exact jobs, and a deep page reads about a page of rows, not every newer
    job."""
    auto.cursor().execute("""
        INSERT INTO awa.jobs_done (id, kind, queue, state, created_at, finalized_at, segment)
        SELECT nextval('awa.job_id_seq'), 'k', 'q', 'completed',
               now() - make_interval(mins => 3000 - g), now() - make_interval(mins => 3000 - g),
               (SELECT current FROM awa.done_ring)
          FROM generate_series(1, 3000) g""")
    auto.cursor().execute("ANALYZE awa.jobs_done")
    newest = scalar(dsn, "SELECT max(id) FROM awa.jobs_done")
    for minutes in (0, 1, 30, 1500, 2999, 3001):
        rows = awa_pool.list_jobs(auto, limit=10, older_than=minutes * 60 + 30)
        expected = [newest - minutes - 1 - i for i in range(10) if newest - minutes - 1 - i > newest - 3000]
        assert [r.id for r in rows] == expected, minutes
        newer = awa_pool.list_jobs(auto, limit=5000, newer_than=minutes * 60 + 30)
        assert len(newer) == min(minutes + 1, 3000), minutes
    _, read = history_rows_read(dsn, lambda conn: awa_pool.list_jobs(conn, limit=10, older_than=1500 * 60 + 30))
    assert read < 400, f"a page 1,500 jobs deep read {read} rows"  # a page, the 10 min slack, the search


def test_the_insert_triggers_written_out_statement_is_the_shared_one(dsn: str) -> None:
    """count_done() runs inserts (every completion flush) as a statement
    written out in its body, for a cached plan, and every other change
    through awa.done_counts_sql(): the two must count the same way."""
    def words(sql: str) -> str:
        return " ".join(sql.replace("(", " ( ").replace(")", " ) ").replace(";", " ").split())

    shared = scalar(dsn, "SELECT format(awa.done_counts_sql(), 'new_rows', 1)")
    body = scalar(dsn, "SELECT prosrc FROM pg_proc WHERE oid = 'awa.count_done()'::regprocedure")
    insert = body.split("IF TG_OP = 'INSERT' THEN", 1)[1]
    written, light = re.split(r"\n\s*ELSE\n", insert.split("attempt_log IS NOT NULL) THEN", 1)[1], maxsplit=2)[:2]
    assert words(written) == words(shared.replace("1 * ", ""))
    # Rows without an attempt_log (0023): the same statement less its logged part.
    light = re.sub(r"--[^\n]*\n", "", light.split("END IF;", 1)[0])
    shared_light = shared.replace("1 * ", "")
    shared_light = shared_light[:shared_light.index("logged AS (")] + shared_light[shared_light.index("jobs AS ("):]
    shared_light = re.sub(r"FROM \(SELECT segment, kind, minute, runs.*?\) x", "FROM own", shared_light, flags=re.S)
    assert words(light) == words(shared_light.replace("sum(finished)", "sum(jobs)"))
