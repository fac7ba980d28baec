"""The supervisor: one process, one select loop over the LISTEN connection,
the children's pipes and process sentinels, and a signal wakeup fd.

It imports the app once before forking, reserves idle children before
claiming, claims one batch per queue plan, hands batches down the pipes,
buffers outcomes and writes them in lease-guarded batches. Signal handlers
only record the signal; the loop acts on it. A lost database connection is
retried with backoff while the children keep running.
"""
from __future__ import annotations

import errno
import json
import logging
import os
import random
import selectors
import signal
import socket
import time
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import psycopg2
import psycopg2.extensions
from tenacity import RetryCallState, wait_exponential, wait_random

from .cancels import CancelRelay
from .child import EXIT_HOOK_FAILED
from .children import ChildHandle, Children, Released
from .completer import BackgroundCompleter
from .claimer import Claimer
from .config import PoolConfig, QueueConfig
from .db import close_quietly, connect, describe, first_line, is_connection_error, socket_of
from .errors import AwaError, ConfigError
from .leader import Leader
from .maintenance import Maintenance, default_services
from .migrate import require_current
from .notifier import Notifier
from .periodic_admin import register_schedules
from .protocol import PROGRESS, REPLY, REQUEST, ClaimedJob, Outcome
from .requests import answer as answer_request
from .sql import QUERIES
from .tasks import all_tasks, import_app
from .version import __version__

log = logging.getLogger(__name__)

STARTING, RUNNING, DRAINING, STOPPING, STOPPED = "starting", "running", "draining", "stopping", "stopped"
SETTINGS_REFRESH_S = 5.0
RECONCILE_INTERVAL_S = 30.0
FINAL_FLUSH_TIMEOUT_S = 10.0


class Supervisor:
    def __init__(self, config: PoolConfig) -> None:
        self.config = config
        self.state = STARTING
        self.hostname = socket.gethostname()
        self.pid = os.getpid()
        self.supervisor_id: Optional[int] = None
        self.conn: Optional[psycopg2.extensions.connection] = None
        self.notifier = Notifier(config.dsn)
        self.listen_ok = True
        self.notify_fd = -1
        self.completer = BackgroundCompleter(config.dsn, config.max_crashes)
        self.children = Children(config.workers, result_max_bytes=config.result_max_bytes,
                                 max_tasks_per_child=config.max_tasks_per_child,
                                 max_memory_per_child=config.max_memory_per_child,
                                 inherited_fds=self._inherited_fds)
        self.cancels = CancelRelay(self.children, config.cancel_grace, self._db)
        self.selector = selectors.DefaultSelector()
        self.writing: Set[int] = set()  # child pipes watched for writability (outbox pending)
        self.queues: Dict[str, QueueConfig] = {}
        self.claimer = Claimer(config, self.children, self._db, lambda: self.conn is not None,
                               self._claimed, held_back=self.completer.over_budget)
        self.completer.on_relief = self._wake  # claiming resumes once big results are written
        self.leader: Optional[Leader] = None
        self.signals: List[int] = []
        self.wakeup_r = self.wakeup_w = -1
        self.exit_code = 0
        self.fatal: Optional[str] = None
        self.drain_deadline: Optional[float] = None
        self.stop_deadline: Optional[float] = None
        self.db_lost_at: Optional[float] = None
        self.reconnect_at = 0.0
        self.reconnect_attempts = 0
        self._backoff = wait_exponential(multiplier=0.2, max=5.0) + wait_random(0, 0.2)
        now = time.monotonic()
        self.next_heartbeat = now
        self.next_poll = now
        self.next_settings = now
        self.next_reconcile = now + RECONCILE_INTERVAL_S
        # Observability hooks (metrics): called in the loop, must be cheap.
        self.on_claim: Optional[Callable[[str, List[ClaimedJob]], None]] = None
        self.on_outcome: Optional[Callable[[str, Outcome], None]] = None
        self.on_event: Optional[Callable[[str, Dict[str, Any]], None]] = None
        self.counters: Dict[str, int] = {}

    # -- start-up ------------------------------------------------------------
    def run(self) -> int:
        """Run until shut down; returns the process exit code."""
        try:
            self._start()
            while self.state != STOPPED:
                self.tick()
        finally:
            self._cleanup()
        return self.exit_code

    def _start(self) -> None:
        if self.config.app:
            import_app(self.config.app)
        self.queues = self._served_queues()
        self.conn = self._connect_at_start()
        require_current(self.conn)
        with self.conn.cursor() as cur:
            cur.execute(QUERIES["register_supervisor"], {
                "hostname": self.hostname, "pid": self.pid, "version": __version__,
                "queues": sorted(self.queues), "workers": self.config.workers})
            self.supervisor_id = cur.fetchone()[0]
            self.claimer.start(self.queues, self.supervisor_id)
            # The registration above committed synchronously (its id seeds
            # every lease this supervisor hands out); from here on the
            # session's writes need not wait for fsync (see worker_session).
            cur.execute(QUERIES["worker_session"])
            for name, queue in self.queues.items():
                cur.execute(QUERIES["configure_queue"], {"name": name, "dlq": queue.dlq, "rate": queue.rate})
            tasks = sorted(all_tasks().values(), key=lambda declared: declared.kind)
            cur.execute(QUERIES["register_task_defaults"], {
                "kinds": [t.kind for t in tasks], "timeouts": [t.timeout for t in tasks]})
        register_schedules(self.conn)
        self._refresh_settings()
        self.completer.start()
        self.notifier.open()
        self.listen_ok = self._probe_listen()
        self._install_signals()
        self._watch_notifier()
        for slot in range(self.config.workers):
            self._spawn(slot)
        if self.config.leader:
            services = default_services(heartbeat_staleness=self.config.heartbeat_staleness,
                                        deadline_grace=self.config.deadline_grace,
                                        retention_completed=self.config.retention_completed,
                                        retention_failed=self.config.retention_failed)
            self.leader = Leader(self.config.dsn, self.supervisor_id, Maintenance(services),
                                 stale_after_s=self.config.heartbeat_staleness)
            self.leader.start()
        self.state = RUNNING
        log.info("supervisor %d started: %d children, queues %s, database %s", self.supervisor_id,
                 self.config.workers, ", ".join(sorted(self.queues)), describe(self.config.dsn))
        self._event("started", {"supervisor_id": self.supervisor_id})

    def _served_queues(self) -> Dict[str, QueueConfig]:
        queues = dict(self.config.queues)
        if not queues:
            for declared in all_tasks().values():
                queues.setdefault(declared.queue, QueueConfig())
        if not queues:
            raise ConfigError("nothing to serve: no --queue given and the app registers no tasks")
        return queues

    def _connect_at_start(self) -> psycopg2.extensions.connection:
        # Commits stay synchronous on this connection: a claim or a callback
        # registration lost in a server crash after its reply reached a child
        # would hand the same lease out twice (see worker_session).
        return connect(self.config.dsn, autocommit=True, retry_for=self.config.connect_timeout,
                       connect_timeout=max(1, int(min(10, self.config.connect_timeout or 1))))

    def _probe_listen(self) -> bool:
        """A LISTEN needs a session; behind a transaction-mode pooler it silently
        never fires. Send ourselves a NOTIFY and fall back to polling if it
        does not come back."""
        assert self.conn is not None
        with self.conn.cursor() as cur:
            cur.execute(QUERIES["probe_notify"])
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            if _wait_readable(self.notifier.fileno(), deadline - time.monotonic()):
                self.notifier.conn.poll()
                if any(n.channel == "awa_jobs" and n.payload == "" for n in self.notifier.conn.notifies):
                    self.notifier.conn.notifies[:] = [
                        n for n in self.notifier.conn.notifies if n.payload != ""]
                    return True
        log.warning("LISTEN/NOTIFY does not reach this supervisor (a transaction-mode connection "
                    "pooler?); falling back to polling every %.1fs", self.config.poll_interval)
        return False

    def _install_signals(self) -> None:
        self.wakeup_r, self.wakeup_w = os.pipe()
        os.set_blocking(self.wakeup_r, False)
        os.set_blocking(self.wakeup_w, False)
        signal.set_wakeup_fd(self.wakeup_w, warn_on_full_buffer=False)
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(signum, self._record_signal)
        self.selector.register(self.wakeup_r, selectors.EVENT_READ, ("wakeup", None))

    def _record_signal(self, signum: int, frame: Any) -> None:
        # Only record: the loop acts on it (no logging or I/O in a handler).
        if signum != signal.SIGCHLD:
            self.signals.append(signum)

    def _inherited_fds(self) -> Tuple[List[int], List[int]]:
        """(fds a new child must close, database sockets it must neutralize)."""
        close = [fd for fd in (self.wakeup_r, self.wakeup_w) if fd >= 0]
        sockets = []
        conns = (self.conn, self.notifier.conn, self.leader.conn if self.leader else None, self.completer.conn)
        sockets = [fd for fd in map(socket_of, conns) if fd is not None]
        return close, sockets

    def _watch_notifier(self) -> None:
        self.notify_fd = self.notifier.fileno()
        self.selector.register(self.notify_fd, selectors.EVENT_READ, ("notify", None))

    def _unwatch_notifier(self) -> None:
        # by the fd we registered: a broken connection may no longer report it
        if self.notify_fd >= 0:
            try:
                self.selector.unregister(self.notify_fd)
            except (KeyError, ValueError):
                pass
            self.notify_fd = -1

    def _spawn(self, slot: int) -> ChildHandle:
        child = self.children.spawn(slot)
        self.selector.register(child.up_fd, selectors.EVENT_READ, ("child", child))
        self.selector.register(child.process.sentinel, selectors.EVENT_READ, ("sentinel", child))
        return child

    # -- the loop --------------------------------------------------------------
    def tick(self, max_wait: Optional[float] = None) -> None:
        """One iteration: wait for events (bounded), then act on everything due."""
        timeout = self._next_timeout()
        if max_wait is not None:
            timeout = min(timeout, max_wait)
        self._watch_outboxes()
        for key, _ in self.selector.select(timeout):
            kind, child = key.data
            if kind == "child":
                self._on_child_readable(child)
            elif kind == "writable":
                self.children.flush(child)
            elif kind == "sentinel":
                self._on_child_exit(child)
            elif kind == "notify":
                self._on_notify()
            elif kind == "wakeup":
                self._drain_wakeup()
        self._handle_signals()
        now = time.monotonic()
        self._enforce_deadlines(now)
        if self.conn is None:
            self._maybe_reconnect(now)
        self._maintain_children()
        if now >= self.next_poll:
            self._poll(now)
        # Dispatch before the periodic writes: a job woken by NOTIFY must not
        # wait behind a heartbeat's round trip.
        if self.state == RUNNING and self.conn is not None:
            self.claimer.hand_out()
        if now >= self.next_heartbeat and self.conn is not None:
            self._heartbeat(now)
        if now >= self.next_settings and self.conn is not None:
            self.next_settings = now + SETTINGS_REFRESH_S
            self._refresh_settings()
        if self.state in (DRAINING, STOPPING):
            self._advance_shutdown(time.monotonic())

    def _watch_outboxes(self) -> None:
        """Wait for a child's pipe to be writable only while messages for
        it wait in its outbox."""
        for child in self.children.all():
            if child.outbox.pending and child.down_fd not in self.writing:
                self.selector.register(child.down_fd, selectors.EVENT_WRITE, ("writable", child))
                self.writing.add(child.down_fd)
            elif not child.outbox.pending and child.down_fd in self.writing:
                self._unwatch_writes(child)

    def _unwatch_writes(self, child: ChildHandle) -> None:
        if child.down_fd in self.writing:
            self.writing.discard(child.down_fd)
            try:
                self.selector.unregister(child.down_fd)
            except (KeyError, ValueError):
                pass

    def _next_timeout(self) -> float:
        now = time.monotonic()
        candidates = [self.next_heartbeat, self.next_poll]
        if self.conn is None:
            candidates.append(self.reconnect_at)
        candidates.append(self.children.next_check(now))
        if self.state in (DRAINING, STOPPING):
            candidates.append(now + 0.05)
        return max(0.0, min(candidates) - now)

    # -- children ----------------------------------------------------------------
    def _on_child_readable(self, child: ChildHandle) -> None:
        if not self.children.current(child):
            return
        outcomes, others = self.children.read(child)
        if outcomes:
            self._record_outcomes(child.queue, outcomes)
        for message in others:
            if message[0] == PROGRESS:
                self.completer.add_progress(message[1], message[2], message[3])
            elif message[0] == REQUEST:
                self._answer(child, message)
        if self.state == RUNNING:
            reason = self.children.recycle_if_due(child)
            if reason:
                log.info("recycling child %d: %s", child.pid, reason)
                self._count("recycled")
                self._event("recycle", {"pid": child.pid, "reason": reason})

    def _record_outcomes(self, queue: Optional[str], outcomes: List[Outcome]) -> None:
        self.completer.add(outcomes, more_coming=self.children.any_busy())
        for outcome in outcomes:
            if queue and outcome.outcome in ("completed", "failed", "retry", "snooze", "cancel"):
                self.claimer.record_job_time(queue, outcome.wall_s)
            self._count(outcome.outcome)
            if self.on_outcome is not None:
                self.on_outcome(queue or "", outcome)

    def _on_child_exit(self, child: ChildHandle) -> None:
        if not self.children.current(child):
            return
        for fd in (child.up_fd, child.process.sentinel):
            try:
                self.selector.unregister(fd)
            except (KeyError, ValueError):
                pass
        self._unwatch_writes(child)
        reaped = self.children.reap(child)
        self._record_outcomes(reaped.queue, reaped.outcomes)
        if reaped.exitcode == EXIT_HOOK_FAILED:
            self.fatal = "an on_child_start hook failed in a new child (see its traceback above)"
            log.error("%s; stopping instead of respawning", self.fatal)
            self.exit_code = 3
            self._begin_stop()
        elif reaped.expected and reaped.exitcode == 0:
            log.debug("child %d exited after its stop request", child.pid)
        else:
            victim = next((o.job_id for o in reaped.outcomes if o.outcome not in ("released", "completed")),
                          None)
            cause = reaped.kill_reason[1] if reaped.kill_reason else reaped.cause
            how = "killed (%s)" if reaped.kill_reason else "died: %s"
            log.warning("child %d " + how + "%s", child.pid, cause,
                        f" while running job {victim}" if victim else "")
            self._count("child_died")
            self._event("child_died", {"pid": child.pid, "cause": cause, "job_id": victim})

    def _maintain_children(self) -> None:
        if self.state == RUNNING:
            for slot in self.children.empty_slots():
                self._spawn(slot)

    def _enforce_deadlines(self, now: float) -> None:
        checked = self.children.check(now)
        if checked.timed_out:
            self._count("timed_out", checked.timed_out)
        self._release(checked.released)

    def _release(self, released: Released) -> None:
        """Jobs children handed back unstarted go back to their queues."""
        if released.outcomes:
            self.completer.add(released.outcomes)
            self.claimer.wake(released.queues)
            self._count("taken_back")

    def _answer(self, child: ChildHandle, message: tuple) -> None:
        _, request_id, job_id, lease, method, payload = message
        try:
            value = self._db_required(lambda cur: answer_request(cur, job_id, lease, method, payload))
            reply = (REPLY, request_id, True, value)
        except Exception as exc:  # the handler gets the error raised in its own code
            reply = (REPLY, request_id, False, exc if isinstance(exc, AwaError) else AwaError(str(exc)))
        self.children.reply(child, reply)

    # -- database ----------------------------------------------------------------
    def _db_required(self, fn: Callable[[Any], Any]) -> Any:
        """Run fn(cursor) on the main connection; errors propagate (a lost
        connection also starts reconnecting)."""
        if self.conn is None:
            raise AwaError("the database is unreachable right now")
        try:
            with self.conn.cursor() as cur:
                return fn(cur)
        except psycopg2.Error as exc:
            if is_connection_error(exc) or self.conn.closed:
                self._lost_db(exc)
            raise

    def _db(self, what: str, fn: Callable[[Any], Any]) -> Any:
        """Run fn(cursor); on any database error log it (or start
        reconnecting) and return None."""
        try:
            return self._db_required(fn)
        except AwaError:
            return None
        except psycopg2.Error as exc:
            if self.conn is not None:
                log.error("%s failed: %s", what, first_line(exc))
            return None

    def _lost_db(self, exc: BaseException) -> None:
        if self.db_lost_at is None:
            self.db_lost_at = time.monotonic()
            log.warning("lost the database connection (%s); retrying with backoff while children "
                        "keep running", first_line(exc))
            self._count("db_disconnects")
            self._event("db_lost", {"error": first_line(exc)})
        close_quietly(self.conn)
        self.conn = None
        self._unwatch_notifier()
        self.notifier.close()
        self.reconnect_attempts = 0
        self.reconnect_at = time.monotonic()

    def _maybe_reconnect(self, now: float) -> None:
        if now < self.reconnect_at:
            return
        self.reconnect_attempts += 1
        try:
            conn = connect(self.config.dsn, autocommit=True, connect_timeout=3)
            with conn.cursor() as cur:
                cur.execute(QUERIES["worker_session"])
            self.notifier.open()
        except (AwaError, psycopg2.Error) as exc:
            self.notifier.close()
            state = RetryCallState(None, None, (), {})
            state.attempt_number = self.reconnect_attempts
            delay = self._backoff(state)
            self.reconnect_at = now + delay
            log.debug("reconnect attempt %d failed (%s); next in %.1fs", self.reconnect_attempts,
                      first_line(exc), delay)
            return
        self.conn = conn
        self._watch_notifier()
        outage = now - (self.db_lost_at or now)
        self.db_lost_at = None
        log.info("reconnected to the database after %.1fs", outage)
        self._event("db_reconnected", {"outage_s": round(outage, 3)})
        self.claimer.wake()
        self._reconcile()
        self.next_heartbeat = now

    def _reconcile(self) -> None:
        """Release jobs the database says this supervisor runs but no child
        holds (a claim that committed while its reply was lost)."""
        if self.conn is None or self.supervisor_id is None:
            return
        rows = self._db("reconciling", lambda cur: (cur.execute(
            QUERIES["my_running_jobs"], {"id": self.supervisor_id}), cur.fetchall())[1])
        if not rows:
            return
        held = self.children.inflight_leases()
        pending = self.completer.pending_ids()
        orphans = [(job_id, lease) for job_id, lease in rows
                   if held.get(job_id) != lease and job_id not in pending]
        if orphans:
            log.warning("releasing %d job(s) claimed by this supervisor but held by no child", len(orphans))
            self.completer.add([Outcome(job_id, lease, "released") for job_id, lease in orphans])

    def _heartbeat(self, now: float) -> None:
        self.next_heartbeat = now + self.config.heartbeat_interval
        stats = json.dumps(self.stats())

        def beat(cur: Any) -> None:
            cur.execute(QUERIES["heartbeat"], {
                "id": self.supervisor_id, "hostname": self.hostname, "pid": self.pid,
                "version": __version__, "queues": sorted(self.queues), "workers": self.config.workers,
                "stats": stats})

        self._db("heartbeat", beat)
        self.cancels.sweep(now)
        if now >= self.next_reconcile:
            self.next_reconcile = now + RECONCILE_INTERVAL_S
            self._reconcile()

    def stats(self) -> Dict[str, Any]:
        return dict(
            self.children.summary(), state=self.state, leader=bool(self.leader and self.leader.is_leader),
            counters=dict(self.counters, claims=self.claimer.claims, empty_claims=self.claimer.empty_claims,
                          claimed_jobs=self.claimer.claimed_jobs, completion_flushes=self.completer.flushes),
            listen=self.listen_ok)

    def _poll(self, now: float) -> None:
        interval = self.config.poll_interval if self.listen_ok else min(self.config.poll_interval, 0.2)
        self.next_poll = now + interval * random.uniform(0.9, 1.1)
        self.claimer.wake()
        if not self.listen_ok:
            self.cancels.sweep(now)

    def _refresh_settings(self) -> None:
        def read(cur: Any) -> None:
            cur.execute(QUERIES["queue_settings"], {"names": sorted(self.queues)})
            for name, shards, paused in cur.fetchall():
                self.claimer.shards[name] = shards
                if paused:
                    self.claimer.has_work[name] = False

        self._db("reading queue settings", read)

    def _on_notify(self) -> None:
        if not self.notifier.connected:
            # An earlier event of the same select() lost the database and
            # closed the LISTEN session: this readiness is stale.
            return
        try:
            queues, cancels = self.notifier.drain()
        except psycopg2.Error as exc:
            self._lost_db(exc)
            return
        self.claimer.wake(queues)
        if cancels:
            self.cancels.on_notified(cancels, time.monotonic())

    # -- signals and shutdown ------------------------------------------------------
    def _drain_wakeup(self) -> None:
        try:
            while os.read(self.wakeup_r, 4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        except OSError as exc:
            if exc.errno != errno.EAGAIN:
                raise

    def _handle_signals(self) -> None:
        while self.signals:
            signum = self.signals.pop(0)
            if signum == signal.SIGHUP:
                log.info("SIGHUP ignored (restart the supervisor to reload the app)")
                continue
            name = signal.Signals(signum).name
            if self.state == RUNNING:
                log.info("%s: draining (no new jobs; waiting up to %gs for running ones)", name,
                         self.config.shutdown_timeout)
                self._begin_drain()
            elif self.state == DRAINING:
                log.warning("second %s: stopping now; running jobs go back to the queue", name)
                self._begin_stop()

    def request_shutdown(self) -> None:
        """Start a graceful shutdown, as SIGTERM does (for embedding and tests);
        safe to call from another thread or a signal handler."""
        self.signals.append(signal.SIGTERM)
        self._wake()

    def _wake(self) -> None:
        """Make the loop look around now (safe from any thread)."""
        if self.wakeup_w >= 0:
            try:
                os.write(self.wakeup_w, b"\0")
            except OSError:
                pass

    def _begin_drain(self) -> None:
        self.state = DRAINING
        self.drain_deadline = time.monotonic() + self.config.shutdown_timeout
        self._release(self.children.take_back_all("shutting down"))  # only running jobs finish
        self._event("draining", {})

    def _begin_stop(self) -> None:
        """Kill whatever still runs; its jobs go back as available."""
        self.state = STOPPING
        self.stop_deadline = time.monotonic() + 5.0
        self.children.interrupt()

    def _advance_shutdown(self, now: float) -> None:
        if self.state == DRAINING:
            if self.children.any_busy():
                if self.drain_deadline is not None and now >= self.drain_deadline:
                    log.warning("shutdown timeout reached; killing the children still running jobs")
                    self._begin_stop()
                return
            self._begin_stop()
        if self.state == STOPPING:
            self.children.stop_idle()
            if self.children.all() and now < (self.stop_deadline or now):
                return
            for child in self.children.all():  # did not exit in time
                self.children.kill(child, "interrupted", "interrupted by supervisor shutdown")
                child.process.join(timeout=2)
                self._on_child_exit(child)
            self._final_flush()
            self.state = STOPPED

    def _final_flush(self) -> None:
        if not self.completer.drain(FINAL_FLUSH_TIMEOUT_S):
            log.error("could not record %d outcome(s) before exiting; the leader will rescue "
                      "those jobs", self.completer.pending)
        self.completer.stop()
        if self.conn is None:
            self.reconnect_at = 0.0
            self._maybe_reconnect(time.monotonic())
        self._db("marking the supervisor stopped", lambda cur: cur.execute(
            QUERIES["supervisor_stopped"], {"id": self.supervisor_id, "stats": json.dumps(self.stats())}))

    def _cleanup(self) -> None:
        self.completer.stop()
        if self.leader is not None:
            self.leader.stop()
        self.children.kill_all()
        self.notifier.close()
        close_quietly(self.conn)
        if self.wakeup_w >= 0:
            try:
                signal.set_wakeup_fd(-1)
            except ValueError:
                pass
            for fd in (self.wakeup_r, self.wakeup_w):
                os.close(fd)
            self.wakeup_r = self.wakeup_w = -1
        self.selector.close()
        if self.state == STOPPED:
            log.info("supervisor %s stopped", self.supervisor_id)

    def _claimed(self, queue: str, jobs: List[ClaimedJob]) -> None:
        if self.on_claim is not None:
            self.on_claim(queue, jobs)

    # -- observability hooks ----------------------------------------------------
    def _count(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n

    def _event(self, name: str, fields: Dict[str, Any]) -> None:
        if self.on_event is not None:
            self.on_event(name, fields)


def _wait_readable(fd: int, timeout: float) -> bool:
    with selectors.DefaultSelector() as probe:
        probe.register(fd, selectors.EVENT_READ)
        return bool(probe.select(max(0.0, timeout)))
