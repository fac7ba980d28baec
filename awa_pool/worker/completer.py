"""The completer: a thread with its own connection that writes the
children's outcomes in lease-guarded batches (outcome_buffer.py), so the
success path costs no per-job SQL and writing overlaps claiming. When a
flush goes is the FlushPolicy's rule (flush_policy.py).

The loop hands it outcomes (`add`) and may lend its waiting successes to a
claim that writes them on its way (`lend`, then `repay`); nothing else
crosses between the two threads. A flush lost to a broken connection is
merged back and retried after a backoff; the thread never drops an entry
on its own.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Set

import psycopg2

from ..core.db import close_quietly, connect, first_line, session_name, socket_of
from ..core.errors import AwaError
from ..core.sql import QUERIES
from .flush_policy import FLUSH_SIZE, RIDE_MAX, FlushPolicy  # noqa: F401  (re-exported for tests)
from .outcome_buffer import PENDING_BYTES_CAP, OutcomeBuffer, merge
from .outcome_params import payload_bytes
from .protocol import Outcome

log = logging.getLogger(__name__)

Completer = OutcomeBuffer   # the buffer and its statements, by its former name


class BackgroundCompleter:
    def __init__(self, dsn: str, max_crashes: int,
                 on_settled: Optional[Callable[[List[Outcome], list], None]] = None) -> None:
        self.dsn = dsn
        self.max_crashes = max_crashes
        self.buffer = OutcomeBuffer(max_crashes)
        self.policy = FlushPolicy()
        self.lock = threading.Lock()
        self.flushed = threading.Condition(self.lock)
        self.wakeup = threading.Event()
        self.in_flight: Set[int] = set()
        self.lent: List[Outcome] = []   # successes riding on a claim statement (see lend)
        self.rides = 0   # successes written by claims (lend, then repay as written)
        self.conn: Optional[Any] = None
        self.session_settings = True   # False behind a transaction pooler: no SET on its sessions
        self.supervisor_id: Optional[int] = None   # names its session (set once registered)
        self.stopping = False
        self.thread: Optional[threading.Thread] = None
        self.stats: Dict[str, int] = {}
        self.flushes = 0    # transactions that wrote outcomes
        self.failures = 0
        self.force = False  # flush progress at once (shutdown)
        # After a flush: the outcomes other than successes that went into it
        # and the (job id, new state) it applied (the failure log lines).
        self.on_settled = on_settled
        # JSON text of results and progress not yet written (buffered or in
        # flight); over PENDING_BYTES_CAP the supervisor claims nothing, and
        # on_relief() is called once it is back under.
        self.pending_bytes = 0
        self.on_relief: Optional[Callable[[], None]] = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="awa-pool-completer", daemon=True)
        self.thread.start()

    # -- the loop's side -------------------------------------------------------------
    def add(self, outcomes: Iterable[Outcome], more_coming: bool = False, wake: bool = True) -> None:
        """Buffer outcomes for the next flush: one lock and one wake-up for
        all of them (a child reports a batch at a time). `more_coming`: jobs
        are still running, so a small flush may wait for their outcomes.
        `wake=False`: the caller calls nudge() soon (after a claim that may
        carry them, so the thread is not woken for nothing)."""
        added = 0
        with self.lock:
            for outcome in outcomes:
                self.buffer.add(outcome)
                self.pending_bytes += payload_bytes(outcome)
                added += 1
            if added:
                self.policy.arrived(time.monotonic(), more_coming)
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
        """Take the plain successes waiting to be written, for a claim that
        is about to go and writes them in its own statement and commit: one
        round trip for both, and the flush they waited for company for is
        not needed (FlushPolicy.may_ride). They count as pending until
        repay() says whether the claim's statement went through."""
        with self.lock:
            completed = self.buffer.completed
            if self.lent or not self.policy.may_ride(len(completed)):
                return []
            plain = [o for o in completed if o.result is None and o.progress is None]
            if not plain:
                return []
            self.buffer.completed = [o for o in completed if o.result is not None or o.progress is not None]
            if not self.buffer.pending:
                self.buffer.first_pending_at = None   # nothing left to wait for company for
            self.lent = plain
            return list(plain)

    def repay(self, written: bool) -> None:
        """The claim that took lend()'s outcomes is over: they are written
        (True), or its statement failed and they go back in front of the
        buffer, to be written at once (False; the lease guard makes a second
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
            self.policy.retrying = True
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

    # -- the thread ------------------------------------------------------------------
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
        """Let a small flush gather company before it goes (FlushPolicy)."""
        with self.lock:
            small = not self.policy.retrying and self.policy.small(self.buffer.pending)
        if not small:
            return
        time.sleep(self.policy.COALESCE_S)
        while not (self.stopping or self.force):
            with self.lock:
                window = self.policy.window(self.buffer.pending)
                if window <= 0 or self.buffer.first_pending_at is None:
                    return
                remaining = self.buffer.first_pending_at + window - time.monotonic()
            if remaining <= 0:
                return
            self.wakeup.wait(remaining)
            self.wakeup.clear()

    def _flush_once(self) -> None:
        with self.lock:
            batch = self.buffer
            progress_due = batch.progress_due_at is not None and (
                self.force or time.monotonic() >= batch.progress_due_at)
            if not batch.pending and not progress_due:
                self.flushed.notify_all()
                return
            self.buffer = OutcomeBuffer(self.max_crashes)
            if not progress_due:
                # keep progress buffered until its interval; flush outcomes now
                self.buffer.progress, batch.progress = batch.progress, {}
                self.buffer.progress_due_at, batch.progress_due_at = batch.progress_due_at, None
            self.policy.retrying = False
            self.in_flight = {o.job_id for o in batch.completed + batch.others}
        try:
            if self.conn is None or self.conn.closed:
                self.conn = connect(self.dsn, autocommit=True, connect_timeout=5,
                                    application_name=session_name("completer", self.supervisor_id))
                if self.session_settings:  # not through a transaction pooler (session.py)
                    with self.conn.cursor() as cur:
                        cur.execute(QUERIES["worker_session"])
            writes_outcomes = bool(batch.completed or batch.others)
            settling = list(batch.others)
            with self.conn.cursor() as cur:
                applied = batch.flush(cur)
            self.failures = 0
            self.flushes += writes_outcomes
            for _, state in applied:
                self.stats[state] = self.stats.get(state, 0) + 1
            if self.on_settled is not None and settling:
                self.on_settled(settling, applied)
        except (psycopg2.Error, AwaError) as exc:
            self.failures += 1
            if self.failures == 1:
                log.warning("writing outcomes failed (%s); retrying with backoff, nothing is dropped",
                            first_line(exc))
            close_quietly(self.conn)
            self.conn = None
            with self.lock:   # back in the buffer: no longer in flight (counted once while it waits)
                self.buffer = merge(batch, self.buffer)
                self.in_flight = set()
                self.policy.retrying = True
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
