"""Outcome batching: children's outcomes are buffered and written in a few
lease-guarded statements by a background thread, so the success path costs
no per-job SQL and writing overlaps claiming.

A flush that fails keeps every entry for the next try: both statements are
idempotent (a second application matches no row), so retrying after an
unknown commit outcome is safe.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any, Dict, Iterable, List, Optional, Set, Tuple

import psycopg2

from ..core.db import close_quietly, connect, first_line, is_transient, socket_of
from ..core.errors import AwaError
from .outcome_params import array_literal, completion_params, extra_json, payload_bytes, settle_entry
from .protocol import Outcome
from ..core.sql import QUERIES

log = logging.getLogger(__name__)

FLUSH_SIZE = 200
RIDE_MAX = 4          # a claim carries the waiting successes only when this few wait (long jobs)
PROGRESS_INTERVAL_S = 1.0
# Results and progress are JSON text held until written. A flush writes
# them in statements of at most FLUSH_BYTES (one outcome at least), and the
# supervisor stops claiming while more than PENDING_BYTES_CAP wait, so a
# supervisor's memory does not grow with result size times throughput
# (issue 23: 1 MB results).
FLUSH_BYTES = 8 << 20
PENDING_BYTES_CAP = 32 << 20


class Completer:
    def __init__(self, max_crashes: int) -> None:
        self.max_crashes = max_crashes
        self.completed: List[Outcome] = []
        self.others: List[Outcome] = []
        self.progress: Dict[int, Tuple[int, str]] = {}
        self.first_pending_at: Optional[float] = None
        self.progress_due_at: Optional[float] = None
        self.stats: Dict[str, int] = {}

    def add(self, outcome: Outcome) -> None:
        latest = self.progress.pop(outcome.job_id, None)
        if outcome.progress is None and latest is not None and latest[0] == outcome.lease:
            # A child that died or was killed sent no final progress: its
            # last checkpoint rides on the outcome instead of being dropped.
            outcome = outcome._replace(progress=latest[1])
        if outcome.outcome == "completed":
            self.completed.append(outcome)
        else:
            self.others.append(outcome)
        if self.first_pending_at is None:
            self.first_pending_at = time.monotonic()

    def add_progress(self, job_id: int, lease: int, progress_json: str) -> None:
        self.progress[job_id] = (lease, progress_json)
        if self.progress_due_at is None:
            self.progress_due_at = time.monotonic() + PROGRESS_INTERVAL_S

    @property
    def pending(self) -> int:
        return len(self.completed) + len(self.others)

    def flush(self, cur: Any) -> List[Tuple[int, str]]:
        """Write everything pending; returns [(job id, new state)] actually
        applied (stale outcomes are silently dropped by the lease guard)."""
        applied: List[Tuple[int, str]] = []
        big = sum(payload_bytes(o) for o in self.completed + self.others) > FLUSH_BYTES
        if self.completed and self.others and not big:
            applied += self._flush_both(cur)
        while self.completed:  # in statements of at most FLUSH_BYTES of results
            size, count = 0, 0
            for o in self.completed:
                size += payload_bytes(o)
                if count and size > FLUSH_BYTES:
                    break
                count += 1
            chunk, rest = self.completed[:count], self.completed[count:]
            self.completed = chunk
            try:
                applied += self._flush_completed(cur)
            except BaseException:
                self.completed = chunk + rest  # nothing unwritten is dropped
                raise
            self.completed = rest
        if self.others:
            applied += self._flush_others(cur)
        if self.progress:
            self._flush_progress(cur)
        self.first_pending_at = None
        for _, state in applied:
            self.stats[state] = self.stats.get(state, 0) + 1
        return applied

    def _flush_completed(self, cur: Any) -> List[Tuple[int, str]]:
        batch = self.completed
        if len(batch) == 1:
            o = batch[0]
            statement = QUERIES["complete_job"]
            params = {"id": o.job_id, "lease": o.lease, "wall": round(o.wall_s, 6),
                      "cpu": round(o.cpu_s, 6), "rss": o.peak_rss, "extra": extra_json(o)}
        else:
            statement = QUERIES["complete_jobs"]
            params = completion_params(batch)
        try:
            cur.execute(statement, params)
        except psycopg2.Error as exc:
            if is_transient(exc):  # retried whole, with backoff
                raise
            # One value the database refuses must not block the others:
            # settle them one by one, failing only the job it refuses.
            log.warning("batch completion refused (%s); settling %d outcomes one by one",
                        first_line(exc), len(batch))
            self.completed = []
            applied = []
            for outcome in batch:
                applied += self._settle_one(cur, outcome)
            return applied
        self.completed = []
        return [(row[0], "completed") for row in cur.fetchall()]

    def _flush_both(self, cur: Any) -> List[Tuple[int, str]]:
        """Successes and other outcomes in one statement; if the database
        refuses it, both lists stay for their own paths (and fallbacks)."""
        params = completion_params(self.completed)
        params.update(self._settle_params(self.others))
        try:
            cur.execute(QUERIES["complete_and_settle"], params)
        except psycopg2.Error as exc:
            if is_transient(exc):
                raise
            log.warning("combined flush refused (%s); writing its two parts apart", first_line(exc))
            return []
        self.completed, self.others = [], []
        return [(row[0], row[1]) for row in cur.fetchall()]

    def _flush_others(self, cur: Any) -> List[Tuple[int, str]]:
        batch = self.others
        try:
            applied = self._settle(cur, batch)
        except psycopg2.Error as exc:
            if is_transient(exc):
                raise
            log.warning("batch settle refused (%s); settling %d outcomes one by one",
                        first_line(exc), len(batch))
            applied = []
            for outcome in batch:
                applied += self._settle_one(cur, outcome)
        self.others = []
        return applied

    def _settle_params(self, outcomes: List[Outcome]) -> Dict[str, Any]:
        return {"outcomes": json.dumps([settle_entry(o) for o in outcomes], ensure_ascii=False),
                "max_crashes": self.max_crashes}

    def _settle(self, cur: Any, outcomes: List[Outcome]) -> List[Tuple[int, str]]:
        cur.execute(QUERIES["settle_jobs"], self._settle_params(outcomes))
        return [(row[0], row[1]) for row in cur.fetchall()]

    def _settle_one(self, cur: Any, outcome: Outcome) -> List[Tuple[int, str]]:
        try:
            return self._settle(cur, [outcome])
        except psycopg2.Error as exc:
            if is_transient(exc):
                raise
            reason = first_line(exc)
        log.warning("job %d: the database refused its outcome (%s); failing it", outcome.job_id, reason)
        refused = outcome._replace(outcome="fatal", result=None, progress=None,
                                   error=f"the database refused this job's outcome: {reason}")
        try:
            return self._settle(cur, [refused])
        except psycopg2.Error as exc:
            if is_transient(exc):
                raise
            log.error("job %d: could not record its outcome (%s); it will be released",
                      outcome.job_id, first_line(exc))
            return []

    def _flush_progress(self, cur: Any) -> None:
        items = list(self.progress.items())
        cur.execute(QUERIES["write_progress"], {
            "ids": array_literal(job_id for job_id, _ in items),
            "leases": array_literal(lease for _, (lease, _) in items),
            "progress": [text for _, (_, text) in items],
        })
        self.progress = {}
        self.progress_due_at = None


class BackgroundCompleter:
    """Writes outcomes from a thread with its own connection, so completion
    writes overlap the main loop's claiming and dispatching.

    Outcomes pile up while a flush is running, which batches them naturally
    under load. A flush lost to a broken connection is merged back and
    retried after a backoff; the thread never drops an entry on its own.
    """

    COALESCE_S = 0.002       # a small flush waits this long for what arrives with it...
    MAX_COALESCE_S = 0.05    # ...and, at a steady trickle, its first outcome up to this long for more

    def __init__(self, dsn: str, max_crashes: int) -> None:
        self.dsn = dsn
        self.max_crashes = max_crashes
        self.buffer = Completer(max_crashes)
        self.lock = threading.Lock()
        self.flushed = threading.Condition(self.lock)
        self.wakeup = threading.Event()
        self.in_flight: Set[int] = set()
        self.lent: List[Outcome] = []   # successes riding on a claim statement (see lend)
        self.rides = 0   # successes written by claims (lend, then repay as written)
        self.conn: Optional[Any] = None
        self.session_settings = True   # False behind a transaction pooler: no SET on its sessions
        self.stopping = False
        self.thread: Optional[threading.Thread] = None
        self.stats: Dict[str, int] = {}
        self.flushes = 0    # transactions that wrote outcomes
        self.failures = 0
        self.force = False  # flush progress at once (shutdown)
        self.on_applied: Optional[Any] = None
        # JSON text of results and progress not yet written (buffered or in
        # flight); over PENDING_BYTES_CAP the supervisor claims nothing, and
        # on_relief() is called once it is back under.
        self.pending_bytes = 0
        self.on_relief: Optional[Any] = None
        # Outcome arrivals (see _company_window): when add() last brought
        # some, the average gap between arrivals, and whether the last
        # caller expected more soon.
        self.retrying = False  # the buffer holds a failed flush: it waits for no company
        self.last_add_at: Optional[float] = None
        self.gap_s: Optional[float] = None
        self.more_coming = False

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="awa-pool-completer", daemon=True)
        self.thread.start()

    def add(self, outcomes: Iterable[Outcome], more_coming: bool = False, wake: bool = True) -> None:
        """Buffer outcomes for the next flush: one lock and one wake-up for
        all of them (a child reports a batch at a time). `more_coming`: jobs
        are still running, so a small flush may wait for their outcomes.
        `wake=False`: the caller calls nudge() soon (after a claim that may
        carry them, so the thread is not woken for nothing)."""
        now = time.monotonic()
        added = 0
        with self.lock:
            for outcome in outcomes:
                self.buffer.add(outcome)
                self.pending_bytes += payload_bytes(outcome)
                added += 1
            if added:
                if self.last_add_at is not None:
                    gap = min(now - self.last_add_at, 2 * self.MAX_COALESCE_S)
                    self.gap_s = gap if self.gap_s is None else self.gap_s + 0.2 * (gap - self.gap_s)
                self.last_add_at = now
                self.more_coming = more_coming
        if added and wake:
            self.wakeup.set()

    def nudge(self) -> None:
        """Wake the thread for what add(wake=False) left in the buffer."""
        with self.lock:
            waiting = bool(self.buffer.pending)
        if waiting:
            self.wakeup.set()

    def add_progress(self, job_id: int, lease: int, progress_json: str) -> None:
        with self.lock:
            self.buffer.add_progress(job_id, lease, progress_json)

    @property
    def pending(self) -> int:
        with self.lock:
            return self.buffer.pending + len(self.in_flight) + len(self.lent)

    def over_budget(self) -> bool:
        """True while results and progress waiting to be written exceed
        PENDING_BYTES_CAP: claim nothing more until they are written."""
        return self.pending_bytes > PENDING_BYTES_CAP

    def pending_ids(self) -> Set[int]:
        with self.lock:
            return ({o.job_id for o in self.buffer.completed + self.buffer.others + self.lent}
                    | set(self.in_flight))

    def lend(self) -> List[Outcome]:
        """Take the plain successes waiting to be written (no result, no
        progress: values the database cannot refuse) for a claim that is
        about to go, which writes them in its own statement and commit
        (fetcher.claim): one round trip for both, and the flush they were
        waiting for company for is not needed. They count as pending until
        repay() says whether the claim's statement went through."""
        with self.lock:
            if self.retrying or self.lent or not self.buffer.completed:
                return []
            if len(self.buffer.completed) > RIDE_MAX:
                # Short jobs: many successes wait, and the completer writes
                # them on its own connection while the claim runs on this
                # one; carried, they would lengthen the claim the children
                # wait for (a backlog of no-op jobs drained ~25 % slower).
                return []
            plain = [o for o in self.buffer.completed if o.result is None and o.progress is None]
            if not plain:
                return []
            taken = {id(o) for o in plain}
            self.buffer.completed = [o for o in self.buffer.completed if id(o) not in taken]
            if not self.buffer.pending:
                self.buffer.first_pending_at = None   # nothing left to wait for company for
            self.lent = plain
            return list(plain)

    def repay(self, written: bool) -> None:
        """The claim that took lend()'s outcomes is over: they are written
        (True), or its statement failed and they go back in front of the
        buffer for the next flush (False; the lease guard makes a second
        write of a statement that did commit match nothing)."""
        with self.lock:
            lent, self.lent = self.lent, []
            if not lent:
                return
            if written:
                self.rides += len(lent)
                self.flushed.notify_all()
                return
            self.buffer.completed = lent + self.buffer.completed
            if self.buffer.first_pending_at is None:
                self.buffer.first_pending_at = time.monotonic()
            self.retrying = True   # written at once, without waiting for company
        self.wakeup.set()

    def fileno(self) -> Optional[int]:
        return socket_of(self.conn)

    def drain(self, timeout: float) -> bool:
        """Block until everything pending is written (True) or timeout (False)."""
        deadline = time.monotonic() + timeout
        self.force = True
        self.wakeup.set()
        with self.lock:
            while self.buffer.pending or self.in_flight or self.lent or self.buffer.progress:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self.flushed.wait(min(remaining, 0.1))
                self.wakeup.set()
        return True

    def stop(self, timeout: float = 5.0) -> None:
        self.stopping = True
        self.wakeup.set()
        if self.thread is not None:
            self.thread.join(timeout)
        close_quietly(self.conn)
        self.conn = None

    def _run(self) -> None:
        while not self.stopping:
            with self.lock:
                due_at = self.buffer.progress_due_at
            wait = 1.0 if due_at is None else max(0.0, due_at - time.monotonic())
            self.wakeup.wait(wait)
            self.wakeup.clear()
            self._wait_for_company()
            self._flush_once()

    def _wait_for_company(self) -> None:
        """Let a small flush gather company before it goes. Every flush is a
        statement and a commit whatever its size (about a millisecond of
        server and supervisor CPU when the cores are busy with jobs): first
        COALESCE_S for what arrives together; then, at a steady trickle
        (long jobs on several children), up to MAX_COALESCE_S after the
        first outcome, for more and for a claim to carry them (lend)."""
        with self.lock:
            small = 0 < self.buffer.pending < FLUSH_SIZE // 4
        if not small:
            return
        time.sleep(self.COALESCE_S)
        while not (self.stopping or self.force):
            with self.lock:
                window = self._company_window()
                if window <= 0 or self.buffer.first_pending_at is None:
                    return
                remaining = self.buffer.first_pending_at + window - time.monotonic()
            if remaining <= 0:
                return
            self.wakeup.wait(remaining)
            self.wakeup.clear()

    def _company_window(self) -> float:
        """How long after the first pending outcome the flush may wait (lock
        held): MAX_COALESCE_S while jobs still run and outcomes come less
        than MAX_COALESCE_S apart; none when no job is still running, when
        they come further apart, or once the buffer is no longer small. The
        whole window, not just until the next outcome is due: children that
        run 45 ms jobs two at a time refill (a claim) every 45 ms or so, and
        a flush that went when the next outcome was due went just before
        that claim could carry it (a completer statement for one job in
        four; about 0.35 ms of server and supervisor CPU each). A completion
        is still written at most MAX_COALESCE_S late."""
        if self.retrying or not self.more_coming or self.buffer.pending >= FLUSH_SIZE // 4:
            return 0.0
        if self.buffer.first_pending_at is None or self.gap_s is None or self.gap_s >= self.MAX_COALESCE_S:
            return 0.0
        return self.MAX_COALESCE_S

    def _flush_once(self) -> None:
        with self.lock:
            batch = self.buffer
            progress_due = batch.progress_due_at is not None and (
                self.force or time.monotonic() >= batch.progress_due_at)
            if not batch.pending and not progress_due:
                self.flushed.notify_all()
                return
            if not progress_due:
                # keep progress buffered until its interval; flush outcomes now
                self.buffer = Completer(self.max_crashes)
                self.buffer.progress, batch.progress = batch.progress, {}
                self.buffer.progress_due_at, batch.progress_due_at = batch.progress_due_at, None
            else:
                self.buffer = Completer(self.max_crashes)
            self.retrying = False
            self.in_flight = {o.job_id for o in batch.completed + batch.others}
        try:
            if self.conn is None or self.conn.closed:
                self.conn = connect(self.dsn, autocommit=True, connect_timeout=5)
                if self.session_settings:  # not through a transaction pooler (session.py)
                    with self.conn.cursor() as cur:
                        cur.execute(QUERIES["worker_session"])
            writes_outcomes = bool(batch.completed or batch.others)
            with self.conn.cursor() as cur:
                applied = batch.flush(cur)
            self.failures = 0
            self.flushes += writes_outcomes
            for _, state in applied:
                self.stats[state] = self.stats.get(state, 0) + 1
            if self.on_applied is not None and applied:
                self.on_applied(applied)
        except (psycopg2.Error, AwaError) as exc:
            self.failures += 1
            if self.failures == 1:
                log.warning("writing outcomes failed (%s); retrying with backoff, nothing is dropped",
                            first_line(exc))
            close_quietly(self.conn)
            self.conn = None
            with self.lock:
                self.buffer = _merge(batch, self.buffer)
                self.retrying = True
            self.wakeup.wait(min(5.0, 0.1 * (2 ** min(self.failures, 6))))
            self.wakeup.set()  # try again right after the backoff
        finally:
            with self.lock:
                self.in_flight = set()
                # what is still unwritten is in the buffer now (a failed flush merged back)
                before = self.pending_bytes
                self.pending_bytes = sum(payload_bytes(o) for o in self.buffer.completed + self.buffer.others)
                relieved = before > PENDING_BYTES_CAP >= self.pending_bytes
                self.flushed.notify_all()
            if relieved and self.on_relief is not None:
                self.on_relief()


def _merge(older: Completer, newer: Completer) -> Completer:
    """Put a failed batch back in front of what arrived meanwhile."""
    merged = Completer(older.max_crashes)
    merged.completed = older.completed + newer.completed
    merged.others = older.others + newer.others
    merged.progress = {**older.progress, **newer.progress}
    merged.first_pending_at = older.first_pending_at or newer.first_pending_at
    dues = [t for t in (older.progress_due_at, newer.progress_due_at) if t is not None]
    merged.progress_due_at = min(dues) if dues else None
    return merged
