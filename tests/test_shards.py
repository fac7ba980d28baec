"""Partitioned FIFO: a queue's shards split it into lanes that are each
strict FIFO; an ordering key pins related jobs to one lane."""
from __future__ import annotations

import subprocess
import sys

import psycopg2
import pytest

from awa_pool import Job, set_queue_shards
from helpers import enqueue_jobs, query, scalar, states, wait_for


def _conn(dsn):
    return psycopg2.connect(dsn)


def _shard(dsn, queue, shards):
    conn = _conn(dsn)
    try:
        moved = set_queue_shards(conn, queue, shards)
        conn.commit()
        return moved
    finally:
        conn.close()


def test_keys_pin_lanes_and_unkeyed_jobs_spread(dsn):
    _shard(dsn, "hot", 4)
    enqueue_jobs(dsn, [Job("noop", {"k": k, "i": i}, queue="hot", ordering_key=f"customer-{k}")
                   for i in range(5) for k in range(12)])
    lanes_per_key = query(dsn, "SELECT ordering_key, count(DISTINCT lane) FROM awa.jobs GROUP BY 1")
    assert all(count == 1 for _, count in lanes_per_key)
    assert scalar(dsn, "SELECT count(DISTINCT lane) FROM awa.jobs") > 1
    enqueue_jobs(dsn, [Job("noop", {"free": i}, queue="hot") for i in range(200)])
    used = scalar(dsn, "SELECT count(DISTINCT lane) FROM awa.jobs WHERE ordering_key IS NULL")
    assert used == 4, "jobs without a key spread over every lane"


def test_one_shard_ignores_the_key(dsn):
    enqueue_jobs(dsn, [Job("noop", queue="plain", ordering_key=f"k{i}") for i in range(20)])
    assert query(dsn, "SELECT DISTINCT lane FROM awa.jobs") == [(0,)]


def test_changing_shards_moves_waiting_jobs_and_strands_none(dsn, pools):
    _shard(dsn, "hot", 8)
    ids = enqueue_jobs(dsn, [Job("noop", {"i": i}, queue="hot", ordering_key=f"k{i % 5}") for i in range(40)])
    assert scalar(dsn, "SELECT max(lane) FROM awa.jobs") > 0
    assert _shard(dsn, "hot", 1) == 40
    assert query(dsn, "SELECT DISTINCT lane FROM awa.jobs") == [(0,)]
    assert _shard(dsn, "hot", 3) == 40
    assert scalar(dsn, "SELECT max(lane) FROM awa.jobs") <= 2
    pools.start("--queue", "hot", workers=2)
    wait_for(lambda: states(dsn) == {"completed": 40}, timeout=30, message="every job, from every lane")
    del ids


def test_bad_shard_counts_are_refused(dsn):
    conn = _conn(dsn)
    try:
        for bad in (0, 65, "4", True, 2.0):
            with pytest.raises(ValueError, match="shards must be an int from 1 to 64"):
                set_queue_shards(conn, "hot", bad)
        assert conn.get_transaction_status() == 0
    finally:
        conn.close()


@pytest.mark.xdist_group("cpu")
def test_jobs_sharing_a_key_are_claimed_in_enqueue_order_by_four_supervisors(dsn, pools):
    _shard(dsn, "hot", 4)
    keys, per_key = 16, 40
    for _ in range(4):
        pools.start("--queue", "hot", workers=2)
    wait_for(lambda: scalar(dsn, "SELECT count(*) FROM awa.supervisors WHERE stopped_at IS NULL") == 4,
             timeout=30, message="4 supervisors up")
    enqueue_jobs(dsn, [Job("sleep", {"seconds": 0.002}, queue="hot", ordering_key=f"order-{k}")
                   for i in range(per_key) for k in range(keys)])
    total = keys * per_key
    wait_for(lambda: states(dsn) == {"completed": total}, timeout=60, message=f"{total} keyed jobs")
    rows = query(dsn, "SELECT ordering_key, id, attempted_at, supervisor_id FROM awa.jobs "
                      "WHERE attempt = 1 ORDER BY ordering_key, attempted_at, id")
    assert len(rows) == total
    by_key = {}
    for key, job_id, _, _ in rows:
        by_key.setdefault(key, []).append(job_id)
    for key, ids in by_key.items():
        assert ids == sorted(ids), f"{key} was claimed out of enqueue order"
    assert len({row[3] for row in rows}) >= 2, "several supervisors took part"


def test_cli_sets_shards(dsn):
    enqueue_jobs(dsn, [Job("noop", queue="hot", ordering_key="a")])
    result = subprocess.run([sys.executable, "-m", "awa_pool", "queues", "set", "hot", "--shards", "4",
                             "--database-url", dsn], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "4 lane(s)" in result.stdout
    assert scalar(dsn, "SELECT shards FROM awa.queues WHERE name = 'hot'") == 4
    bad = subprocess.run([sys.executable, "-m", "awa_pool", "queues", "set", "hot", "--shards", "0",
                          "--database-url", dsn], capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and len(bad.stderr.strip().splitlines()) == 1
    assert "Traceback" not in bad.stderr
