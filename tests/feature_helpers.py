"""Shared steps of the job-feature tests (callbacks, cancel, progress, DLQ,
batches, admin): short connections, waiting for a job's state, gates."""
from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from typing import Iterable, List, Optional, Sequence

import awa_pool
from awa_pool import Job, JobRecord
from helpers import connection, wait_for

APP = "apps.features"


def enqueue_jobs(dsn: str, *jobs: Job) -> List[int]:
    with connection(dsn) as conn:
        ids = [awa_pool.enqueue(conn, job) for job in jobs]
        conn.commit()
    return ids


def get(dsn: str, job_id: int) -> Optional[JobRecord]:
    with connection(dsn, autocommit=True) as conn:
        return awa_pool.get_job(conn, job_id)


def wait_state(dsn: str, job_id: int, state: "str | Sequence[str]", timeout: float = 30.0,
               message: str = "") -> JobRecord:
    wanted = (state,) if isinstance(state, str) else tuple(state)
    try:
        return wait_for(lambda: (r := get(dsn, job_id)) is not None and r.state in wanted and r,
                        timeout=timeout, message=message or f"job {job_id} to be {'/'.join(wanted)}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the job is now {get(dsn, job_id)}") from None


def wait_all(dsn: str, ids: Iterable[int], state: str, timeout: float = 30.0) -> List[JobRecord]:
    ids = list(ids)

    def check():
        with connection(dsn, autocommit=True) as conn:
            records = [awa_pool.get_job(conn, i) for i in ids]
        return all(r is not None and r.state == state for r in records) and records

    return wait_for(check, timeout=timeout, message=f"{len(ids)} job(s) to be {state}")


def open_gate(log_dir: Path, name: str) -> None:
    (Path(log_dir) / f"gate-{name}").touch()


def stop_pool(proc: subprocess.Popen, timeout: float = 30.0) -> int:
    """SIGTERM a supervisor and wait for its exit code."""
    proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=timeout)


def job_rows(dsn: str, job_id: int) -> int:
    """How many rows the job has across the three job tables (always 1)."""
    with connection(dsn, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM awa.jobs WHERE id = %s", (job_id,))
        return cur.fetchone()[0]
