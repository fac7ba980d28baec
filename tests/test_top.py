"""`awa-pool top` in a real pseudo-terminal: it draws with rich on the
alternate screen, refreshes, survives a lost database connection and exits 0
on Ctrl-C (SIGINT from the terminal) or q, leaving the screen as it found
it; colours only on a terminal and never with NO_COLOR; one plain, aligned
frame when stdout is not a terminal."""
from __future__ import annotations

import os
import signal

from cli_run import ok, parse_table
from helpers import query, wait_for
from terminal import ENTER, LEAVE, Terminal


def test_top_draws_refreshes_and_exits_on_ctrl_c(pools, dsn: str) -> None:
    pools.start("--queue", "default", "--queue", "images")
    wait_for(lambda: "leader" in ok("top", "--once", "--database-url", dsn), message="a live leader")
    ok("enqueue", "noop", "--queue", "images", "--database-url", dsn)

    with Terminal("top", "--interval", "0.3", "--database-url", dsn) as term:
        term.read_until(lambda out: b"frame 1;" in out and b"HEARTBEAT" in out and b"leader" in out
                        and b"running" in out)  # the whole first frame
        assert term.output.startswith(ENTER) or ENTER in term.output[:200]
        first = term.text().split("frame 2;")[0]
        assert "QUEUES" in first and "images" in first and "default" in first
        assert "SUPERVISORS (1 alive)" in first
        term.read_until(lambda out: term.frames() >= 3)  # it redraws
        assert b"frame 3;" in term.output

        os.write(term.fd, b"\x03")  # Ctrl-C typed at the terminal: SIGINT to top
        assert term.wait() == 0
        assert term.output.rstrip().endswith(LEAVE)  # the screen is restored
        assert b"Traceback" not in term.output and b"error:" not in term.output


def test_top_shows_a_lost_database_and_recovers(dsn: str) -> None:
    with Terminal("top", "--interval", "0.2", "--database-url", dsn) as term:
        term.read_until(lambda out: b"QUEUES" in out)
        query(dsn, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                   "WHERE datname = current_database() AND pid <> pg_backend_pid()")
        term.read_until(lambda out: b"database unreachable" in out)
        seen = len(term.output)
        term.read_until(lambda out: b"QUEUES" in out[seen:])  # reconnected on the next frame
        os.write(term.fd, b"q")
        assert term.wait() == 0
        assert term.output.rstrip().endswith(LEAVE)


def test_top_exits_0_on_sigint_sent_to_the_process(dsn: str) -> None:
    with Terminal("top", "--interval", "0.2", "--database-url", dsn) as term:
        term.read_until(lambda out: b"frame 2;" in out)
        os.kill(term.pid, signal.SIGINT)
        assert term.wait() == 0
        assert term.output.rstrip().endswith(LEAVE)


def test_top_colours_only_on_a_terminal_without_no_color(dsn: str) -> None:
    ok("enqueue", "noop", "--queue", "held", "--database-url", dsn)
    ok("queues", "pause", "held", "--database-url", dsn)
    with Terminal("top", "--interval", "0.2", "--database-url", dsn) as term:
        term.read_until(lambda out: b"frame 2;" in out)
        os.write(term.fd, b"q")
        assert term.wait() == 0
        assert "33" in term.colours()  # the paused queue, in yellow
    with Terminal("top", "--interval", "0.2", "--database-url", dsn, env={"NO_COLOR": "1"}) as term:
        term.read_until(lambda out: b"frame 2;" in out)
        os.write(term.fd, b"q")
        assert term.wait() == 0
        assert term.colours() == [] and b"\x1b[1m" in term.output  # bold stays: it is not a colour
        assert "paused" in term.text()


def test_top_once_prints_one_plain_aligned_frame_when_piped(dsn: str) -> None:
    long_queue = "q" + "_long" * 30  # 151 characters, far wider than COLUMNS
    ok("enqueue", "noop", "--queue", long_queue, "--database-url", dsn)
    ok("enqueue", "noop", "--queue", "short", "--database-url", dsn)
    frame = ok("top", "--database-url", dsn, env={"COLUMNS": "40"})  # stdout is a pipe: one frame, then exit
    assert frame.count("(every ") == 1 and "\x1b" not in frame
    lines = frame.splitlines()
    assert lines[1].startswith("children 0 busy / 0 idle of 0") and lines[3] == "QUEUES"
    table_end = lines.index("", 4)
    headers, rows = parse_table("\n".join(lines[4:table_end]),
                                right=("AVAIL", "RUNNING", "SCHED", "RETRY", "WAITING", "FAILED",
                                       "JOBS/S 10s", "JOBS/S 1m", "LAG"))
    assert headers[:3] == ["QUEUE", "PAUSED", "AVAIL"] and headers[-1] == "LAG"
    assert sorted(row[0] for row in rows) == sorted([long_queue, "short"])  # whole, not cut or wrapped
    assert all(row[2] == "1" for row in rows)
    assert lines[table_end + 1:] == ["SUPERVISORS (0 alive)", "(no live supervisor: start one with awa-pool start)"]
