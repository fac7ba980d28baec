"""Admin and callback functions (SPEC §1), also behind the CLI.

They run in the caller's transaction and never commit, like enqueue; the
one exception is `wait`, which must see other transactions commit and so
needs a connection outside any transaction.
"""
from __future__ import annotations

import json
import time
import uuid
from typing import Any, Dict, Iterable, List, Optional, Sequence

from ..core.config import parse_duration
from .drivers import INERROR, adapt, cursor_for, sqlstate
from .plan import Plan, Query, Rows, Steps
from ..core.errors import PayloadTooLarge, Seconds, UnknownCallback, to_seconds
from ..core.job import JobRecord, JobState, check_name, decode_json_for_record
from ..core.sql import QUERIES

ALL_STATES = [state.value for state in JobState]
PAYLOAD_MAX_BYTES = 1024 * 1024  # a callback payload becomes a result: same cap as results
WAIT_RECHECK_S = 5.0             # wait() looks again at least this often
WAIT_POLL_POOLED_S = 0.25        # ... and this often through a pooler (no LISTEN there)
ERROR_MAX_CHARS = 2000           # fail_external's error text, as for a handler's exception
NO_DATA_FOUND = "P0002"          # resolve_callback's "unknown or used callback"
# list_jobs' age filters read an id range: how long the transaction that
# created a job may have run before taking its id
AGE_SLACK_S = 600.0


def _record_cursor(conn: Any) -> Any:
    """A cursor whose jsonb values decode as JobRecord fields expect
    (see decode_json_for_record)."""
    return cursor_for(conn, loads=decode_json_for_record)


def _records(cur: Any) -> List[JobRecord]:
    names = [d.name for d in cur.description]
    return [JobRecord.from_row(dict(zip(names, row))) for row in cur.fetchall()]


def _check_id(job_id: Any) -> int:
    if isinstance(job_id, bool) or not isinstance(job_id, int):
        raise TypeError(f"job id must be an int, not {type(job_id).__name__}")
    return job_id


def _check_limit(limit: Any) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit must be an int >= 1, got {limit!r}")


def records_of(rows: Rows) -> List[JobRecord]:
    return [JobRecord.from_row(row) for row in rows.dicts()]


def get_job_plan(job_id: int) -> Plan[Optional[JobRecord]]:
    return Plan(_get_job_steps(_check_id(job_id)), loads=decode_json_for_record)


def _get_job_steps(job_id: int) -> Steps[Optional[JobRecord]]:
    records = records_of((yield Query("get_job", {"id": job_id})))
    return records[0] if records else None


def get_job(conn: Any, job_id: int) -> Optional[JobRecord]:
    """The job with this id, or None."""
    plan = get_job_plan(job_id)
    return adapt(conn).run(plan)


def list_jobs(conn: Any, state: Optional[str] = None, queue: Optional[str] = None,
              kind: Optional[str] = None, limit: int = 100, *, older_than: Any = None,
              newer_than: Any = None) -> List[JobRecord]:
    """Jobs matching every given filter, newest first. older_than/newer_than
    are ages (seconds, timedelta or '2h') of the job's creation; they read
    only the ids of that age, so a job whose creating transaction ran over
    AGE_SLACK_S (10 minutes) before it took its id may be left out."""
    if state is not None and str(state) not in ALL_STATES:
        raise ValueError(f"unknown state {state!r}: use one of {', '.join(ALL_STATES)}")
    _check_limit(limit)
    params = {
        "state": str(state) if state is not None else None, "queue": queue, "kind": kind, "limit": limit,
        "slack_s": AGE_SLACK_S,
        "older_than_s": parse_duration(older_than, what="older_than") if older_than is not None else None,
        "newer_than_s": parse_duration(newer_than, what="newer_than") if newer_than is not None else None,
    }
    with _record_cursor(conn) as cur:
        cur.execute(QUERIES["list_jobs"], params)
        return _records(cur)


def cancel_job(conn: Any, job_id: int, reason: str = "cancelled by an operator") -> Optional[JobState]:
    """Cancel a job that is not terminal yet; returns its state afterwards
    (`cancelled`, or the terminal state it had reached), None for an unknown
    id. A running job is cancelled at once; its handler sees
    ctx.cancel_requested and its child is killed after the grace period."""
    with cursor_for(conn) as cur:
        cur.execute(QUERIES["cancel_job"], {"id": _check_id(job_id), "reason": reason})
        state = cur.fetchone()[0]
    return JobState(state) if state is not None else None


def retry_job(conn: Any, job_id: int) -> Optional[JobState]:
    """Run a job again now (failed/cancelled jobs get fresh attempts);
    returns its state afterwards, None for an unknown id."""
    with cursor_for(conn) as cur:
        cur.execute(QUERIES["retry_job"], {"id": _check_id(job_id)})
        state = cur.fetchone()[0]
    return JobState(state) if state is not None else None


def pause_queue(conn: Any, queue: str) -> None:
    """Stop claiming from a queue (running jobs finish; enqueue still works)."""
    with cursor_for(conn) as cur:
        cur.execute(QUERIES["pause_queue"], {"name": check_name(queue, "queue")})


def resume_queue(conn: Any, queue: str) -> None:
    with cursor_for(conn) as cur:
        cur.execute(QUERIES["resume_queue"], {"name": check_name(queue, "queue")})


def set_queue_shards(conn: Any, queue: str, shards: int) -> int:
    """Split a queue into `shards` lanes, each strict FIFO (1 = one lane).

    Jobs with the same ordering_key always share a lane, so their order
    holds; jobs without one spread over the lanes. Waiting jobs move to their
    new lanes at once; returns how many were placed."""
    if isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= 64:
        raise ValueError(f"shards must be an int from 1 to 64, got {shards!r}")
    with cursor_for(conn) as cur:
        cur.execute(QUERIES["set_queue_shards"], {"name": check_name(queue, "queue"), "shards": shards})
        return cur.fetchone()[0]


# -- callbacks ---------------------------------------------------------------------

def _callback_uuid(callback: Any) -> str:
    if not isinstance(callback, str) or not callback:
        raise TypeError("callback must be the id string that ctx.register_callback() returned")
    try:
        return str(uuid.UUID(callback))
    except ValueError:
        raise UnknownCallback(f"malformed callback id {callback[:80]!r}: "
                              "expected the id that ctx.register_callback() returned") from None


def _payload_json(payload: Any) -> Optional[str]:
    if payload is None:
        return None
    try:
        text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:  # a type json cannot take, or NaN/infinity
        raise type(exc)(f"the callback payload must be JSON-serializable: {exc}") from None
    if len(text) > PAYLOAD_MAX_BYTES:
        raise PayloadTooLarge(f"the callback payload is {len(text)} bytes of JSON, over the "
                              f"{PAYLOAD_MAX_BYTES}-byte limit: store big payloads elsewhere "
                              "and pass a reference")
    return text


def _resolve(conn: Any, callback: str, action: str, payload: Any = None,
             error: Optional[str] = None) -> JobState:
    callback_id = _callback_uuid(callback)
    payload_json = _payload_json(payload)
    link = adapt(conn)
    with link.cursor() as cur:
        # a refused callback must leave the caller's transaction usable
        savepoint = not link.autocommit
        if savepoint:
            cur.execute(QUERIES["savepoint"])
        try:
            cur.execute(QUERIES["resolve_callback"], {
                "callback": callback_id, "action": action, "error": error, "payload": payload_json})
        except link.error as exc:
            if savepoint and link.transaction_status() == INERROR:
                cur.execute(QUERIES["rollback_to_savepoint"])
            if sqlstate(exc) == NO_DATA_FOUND:
                raise UnknownCallback(exc.diag.message_primary or str(exc)) from None
            raise
        row = cur.fetchone()
        if savepoint:
            cur.execute(QUERIES["release_savepoint"])
    return JobState(row[1])


def complete_external(conn: Any, callback: str, payload: Any = None) -> JobState:
    """The external work succeeded: the job completes with `payload` (JSON)
    as its result. Raises UnknownCallback for an unknown, malformed or
    already-used id (the caller's transaction stays usable)."""
    return _resolve(conn, callback, "complete", payload)


def fail_external(conn: Any, callback: str, error: str) -> JobState:
    """The external work failed: a failed attempt, retried with backoff while
    attempts remain, then failed (or dead-lettered)."""
    if not isinstance(error, str) or not error:
        raise TypeError("error must be a non-empty string")
    if len(error) > ERROR_MAX_CHARS:  # it is stored in the job's errors, like a handler's
        error = error[:ERROR_MAX_CHARS] + "..."
    return _resolve(conn, callback, "fail", error=error)


def retry_external(conn: Any, callback: str) -> JobState:
    """Run the job's handler again now, as a new attempt."""
    return _resolve(conn, callback, "retry")


def resume_external(conn: Any, callback: str, payload: Any = None) -> JobState:
    """Run the handler again with ctx.callback_result == payload; the run
    continues the attempt that waited (it is not counted again)."""
    return _resolve(conn, callback, "resume", payload)


# -- dead-letter queue -------------------------------------------------------------

def dlq_list(conn: Any, queue: Optional[str] = None, kind: Optional[str] = None,
             limit: int = 100) -> List[JobRecord]:
    """Dead-lettered jobs, most recent first."""
    _check_limit(limit)
    with _record_cursor(conn) as cur:
        cur.execute(QUERIES["dlq_list"], {"queue": queue, "kind": kind, "limit": limit})
        return _records(cur)


def _dlq_filter(ids: Optional[Iterable[int]], queue: Optional[str], kind: Optional[str]) -> Dict[str, Any]:
    id_list = [_check_id(i) for i in ids] if ids is not None else None
    return {"ids": id_list, "queue": queue, "kind": kind}


def dlq_retry(conn: Any, ids: Optional[Iterable[int]] = None, queue: Optional[str] = None,
              kind: Optional[str] = None) -> int:
    """Give dead-lettered jobs matching all filters fresh attempts; returns how many."""
    params = _dlq_filter(ids, queue, kind)
    with cursor_for(conn) as cur:
        cur.execute(QUERIES["dlq_ids"], params)
        targets = [row[0] for row in cur.fetchall()]
        for job_id in targets:
            cur.execute(QUERIES["retry_job"], {"id": job_id})
    return len(targets)


def dlq_purge(conn: Any, ids: Optional[Iterable[int]] = None, queue: Optional[str] = None,
              kind: Optional[str] = None, *, all: bool = False) -> int:
    """Delete dead-lettered jobs matching all filters; returns how many.
    With no filter at all, pass all=True."""
    params = _dlq_filter(ids, queue, kind)
    if params["ids"] is None and queue is None and kind is None and not all:
        raise ValueError("dlq_purge with no filter would delete the whole dead-letter queue: "
                         "pass ids, queue or kind, or all=True")
    with cursor_for(conn) as cur:
        cur.execute(QUERIES["dlq_purge"], params)
        return cur.rowcount


# -- waiting -----------------------------------------------------------------------

class Waiting:
    """What wait() decides, whatever the driver: the query to look again
    with, and after each look whether it is done (or failed, or timed out)
    and how long it may sleep on the socket before looking again.
    Validates its arguments on construction, before any SQL."""

    def __init__(self, ids: Sequence[int], timeout: Optional[Seconds]) -> None:
        self.wanted = [_check_id(i) for i in ids]
        self.timeout = to_seconds(timeout, "wait timeout")
        self.deadline = None if self.timeout is None else time.monotonic() + self.timeout
        self.query = Query("get_jobs", {"ids": self.wanted})
        self.remaining: Optional[float] = None

    def finished(self, rows: Rows) -> Optional[List[JobRecord]]:
        """The records in the order of `ids` once all are terminal, else
        None. Raises ValueError for unknown ids, TimeoutError past the deadline."""
        records = {record.id: record for record in records_of(rows)}
        missing = [i for i in self.wanted if i not in records]
        if missing:
            raise ValueError(f"unknown job id(s): {missing[:10]}")
        if all(records[i].terminal for i in self.wanted):
            return [records[i] for i in self.wanted]
        self.remaining = None if self.deadline is None else self.deadline - time.monotonic()
        if self.remaining is not None and self.remaining <= 0:
            pending = [i for i in self.wanted if not records[i].terminal]
            raise TimeoutError(f"{len(pending)} job(s) not finished after {self.timeout:g}s "
                               f"(for example {pending[:5]})")
        return None

    def pause_s(self, listening: bool) -> float:
        """How long to sleep before looking again: a NOTIFY per terminal
        transition wakes the sleeper; the cap only bounds how long a lost
        notification could delay it (or, through a pooler, is the poll)."""
        recheck_s = WAIT_RECHECK_S if listening else WAIT_POLL_POOLED_S
        return recheck_s if self.remaining is None else min(recheck_s, self.remaining)


NOT_OUTSIDE_TRANSACTION = "wait() needs a connection outside a transaction: commit or roll back first"


def wait(conn: Any, ids: Sequence[int], timeout: Optional[Seconds] = None) -> List[JobRecord]:
    """Block until every job in `ids` is terminal; return their records in
    the order of `ids`. Wakes on the database's NOTIFY (no busy polling;
    through a connection pooler, which cannot carry a LISTEN, it polls
    every 0.25 s).
    Raises TimeoutError after `timeout` (seconds or a timedelta). `conn` must
    not be inside a transaction (commit first): waiting needs to see other
    commits."""
    waiting = Waiting(ids, timeout)
    link = adapt(conn, begin=False)
    if link.in_transaction():
        raise ValueError(NOT_OUTSIDE_TRANSACTION)
    autocommit = link.autocommit
    link.autocommit = True
    listener = link.listener()
    try:
        with link.cursor(loads=decode_json_for_record) as cur:
            # Through a pooler (its answer to the connect names another
            # backend) a LISTEN would stay behind on a server session other
            # clients share: poll instead.
            cur.execute(QUERIES["backend_pid"])
            listening = cur.fetchone()[0] == link.raw.info.backend_pid
            if listening:
                cur.execute(QUERIES["listen_done"])
            try:
                while True:
                    # A notification that arrives while the query runs is read
                    # with its result and never makes the socket readable:
                    # clear first, and look again at once if one came in.
                    listener.clear()
                    cur.execute(QUERIES[waiting.query.name], waiting.query.params)
                    done = waiting.finished(Rows(cur.fetchall(), tuple(d.name for d in cur.description)))
                    if done is not None:
                        return done
                    if not listener.pending():
                        listener.wait(waiting.pause_s(listening))
            finally:
                if listening:
                    cur.execute(QUERIES["unlisten_done"])
    finally:
        listener.close()
        link.autocommit = autocommit
