"""Queue reads that stay flat (migration 0025). Above a big backlog the
reads that count live jobs (queue_stats, queue_depth, `awa-pool queues`,
the dashboard, the queue gauges) read the leader's census instead of
counting, say how old it is, and count again when the backlog is small or
no leader keeps the census fresh; the recent finishes read at most the
newest 10,000. Thresholds are lowered here so that a few jobs stand for a
big backlog or a fast drain; what it saves is measured in
scripts/bench/scale.py (curve "live") and docs/benchmarks.md."""
from __future__ import annotations

import html

import apps.basic  # noqa: F401  (registers "add" for drain)
import awa_pool
from awa_pool import Job
from awa_pool.dashboard import create_app
from awa_pool.worker.maintenance import LiveCensus
from cli_run import ok
from awa_pool import testing
from helpers import connection, query, scalar, wait_for


def _census(dsn: str) -> float:
    """The leader's census, as its maintenance service takes it; returns its
    interval afterwards (when the next one is due)."""
    service = LiveCensus()
    with connection(dsn, autocommit=True) as conn, conn.cursor() as cur:
        assert service.tick(cur) == 1
    return service.interval


def _exact_below(dsn: str, jobs: int) -> None:
    with connection(dsn) as conn, conn.cursor() as cur:
        cur.execute("UPDATE awa.live_census_meta SET exact_below = %s", (jobs,))
        conn.commit()


def _counts(conn) -> dict:
    stats = {row.queue: (row.available, row.scheduled, row.counts_age_s > 0) for row in awa_pool.queue_stats(conn)}
    conn.rollback()
    return stats


def test_above_the_threshold_reads_use_the_census_and_say_how_old_it_is(conn, dsn) -> None:
    awa_pool.enqueue_many(conn, [Job("k", queue="q1") for _ in range(30)]
                          + [Job("k", queue="q2", delay=600) for _ in range(5)])
    conn.commit()
    _exact_below(dsn, 20)
    # no census yet: counted now
    assert _counts(conn) == {"q1": (30, 0, False), "q2": (0, 5, False)}
    assert _census(dsn) == 2.0   # a quick count: the shortest period
    assert scalar(dsn, "SELECT jobs FROM awa.live_census_meta") == 35

    awa_pool.enqueue_many(conn, [Job("k", queue="q1") for _ in range(7)])
    conn.commit()
    # the census's numbers, not the table's, and their age
    assert _counts(conn) == {"q1": (30, 0, True), "q2": (0, 5, True)}
    depth = awa_pool.queue_depth(conn, ["q1", "q3"])
    conn.rollback()
    assert (depth["q1"].available, depth["q3"].total) == (30, 0)
    assert depth["q1"].counts_age_s > 0 and depth["q3"].counts_age_s == depth["q1"].counts_age_s
    lag = {row.queue: row.lag_seconds for row in awa_pool.queue_stats(conn)}
    conn.rollback()
    assert lag["q1"] > 0 and lag["q2"] == 0      # from the census's oldest available job
    shown = ok("queues", "--database-url", dsn)
    assert "live counts as of the leader's census" in shown, shown
    assert '"counts_age_s"' in ok("queues", "--json", "--database-url", dsn)
    page = create_app(dsn).test_client().get("/fragment/overview")
    assert page.status_code == 200 and "live counts as of the leader's census" in html.unescape(page.text), page.text

    _census(dsn)
    assert _counts(conn) == {"q1": (37, 0, True), "q2": (0, 5, True)}


def test_a_small_backlog_or_a_stale_census_is_counted_for_each_read(conn, dsn) -> None:
    awa_pool.enqueue_many(conn, [Job("k", queue="q1") for _ in range(12)])
    conn.commit()
    _exact_below(dsn, 20)
    _census(dsn)   # 12 live jobs: below the threshold
    awa_pool.enqueue(conn, Job("k", queue="q1"))
    conn.commit()
    assert _counts(conn) == {"q1": (13, 0, False)}
    assert "census" not in ok("queues", "--database-url", dsn)

    _exact_below(dsn, 10)
    _census(dsn)
    awa_pool.enqueue(conn, Job("k", queue="q1"))
    conn.commit()
    assert _counts(conn) == {"q1": (13, 0, True)}
    # no leader retook it for longer than three periods and 10 s: counted again
    with connection(dsn) as other, other.cursor() as cur:
        cur.execute("UPDATE awa.live_census_meta SET counted_at = counted_at - interval '17 seconds'")
        other.commit()
    assert _counts(conn) == {"q1": (14, 0, False)}


def test_the_census_reads_need_no_table_privileges(dsn) -> None:
    # queue_stats and queue_depth read the census through SECURITY DEFINER
    # functions: a worker role never needs the census tables themselves
    assert scalar(dsn, "SELECT bool_and(p.prosecdef) FROM pg_proc p WHERE p.oid IN "
                       "('awa.live_counts(text[])'::regprocedure, 'awa.take_live_census()'::regprocedure)")


def test_a_running_leader_keeps_the_census(pools, dsn) -> None:
    with connection(dsn) as conn:
        awa_pool.enqueue_many(conn, [Job("k", queue="elsewhere") for _ in range(9)])
        conn.commit()
    pools.start("--queue", "default", workers=1)
    wait_for(lambda: scalar(dsn, "SELECT jobs FROM awa.live_census_meta WHERE counted_at IS NOT NULL") == 9,
             timeout=60, message="the leader to take a census of the 9 live jobs")


def test_recent_finishes_are_exact_below_the_cap_and_a_rate_above_it(conn, dsn) -> None:
    ids = awa_pool.enqueue_many(conn, [Job("add", {"a": n, "b": 1}, queue="q1") for n in range(10)])
    conn.commit()
    assert sorted(testing.drain(conn, "q1")) == [(i, "completed") for i in ids]
    conn.commit()
    with connection(dsn) as other, other.cursor() as cur:   # finished 0, 2, 4, ... 18 seconds ago
        cur.execute("UPDATE awa.jobs_done d SET finalized_at = now() - make_interval(secs => 2 * r.i) "
                    "FROM (SELECT id, row_number() OVER (ORDER BY id) - 1 AS i FROM awa.jobs_done) r "
                    "WHERE d.id = r.id")
        other.commit()

    def recent(cap: int) -> tuple:
        return tuple(query(dsn, "SELECT * FROM awa.recent_finishes('q1', %s)", (cap,))[0])

    assert recent(100) == (5, 10)                  # every finish in the window: exact
    stats = {row.queue: row for row in awa_pool.queue_stats(conn)}
    conn.rollback()
    assert (stats["q1"].finished_10s, stats["q1"].finished_60s) == (5, 10)
    # the newest 8 reach back 14 s: the 10 s count stays exact; the minute
    # is their rate (8 in 14 s) over the 18 s since its first finish
    ten, minute = recent(8)
    assert ten == 5 and minute == 10
    # the newest 3 reach back 4 s: both are their rate (3 in 4 s), over
    # 10 s and over the 18 s since the first finish
    ten, minute = recent(3)
    assert 7 <= ten <= 8 and 13 <= minute <= 14
