"""A host program that embeds a Pool, for tests/test_embedding.py.

    python -m apps.embedding_host MODE DSN EVENTS_FILE

Every hook call and what the host observes goes to EVENTS_FILE as one JSON
object per line. Modes:
  hooks   every hook, one of them raising on each outcome
  chain   the host's own SIGTERM handler (writes an event, calls pool.stop())
          and its own wakeup fd, both checked after run() returns
  exit    the host's SIGTERM handler calls sys.exit(7)
  thread  run() in a second thread; the main thread enqueues, then stops it
  fatal   an app whose on_child_start hook fails
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import sys
import threading

import psycopg2

import awa_pool

MODE, DSN, EVENTS = sys.argv[1], sys.argv[2], sys.argv[3]


def event(name: str, **fields) -> None:
    with open(EVENTS, "a") as handle:
        handle.write(json.dumps(dict(fields, event=name)) + "\n")


def as_fields(value) -> dict:
    fields = dataclasses.asdict(value)
    if "queues" in fields:
        fields["queues"] = list(fields["queues"])
    return fields


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    app = "apps.bad_hook" if MODE == "fatal" else "apps.basic"
    pool = awa_pool.Pool(DSN, app=app, workers=1, queues=["default"], shutdown_timeout=30,
                         on_started=lambda info: event("started", **as_fields(info)),
                         on_outcome=lambda outcome: event("outcome", **as_fields(outcome)))

    @pool.on_stopping
    def stopping(info: awa_pool.PoolInfo) -> None:
        event("stopping", **as_fields(info))

    if MODE == "hooks":
        @pool.on_outcome
        def broken(outcome: awa_pool.OutcomeEvent) -> None:
            raise RuntimeError(f"broken hook saw job {outcome.job_id}")

    if MODE in ("chain", "exit"):
        def on_term(signum, frame) -> None:
            event("host_sigterm", signum=signum, frame_is_none=frame is None)
            if MODE == "exit":
                sys.exit(7)
            pool.stop()  # a host that stops the pool itself: must not cut the drain short

        signal.signal(signal.SIGTERM, on_term)
        wakeup_r, wakeup_w = os.pipe()
        os.set_blocking(wakeup_w, False)
        signal.set_wakeup_fd(wakeup_w)
        code = pool.run()
        event("after_run", code=code, sigterm_restored=signal.getsignal(signal.SIGTERM) is on_term,
              sigint_restored=signal.getsignal(signal.SIGINT) is signal.default_int_handler,
              wakeup_restored=signal.set_wakeup_fd(-1) == wakeup_w)
        return code

    if MODE == "thread":
        before = signal.getsignal(signal.SIGTERM)
        started, finished = threading.Event(), threading.Event()
        pool.on_started(lambda info: started.set())
        pool.on_outcome(lambda outcome: finished.set())
        codes = []
        runner = threading.Thread(target=lambda: codes.append(pool.run()))
        runner.start()
        if not started.wait(60):
            event("error", what="the pool did not start within 60 s")
            pool.stop()
            runner.join(60)
            return 1
        event("running", sigterm_untouched=signal.getsignal(signal.SIGTERM) is before)
        conn = psycopg2.connect(DSN)
        with conn:
            awa_pool.enqueue(conn, awa_pool.Job("add", {"a": 20, "b": 22}))
        conn.close()
        ran = finished.wait(60)
        pool.stop()
        runner.join(60)
        event("after_run", code=codes[0] if codes else None, job_ran=ran, thread_alive=runner.is_alive())
        return codes[0] if codes else 1

    return pool.run()


if __name__ == "__main__":
    sys.exit(main())
