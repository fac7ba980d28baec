"""The floor under a pickup measurement: what the machine itself allows.

While the same fleet drains the same backlog, a bare process that does
nothing else LISTENs on awa_urgent and, for each notice, claims the new
priority-1 jobs of a queue no supervisor serves with one statement (by the
claim index, asynchronous commit, as a supervisor's session writes). The
time from a probe's commit to that statement's return is the least any
queue built on Postgres can do on this machine under this load: an
awa_pool pickup adds a hand-out to a child and the child's start.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import select
import tempfile
import time
from typing import Any, Dict, List, Tuple

import psycopg2

from scale_fleet import paced_probes

FLOOR_QUEUE = "pickup_floor"
TAKE = """DELETE FROM awa.jobs_hot WHERE id IN (
              SELECT id FROM awa.jobs_hot
               WHERE queue = %s AND state = 'available' AND priority = 1
               ORDER BY run_at, id LIMIT 16 FOR UPDATE SKIP LOCKED)
          RETURNING args::text"""


def _listen_and_take(dsn: str, count: int, out: str, ready: Any) -> None:
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    taken: Dict[int, Tuple[float, float]] = {}   # tag -> (notified, taken)
    with conn.cursor() as cur:
        cur.execute("SET synchronous_commit = off")
        cur.execute("LISTEN awa_urgent")
        ready.set()
        deadline = time.monotonic() + 120
        while len(taken) < count and time.monotonic() < deadline:
            if not conn.notifies:   # a notice can arrive while a statement runs
                select.select([conn], [], [], 1.0)
                conn.poll()
            notes = [note for note in conn.notifies if note.payload == FLOOR_QUEUE]
            conn.notifies.clear()
            if not notes:
                continue
            notified = time.time()
            cur.execute(TAKE, (FLOOR_QUEUE,))
            done = time.time()
            for (args,) in cur.fetchall():
                taken[json.loads(args)["tag"]] = (notified, done)
    conn.close()
    with open(out, "w") as f:
        json.dump(taken, f)


def floor_pickups(dsn: str, count: int, rate_hz: float, awa_pool: Any) -> Tuple[List[float], List[float]]:
    """(commit -> notified, commit -> claimed) in ms for `count` probes."""
    out = os.path.join(tempfile.mkdtemp(prefix="awa-floor-"), "taken.json")
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    listener = ctx.Process(target=_listen_and_take, args=(dsn, count, out, ready), daemon=True)
    listener.start()
    try:
        if not ready.wait(30):
            raise TimeoutError("the floor's listener did not start listening in 30 s")
        committed = paced_probes(dsn, FLOOR_QUEUE, count, rate_hz, awa_pool)
        listener.join(130)
        if listener.is_alive() or not os.path.exists(out):
            raise TimeoutError(f"the floor's listener did not take {count} probes")
    finally:
        if listener.is_alive():
            listener.kill()
    with open(out) as f:
        taken = {int(tag): at for tag, at in json.load(f).items()}
    missing = set(committed) - set(taken)
    if missing:
        raise RuntimeError(f"the floor's listener missed {len(missing)} probes")
    return ([1000.0 * (taken[i][0] - committed[i]) for i in committed],
            [1000.0 * (taken[i][1] - committed[i]) for i in committed])
