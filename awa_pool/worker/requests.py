"""Answers to a running handler's calls that need the database (register a
callback, read a batch's results). The supervisor answers them for its
children; awa_pool.testing answers them inline. One place for both."""
from __future__ import annotations

from typing import Any

from ..core.errors import AwaError, UnknownCallback
from ..core.job import JobRecord
from ..core.sql import QUERIES


def answer(cur: Any, job_id: int, lease: int, method: str, payload: Any) -> Any:
    """The value a JobContext call returns to its handler (raises AwaError)."""
    if method == "register_callback":
        cur.execute(QUERIES["register_callback"], {"id": job_id, "lease": lease, "timeout_s": payload})
        callback = cur.fetchone()[0]
        if callback is None:
            raise UnknownCallback(f"job {job_id} is no longer running under this attempt")
        return callback
    if method == "batch_results":
        if payload is None:
            raise AwaError("batch_results() is only available in a batch's follow-up job")
        cur.execute(QUERIES["batch_members"], {"batch_id": payload})
        names = [d.name for d in cur.description]
        return [JobRecord.from_row(dict(zip(names, row))) for row in cur.fetchall()]
    raise AwaError(f"unknown request {method!r}")
