"""Celery adapter: prefork pool, Redis broker, Redis result backend.

Celery is not Postgres-backed: this adapter lets it be measured on the same
workloads, with the same job body and the same exactly-once checks as the
Postgres queues.  The driver still drops and re-creates the (unused) Postgres
database bench_celery; everything Celery does goes to Redis.

Deployment, as a user would set Celery up for durable CPU-heavy work
---------------------------------------------------------------------
* Broker: Redis, the most common Celery broker, at
  ``redis://127.0.0.1:6379/7`` (override: ``$BENCH_CELERY_BROKER``, Redis URLs
  only).  DB 7 is the adapter's own: ``prepare()`` FLUSHDBs it (and only it)
  before every run.  A queue is a Redis list (kombu's Redis transport);
  ``enqueue`` returns once Redis has answered the LPUSH.  NB: Redis
  durability is a *server* setting the harness does not touch, like Postgres's;
  on the box used so far it had ``appendonly no`` and ``save ""`` (nothing is
  ever written to disk), whereas every Postgres system commits with
  ``fsync=on, synchronous_commit=on``.
* Worker: one harness process (``processes: 1``) running
  ``app.Worker(pool_cls="prefork", concurrency=C, ...).start()`` -- the same
  object ``celery worker`` builds -- which forks C pool children itself
  (like ``baseline``).  Children are in the harness's process group and
  inherit ``$BENCH_REC_DIR``; SIGTERM to the group = Celery's warm shutdown in
  the parent, default action in the children (the harness only stops workers
  after everything has completed).  ``task_acks_late=True`` and
  ``task_reject_on_worker_lost=True`` (a job is acked only after it ran, and
  re-queued if its child dies), JSON serializer, scheduling ``-O fair`` (the
  default since Celery 4), log level WARNING (the CLI default: no per-task log
  lines), ``--without-gossip --without-mingle --without-heartbeat`` (cluster
  chatter that a one-worker benchmark does not need; mingle alone adds ~1 s of
  start-up).  Remote control (pidbox) stays on, as deployed.
* Prefetch: ``worker_prefetch_multiplier=1`` for W3 (CPU jobs) and W5 -- the
  documented setting for long-running tasks ("Prefetch limits": with
  ``acks_late`` and multiplier 1 a worker reserves only as many tasks as it
  has child processes).  The trade-off: a child that finishes waits for the
  parent to ack and BRPOP the next message (one or two Redis round-trips per
  job, ~1 ms on a 25 ms job) instead of taking an already-buffered one.  For
  no-op drains (W2) and the latency test (W4) Celery's default multiplier 4
  is kept (the docs advise the default or higher for many short tasks); no
  sweep was run.

Completion counting (count_jobs)
--------------------------------
Celery keeps no record of a finished job in the broker: with ``acks_late``
the Redis transport deletes the message from its ``unacked`` hash on ack, and
a failed job is acked as well.  The only per-job record Celery itself writes
that says "this task SUCCEEDED" (or FAILED) is the **result backend**, so the
worker runs with ``result_backend = redis://.../7`` (the same DB).  Celery's
tracer in the pool child stores ``celery-task-meta-<task id>`` with
``status: SUCCESS`` (one SETEX+PUBLISH pipeline per job) after the job body
returned, and the parent acks the message afterwards.  That is what
``AsyncResult(id).status`` reports, i.e. "the system says it's done", the
analogue of a ``succeeded`` row in the Postgres systems.  A counter
incremented by the handler would only repeat what the harness's own
per-execution records already say (and the adapter contract forbids handler
counters).  Cost of this choice: one extra Redis round-trip per job in the
worker, which Celery users who run fire-and-forget tasks with
``ignore_result=True`` do not pay (the Postgres systems always write their
completion state).

The producer's app has *no* result backend: with the Redis backend,
``apply_async`` SUBSCRIBEs the producer to every task's result channel
(``RedisBackend.on_task_call``) so that ``.get()`` can wait on it; the harness
never reads results, so that per-enqueue cost would be an artefact of the
counting.  Messages still carry ``ignore_result: false``, and the worker
stores results.

``count_jobs`` SCANs DB 7 for ``celery-task-meta-*`` keys and MGETs only keys
it has not yet seen in a terminal state (cached per driver process, reset by
``prepare``), so each result value is read once; ``completed`` = SUCCESS,
``failed`` = FAILURE + REVOKED, ``queued`` = ready messages (LLEN of the
queues' lists, all priority sub-lists) + reserved-but-unacked messages (HLEN
``unacked``).  Results carry no queue name, so the counts are for the whole
DB: every run starts from FLUSHDB and only uses the queues it passes.
``final_counts`` re-reads and JSON-parses every result as a cross-check.
The result key is written a few ms before the parent's ack; ``unacked`` in the
final counts shows that the acks happened too.  Cost of a poll with 20,000
results in the DB (measured on synthetic keys): ~80 ms for the first one that
reads them all, ~30 ms (the SCAN) after that, vs a few ms for a Postgres
count, so the end of a 20k-job window can be seen up to ~0.1 s late.

Producer
--------
* ``enqueue``: ``task.apply_async(kwargs=payload, queue=q)`` (one LPUSH,
  pooled producer connection).
* ``enqueue_batch`` (W1b and all pre-fills): Celery has no single-call bulk
  insert.  What a Celery user writes for 1,000 jobs is a group:
  ``group(task.s(**p).set(queue=q) for p in chunk).apply_async()`` -- Celery's
  API for dispatching many tasks at once; it publishes all of them through one
  acquired producer, still one LPUSH round-trip per message.  The hand-rolled
  variant (``with app.producer_or_acquire() as p: task.apply_async(...,
  producer=p)`` in a loop) is available with ``$BENCH_CELERY_BULK=producer``.
  A raw Redis pipeline of pre-built messages would be faster but bypasses
  Celery's API, so it is not used.  (Smoke check, 2,000 jobs on a busy box:
  group ~2,200 jobs/s, about the same as one ``apply_async`` per call;
  producer loop ~3,000 jobs/s.)

W5 (weights)
------------
Celery has no queue weights.  Default: one worker consuming both queues
(``-Q hi,lo``) with 12 prefork children (the 12 execution slots the others
get).  kombu's Redis transport BRPOPs the queues in round-robin order
(``queue_order_strategy='round_robin'``), so with both backlogged the share is
~0.5.  The idiomatic Celery way to favour a queue is dedicated workers per
queue: ``--cfg 'celery={"queue_concurrency":{"hi":8,"lo":4}}'`` makes
run_worker fork one Celery worker per queue with that many children (the same
8:4 per-queue-concurrency proxy used for pgqueuer and chancy).
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import re
import signal
import socket
import sys
from urllib.parse import urlparse

import redis
from celery import Celery, group

import benchlib

BROKER_URL = os.environ.get("BENCH_CELERY_BROKER", "redis://127.0.0.1:6379/7")
RESULT_URL = BROKER_URL  # same dedicated DB: results are what count_jobs reads
TASK_NAME = "bench.job"
BULK_MODE = os.environ.get("BENCH_CELERY_BULK", "group")  # "group" | "producer"

RESULT_PREFIX = b"celery-task-meta-"
TERMINAL = {"SUCCESS", "FAILURE", "REVOKED"}
_STATUS_RE = re.compile(rb'"status":\s*"([A-Z_]+)"')


def _check_url(url: str) -> None:
    u = urlparse(url)
    db = (u.path or "/").lstrip("/") or "0"
    if u.scheme not in ("redis", "rediss") or db == "0":
        raise RuntimeError(f"celery adapter needs a redis:// URL with its own non-zero DB "
                           f"number (it FLUSHDBs it), got {url!r}")


def make_app(with_results: bool, prefetch_multiplier: int = 4) -> Celery:
    app = Celery("bench", broker=BROKER_URL,
                 backend=RESULT_URL if with_results else None, set_as_current=False)
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_ignore_result=False,
        worker_prefetch_multiplier=prefetch_multiplier,
        task_serializer="json", result_serializer="json", accept_content=["json"],
        broker_connection_retry_on_startup=True,
        worker_send_task_events=False,
        task_default_queue="bench",
    )

    @app.task(name=TASK_NAME)
    def job(seq: int, loops: int = 0, sleep_ms: int = 0) -> None:
        benchlib.handle({"seq": seq, "loops": loops, "sleep_ms": sleep_ms})

    app.bench_job = job
    return app


def version() -> str:
    return importlib.metadata.version("celery")


def _redis() -> redis.Redis:
    return redis.Redis.from_url(RESULT_URL)


def durability() -> str:
    """How the Redis server keeps data, read from its own settings (added in
    the awa_pool repository: the tables print it beside Celery's numbers)."""
    r = _redis()
    try:
        aof = r.config_get("appendonly").get("appendonly", "?")
        save = r.config_get("save").get("save", "?")
    finally:
        r.close()
    if aof == "no" and not save:
        return "Redis keeps nothing on disk (appendonly no, no save points)"
    return f"Redis appendonly {aof}, save {save!r}"


def prepare(dsn: str) -> None:
    """Empty the dedicated Redis DB (broker lists + results); nothing in Postgres."""
    _check_url(BROKER_URL)
    r = _redis()
    r.flushdb()
    r.close()
    _terminal.clear()


# --------------------------------------------------------------------------
# Counting from Celery's own state (see module docstring)
# --------------------------------------------------------------------------
_terminal: dict[bytes, str] = {}  # result key -> terminal state (already read)
_client: redis.Redis | None = None


def _queue_keys(queues) -> list[str]:
    from kombu.transport.redis import PRIORITY_STEPS, Channel
    return [q if not pri else f"{q}{Channel.sep}{pri}" for q in queues for pri in PRIORITY_STEPS]


def _broker_counts(r: redis.Redis, queues) -> tuple[int, int]:
    pipe = r.pipeline(transaction=False)
    for k in _queue_keys(queues):
        pipe.llen(k)
    pipe.hlen("unacked")
    sizes = pipe.execute()
    return sum(sizes[:-1]), sizes[-1]


def _result_keys(r: redis.Redis) -> set[bytes]:
    return set(r.scan_iter(match=RESULT_PREFIX + b"*", count=10_000))


def count_jobs(conn, queues) -> dict:
    global _client
    if _client is None:
        _client = _redis()
    r = _client
    new = [k for k in _result_keys(r) if k not in _terminal]
    for i in range(0, len(new), 2000):
        chunk = new[i:i + 2000]
        for k, v in zip(chunk, r.mget(chunk)):
            m = _STATUS_RE.search(v) if v else None
            st = m.group(1).decode() if m else (json.loads(v)["status"] if v else None)
            if st in TERMINAL:
                _terminal[k] = st
    states: dict[str, int] = {}
    for st in _terminal.values():
        states[st] = states.get(st, 0) + 1
    ready, unacked = _broker_counts(r, queues)
    return {"completed": states.get("SUCCESS", 0), "queued": ready + unacked,
            "failed": states.get("FAILURE", 0) + states.get("REVOKED", 0),
            "ready": ready, "unacked": unacked,
            "results_nonterminal": len(new) - sum(1 for k in new if k in _terminal)}


def final_counts(conn, queues) -> dict:
    """Uncached cross-check: every result value JSON-parsed."""
    r = _redis()
    keys = sorted(_result_keys(r))
    states: dict[str, int] = {}
    for i in range(0, len(keys), 2000):
        for v in r.mget(keys[i:i + 2000]):
            st = json.loads(v)["status"] if v else "EXPIRED"
            states[st] = states.get(st, 0) + 1
    ready, unacked = _broker_counts(r, queues)
    r.close()
    return {"completed": states.get("SUCCESS", 0), "queued": ready + unacked,
            "failed": states.get("FAILURE", 0) + states.get("REVOKED", 0),
            "ready": ready, "unacked": unacked, "raw": states}


# --------------------------------------------------------------------------
# Configuration (2 cores)
# --------------------------------------------------------------------------
def worker_config(workload: str) -> dict:
    if workload == "W3":  # CPU-bound: one prefork child per core, reserve 1 each
        return {"processes": 1, "concurrency": 2, "prefetch_multiplier": 1}
    if workload == "W4":
        return {"processes": 1, "concurrency": 2, "prefetch_multiplier": 4}
    if workload == "W5":  # no weights: one worker, both queues (round-robin BRPOP)
        return {"processes": 1, "concurrency": 12, "prefetch_multiplier": 1}
    return {"processes": 1, "concurrency": 2, "prefetch_multiplier": 4}


# --------------------------------------------------------------------------
# Producer
# --------------------------------------------------------------------------
class Producer:
    def open(self, dsn: str) -> None:
        _check_url(BROKER_URL)
        self.app = make_app(with_results=False)
        self.job = self.app.bench_job

    def enqueue(self, payload: dict, queue: str) -> None:
        self.job.apply_async(kwargs=payload, queue=queue)

    def enqueue_batch(self, payloads: list, queue: str) -> None:
        if BULK_MODE == "producer":
            with self.app.producer_or_acquire() as prod:
                for p in payloads:
                    self.job.apply_async(kwargs=p, queue=queue, producer=prod)
        else:
            group(self.job.s(**p).set(queue=queue) for p in payloads).apply_async()

    def close(self) -> None:
        self.app.close()


# --------------------------------------------------------------------------
# Worker
# --------------------------------------------------------------------------
def _celery_worker(queues: list, concurrency: int, cfg: dict) -> int:
    app = make_app(with_results=True,
                   prefetch_multiplier=int(cfg.get("prefetch_multiplier", 4)))
    worker = app.Worker(
        hostname=f"bench-{'-'.join(queues)}-{os.getpid()}@{socket.gethostname()}",
        pool_cls="prefork", concurrency=concurrency, queues=",".join(queues),
        loglevel=cfg.get("loglevel", "WARNING"), optimization=cfg.get("optimization", "fair"),
        without_gossip=True, without_mingle=True, without_heartbeat=True, quiet=True,
    )
    worker.start()  # blocks; SIGTERM -> warm shutdown
    return worker.exitcode or 0


def run_worker(dsn: str, queues: list, cfg: dict) -> None:
    per_queue = cfg.get("queue_concurrency") or {}
    if not per_queue:
        sys.exit(_celery_worker(queues, int(cfg.get("concurrency", 2)), cfg))
    # Dedicated worker per queue (Celery's idiomatic stand-in for priorities).
    pids = []
    for q in queues:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = _celery_worker([q], int(per_queue.get(q, cfg.get("concurrency", 2))), cfg)
            finally:
                os._exit(code)
        pids.append(pid)
    # The harness signals the whole process group; just outlive the children.
    signal.signal(signal.SIGTERM, lambda *_: None)
    for pid in pids:
        while True:
            try:
                os.waitpid(pid, 0)
                break
            except InterruptedError:
                continue
            except ChildProcessError:
                break
