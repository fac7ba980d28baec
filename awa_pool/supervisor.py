"""The supervisor: one process, one select loop over the LISTEN connection,
the children's pipes and process sentinels, and a signal wakeup fd.

It imports the app once before forking, reserves idle children before
claiming, claims one batch per queue plan, hands batches down the pipes,
and passes outcomes to the completer, which writes them in lease-guarded
batches. The loop's thread alone touches scheduling state (children,
claims, placement); the completer, leader and watchdog threads exchange
messages with it (docs/architecture.md, "Threads and locks"). Signal
handlers only record the signal; the loop acts on it (signals.py). A lost
connection is retried with backoff while the children keep running.
`run()` is `start()`, `step()` until stopped, then `close()`; tests and
embedding programs may drive those three themselves.
"""
from __future__ import annotations

import json
import logging
import os
import random
import socket
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import psycopg2

from .core.config import PoolConfig, QueueConfig
from .core.db import describe, socket_of
from .core.errors import AwaError
from .core.sql import QUERIES
from .core.tasks import import_app
from .core.version import __version__
from .worker import ownership
from .worker.cancels import CancelRelay
from .worker.children import ChildHandle, Children, Released
from .worker.claimer import Claimer
from .worker.completer import BackgroundCompleter
from .worker.failure_log import FailureLog
from .worker.handout import HandOut
from .worker.inflight import Finished
from .worker.leader import Leader
from .worker.lifecycle import RUNNING, STOPPED, Lifecycle
from .worker.loop_events import CHILD, NOTIFY, SENTINEL, WAKEUP, WRITABLE, LoopEvents
from .worker.maintenance import Maintenance, services_for
from .worker.outcomes import COMPLETED, EXIT_HOOK_FAILED, RAN, RELEASED
from .worker.placement import JobTimes
from .worker.protocol import PROGRESS, REPLY, REQUEST, ClaimedJob, Outcome
from .worker.registration import read_queue_settings, served_queues
from .worker.requests import answer as answer_request
from .worker.session import Session
from .worker.signals import SignalRelay
from .worker.watchdog import LoopTurn, Watchdog

log = logging.getLogger(__name__)

SETTINGS_REFRESH_S = 5.0
RECONCILE_INTERVAL_S = 30.0
FINAL_FLUSH_TIMEOUT_S = 10.0


class Supervisor:
    def __init__(self, config: PoolConfig) -> None:
        self.config = config
        self.hostname = socket.gethostname()
        self.pid = os.getpid()
        self.supervisor_id: Optional[int] = None
        self.turn = LoopTurn()
        self.session = Session(config, on_lost=self._on_db_lost, on_back=self._on_db_back,
                               on_listen=self._on_listen, turn=self.turn)
        self.failures = FailureLog(config.max_crashes)   # its lines, once the completer settled them
        self.completer = BackgroundCompleter(config.dsn, config.max_crashes, on_settled=self.failures.settled)
        self.children = Children(config.workers, result_max_bytes=config.result_max_bytes,
                                 max_tasks_per_child=config.max_tasks_per_child,
                                 max_memory_per_child=config.max_memory_per_child,
                                 inherited_fds=self._inherited_fds)
        self.life = Lifecycle(self.children, config.shutdown_timeout, on_drain=self._drain,
                              on_killed=self._on_child_exit, on_stopped=self._final_flush)
        self.cancels = CancelRelay(self.children, config.cancel_grace, self.db)
        self.events = LoopEvents()
        self.queues: Dict[str, QueueConfig] = {}
        self.claimer = Claimer(config, JobTimes(), self.db, completions=self.completer,
                               on_claimed=lambda queue, jobs: self.on_claim and self.on_claim(queue, jobs))
        self.handout = HandOut(config, self.children, self.claimer, ready=lambda: (
            self.session.connected and not self.completer.over_budget()))
        self.leader: Optional[Leader] = None
        self.watchdog = Watchdog(config.session_dsn or config.dsn, self.turn)
        self.signals = SignalRelay()
        self.completer.on_relief = self.signals.wake  # claiming resumes once big results are written
        self.exit_code = 0
        self.fatal: Optional[str] = None
        now = time.monotonic()
        self.next_heartbeat = now
        self.next_poll = now
        self.next_settings = now
        self.next_reconcile = now + RECONCILE_INTERVAL_S
        # Observability hooks (metrics): called in the loop, must be cheap.
        self.on_claim: Optional[Callable[[str, List[ClaimedJob]], None]] = None
        self.on_outcome: Optional[Callable[[Finished], None]] = None
        self.on_event: Optional[Callable[[str, Dict[str, Any]], None]] = None
        self.counters: Dict[str, int] = {}
        self.nudge_completer = False

    # -- start-up ------------------------------------------------------------
    def run(self) -> int:
        """Run until shut down; returns the process exit code."""
        try:
            self.start()
            while self.state != STOPPED:
                self.step()
        finally:
            self.close()
        return self.exit_code

    def start(self) -> None:
        """Import the app, connect and register, start the completer, the
        leader and the watchdog, fork the children. The calling thread is
        the loop's from now on: only it may call step()."""
        ownership.bind(self.children, self.claimer, self.claimer.times, self.claimer.stride, self.handout)
        if self.config.app:
            import_app(self.config.app)
        self.queues = served_queues(self.config.queues)
        self._start_session()
        self.completer.start()
        self._install_signals()
        self._watch_notifier()
        for slot in self.children.empty_slots():
            self._spawn(slot)
        if self.session.may_lead:
            # every supervisor with a session runs the thread: it holds the
            # second liveness lock (liveness.py); only a leading one campaigns
            self.leader = Leader(self.config.session_dsn or self.config.dsn, self.supervisor_id,
                                 Maintenance(services_for(self.config, self.supervisor_id)),
                                 stale_after_s=self.config.heartbeat_staleness,
                                 campaign=self.config.leader)
            self.leader.start()
        self.watchdog.start()
        self.state = RUNNING
        log.info("supervisor %d started: %d children, queues %s, database %s", self.supervisor_id,
                 self.config.workers, ", ".join(sorted(self.queues)), describe(self.config.dsn))
        self._event("started", {"supervisor_id": self.supervisor_id})

    def _start_session(self) -> None:
        registration = self.session.start(self.queues, self.pid)
        self.supervisor_id = registration.supervisor_id
        self.completer.session_settings = not self.session.pooled
        self.completer.supervisor_id = self.supervisor_id
        self.claimer.start(self.queues, self.supervisor_id)
        self.claimer.apply_settings(registration.settings)

    def _install_signals(self) -> None:
        self.events.watch_wakeup(self.signals.install())

    def _inherited_fds(self) -> Tuple[List[int], List[int]]:
        """(fds a new child must close, database sockets it must neutralize)."""
        close = [fd for fd in (self.signals.read_fd, self.signals.write_fd) if fd >= 0]
        conns = (self.leader.conn if self.leader else None, self.completer.conn)
        return close, self.session.sockets() + [fd for fd in map(socket_of, conns) if fd is not None]

    def _watch_notifier(self) -> None:
        if self.session.notifier.connected:   # none behind a transaction pooler without a session URL
            self.events.watch_notifier(self.session.notifier.fileno())

    def _spawn(self, slot: int) -> ChildHandle:
        child = self.children.spawn(slot)
        self.events.watch_child(child)
        return child

    # -- the loop --------------------------------------------------------------
    def step(self, max_wait: Optional[float] = None) -> None:
        """One turn of the loop: wait for events (at most `max_wait`, and no
        longer than the next deadline), then act on everything due."""
        timeout = self._next_timeout()
        if max_wait is not None:
            timeout = min(timeout, max_wait)
        self.events.watch_outboxes(self.children.all())
        self.turn.idle()
        ready = self.events.select(timeout)
        self.turn.begin()
        for kind, child in ready:
            if kind == CHILD:
                self._on_child_readable(child)
            elif kind == WRITABLE:
                self.children.flush(child)
            elif kind == SENTINEL:
                self._on_child_exit(child)
            elif kind == NOTIFY:
                self._on_notify()
            elif kind == WAKEUP:
                self.signals.drain_wakeup()
        self.life.on_signals(self.signals.take())
        now = time.monotonic()
        self.check_deadlines(now)
        self.session.maybe_reconnect(now)
        if self.state == RUNNING:
            for slot in self.children.empty_slots():
                self._spawn(slot)
        if now >= self.next_poll:
            self._poll(now)
        # Dispatch before the periodic writes: a job woken by NOTIFY must not
        # wait behind a heartbeat's round trip.
        if self.state == RUNNING:
            self.handout.run()
        if self.nudge_completer:  # what no claim carried just now
            self.nudge_completer = False
            self.completer.nudge()
        connected = self.session.connected
        if now >= self.next_heartbeat and connected:
            self._heartbeat(now)
        if now >= self.next_settings and connected:
            self.next_settings = now + SETTINGS_REFRESH_S
            self._refresh_settings()
        if self.life.winding_down:
            self.life.advance(time.monotonic())

    def _next_timeout(self) -> float:
        now = time.monotonic()
        # no heartbeat goes without a connection: a past one must not turn
        # the loop into a busy spin for the whole outage
        candidates = [self.next_poll, self.next_heartbeat if self.session.connected else self.session.reconnect_at,
                      self.children.next_check(now)]
        if self.life.winding_down:
            candidates.append(now + 0.05)
        return max(0.0, min(candidates) - now)

    # -- children ----------------------------------------------------------------
    def _on_child_readable(self, child: ChildHandle) -> None:
        if not self.children.current(child):
            return
        outcomes, others = self.children.read(child)
        if outcomes:
            # the completer is woken after this turn's claims, which may carry them
            self._record_outcomes(outcomes, wake=False)
            self.nudge_completer = True
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

    def _record_outcomes(self, outcomes: List[Finished], wake: bool = True) -> None:
        self.failures.note(outcomes)   # before the completer may settle them
        self.completer.add([finished.outcome for finished in outcomes], more_coming=self.children.any_busy(),
                           wake=wake)
        for finished in outcomes:
            outcome, job = finished.outcome, finished.job
            if job and outcome.outcome in RAN:
                self.claimer.times.record(job.queue, outcome.wall_s)
            self._count(outcome.outcome)
            if self.on_outcome is not None:
                self.on_outcome(finished)

    def _on_child_exit(self, child: ChildHandle) -> None:
        if not self.children.current(child):
            return
        self.events.forget_child(child)
        reaped = self.children.reap(child)
        self._record_outcomes(reaped.outcomes)
        if reaped.exitcode == EXIT_HOOK_FAILED:
            self.fatal = "an on_child_start hook failed in a new child (see its traceback above)"
            log.error("%s; stopping instead of respawning", self.fatal)
            self.exit_code = 3
            self._event("stopping", {"reason": self.fatal})
            self.life.begin_stop()
        elif reaped.expected and reaped.exitcode == 0:
            log.debug("child %d exited after its stop request", child.pid)
        else:
            victim = next((f.outcome.job_id for f in reaped.outcomes
                           if f.outcome.outcome not in (RELEASED, COMPLETED)), None)
            cause = reaped.kill_reason[1] if reaped.kill_reason else reaped.cause
            how = "killed (%s)" if reaped.kill_reason else "died: %s"
            log.warning("child %d " + how + "%s", child.pid, cause,
                        f" while running job {victim}" if victim else "")
            self._count("child_died")
            self._event("child_died", {"pid": child.pid, "cause": cause, "job_id": victim})

    def check_deadlines(self, now: float) -> None:
        """What each turn does at `now` (a test may pass a later clock):
        timeouts, take-back of jobs queued behind a long one, cancel grace."""
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
            value = self.session.run(lambda cur: answer_request(cur, job_id, lease, method, payload),
                                     f"a child's request ({method})")
            reply = (REPLY, request_id, True, value)
        except Exception as exc:  # the handler gets the error raised in its own code
            reply = (REPLY, request_id, False, exc if isinstance(exc, AwaError) else AwaError(str(exc)))
        self.children.reply(child, reply)

    # -- database ----------------------------------------------------------------
    def db(self, what: str, fn: Callable[[Any], Any]) -> Any:
        """fn(cursor) on the main session; on a database error, log it (or
        start reconnecting) and return None."""
        return self.session.run_quietly(what, fn)

    def _on_db_lost(self, error: str) -> None:
        self._count("db_disconnects")
        self._event("db_lost", {"error": error})

    def _on_db_back(self, outage: float) -> None:
        self._event("db_reconnected", {"outage_s": round(outage, 3)})
        self.claimer.look()
        self.reconcile()
        self.next_heartbeat = time.monotonic()

    def _on_listen(self, up: bool) -> None:
        """The LISTEN session went down or came back: notifications sent
        meanwhile are lost to it, so the poll and the cancel sweep look."""
        if up:
            self._watch_notifier()
            self.next_poll = time.monotonic()
            self.cancels.sweep(self.next_poll)
        else:
            self.events.unwatch_notifier()

    def reconcile(self) -> None:
        """Release jobs the database says this supervisor runs but no child
        holds (a claim that committed while its reply was lost)."""
        if not self.session.connected or self.supervisor_id is None:
            return
        rows = self.db("reconciling", lambda cur: (cur.execute(
            QUERIES["my_running_jobs"], {"id": self.supervisor_id}), cur.fetchall())[1])
        if not rows:
            return
        held = self.children.inflight_leases()
        pending = self.completer.pending_ids()
        orphans = [(job_id, lease) for job_id, lease in rows
                   if held.get(job_id) != lease and job_id not in pending]
        if orphans:
            log.warning("releasing %d job(s) claimed by this supervisor but held by no child: %s", len(orphans),
                        ", ".join(str(job_id) for job_id, _ in orphans[:20]) + (" ..." if len(orphans) > 20 else ""))
            self.completer.add([Outcome(job_id, lease, RELEASED) for job_id, lease in orphans])

    def _heartbeat(self, now: float) -> None:
        self.next_heartbeat = now + self.config.heartbeat_interval
        stats = json.dumps(self.stats())
        self.db("heartbeat", lambda cur: cur.execute(QUERIES["heartbeat"], {
            "id": self.supervisor_id, "hostname": self.hostname, "pid": self.pid, "version": __version__,
            "queues": sorted(self.queues), "workers": self.config.workers, "stats": stats}))
        self.session.check_liveness()
        self.cancels.sweep(now)
        if now >= self.next_reconcile:
            self.next_reconcile = now + RECONCILE_INTERVAL_S
            self.reconcile()

    def stats(self) -> Dict[str, Any]:
        claimer = self.claimer
        return dict(
            self.children.summary(), state=self.state, leader=bool(self.leader and self.leader.is_leader),
            counters=dict(self.counters, claims=claimer.claims, empty_claims=claimer.empty_claims,
                          claimed_jobs=claimer.claimed_jobs, completion_flushes=self.completer.flushes,
                          completion_rides=self.completer.rides, overtakes=self.children.overtakes,
                          urgent_claims=claimer.rushes, loop_stalls=self.watchdog.stalls),
            listen=self.session.listen_ok)

    def _poll(self, now: float) -> None:
        listen_ok = self.session.listen_ok
        interval = self.config.poll_interval if listen_ok else min(self.config.poll_interval, 0.2)
        self.next_poll = now + interval * random.uniform(0.9, 1.1)
        self.claimer.look()
        if not listen_ok:
            self.cancels.sweep(now)

    def _refresh_settings(self) -> None:
        settings = self.db("reading queue settings", lambda cur: read_queue_settings(cur, self.queues))
        if settings is not None:
            self.claimer.apply_settings(settings)

    def _on_notify(self) -> None:
        if not self.session.notifier.connected:
            # An earlier event of the same select() lost the database and
            # closed the LISTEN session: this readiness is stale.
            return
        try:
            notes = self.session.notifier.drain()
        except psycopg2.Error as exc:
            self.session.listen_lost(exc)
            return
        self.claimer.wake(notes.queues)
        self.claimer.rush(notes.urgent)   # claimed at once by this turn's hand-out
        if notes.cancels:
            self.cancels.on_notified(notes.cancels, time.monotonic())

    # -- shutdown (lifecycle.Lifecycle) -------------------------------------------
    @property
    def state(self) -> str:
        return self.life.state

    @state.setter
    def state(self, value: str) -> None:
        self.life.state = value

    def request_shutdown(self) -> None:
        """Start a graceful shutdown, as SIGTERM does (for embedding and tests);
        safe to call from another thread or a signal handler."""
        self.signals.request_stop()

    def _drain(self, reason: str) -> None:
        self._release(self.children.take_back_all("shutting down"))  # only running jobs finish
        self._event("draining", {"reason": reason})

    def _final_flush(self) -> None:
        if not self.completer.drain(FINAL_FLUSH_TIMEOUT_S):
            log.error("could not record %d outcome(s) before exiting; the leader will rescue "
                      "those jobs", self.completer.pending)
        self.completer.stop()
        if not self.session.connected:
            self.session.reconnect_at = 0.0
            self.session.maybe_reconnect(time.monotonic())
        self.db("marking the supervisor stopped", lambda cur: cur.execute(
            QUERIES["supervisor_stopped"], {"id": self.supervisor_id, "stats": json.dumps(self.stats())}))

    def close(self) -> None:
        """Stop the threads, kill what children are left, close every
        connection, give the signal handlers back."""
        self.watchdog.stop()
        self.completer.stop()
        if self.leader is not None:
            self.leader.stop()
        self.children.kill_all()
        self.session.close()
        self.signals.restore()
        self.events.close()
        if self.state == STOPPED:
            log.info("supervisor %s stopped", self.supervisor_id)

    # -- observability hooks ----------------------------------------------------
    def _count(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n

    def _event(self, name: str, fields: Dict[str, Any]) -> None:
        if self.on_event is not None:
            self.on_event(name, fields)
