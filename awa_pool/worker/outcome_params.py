"""How outcomes become statement parameters: the column arrays of
awa.complete_jobs (written by the completer's flushes and by claims that
carry successes, see fetcher.claim) and the JSON entries of
awa.settle_jobs. Pure: no I/O.
"""
from __future__ import annotations

import json
from typing import Any, Dict, Optional, Sequence

from .protocol import Outcome


def payload_bytes(o: Outcome) -> int:
    """The JSON text an outcome carries to the database."""
    return len(o.result or "") + len(o.progress or "")


def array_literal(values, text=repr) -> str:
    """A Postgres array literal of numbers/NULLs (far cheaper than adapting a list)."""
    values = list(values)
    if None in values:
        return "{" + ",".join("NULL" if v is None else text(v) for v in values) + "}"
    return "{" + ",".join(map(text, values)) + "}"


_seconds = "{:.6f}".format  # wall and CPU times: microseconds are plenty


def completion_params(batch: Sequence[Outcome]) -> Dict[str, str]:
    """complete_jobs' arguments for a batch, a column at a time."""
    column = dict(zip(Outcome._fields, zip(*batch)))
    extras = []
    if any(column["result"]) or any(column["progress"]):
        for o in batch:
            extra = extra_json(o)
            if extra is not None:
                extras.append('"%d":%s' % (o.job_id, extra))
    return {"ids": array_literal(column["job_id"]), "leases": array_literal(column["lease"]),
            "wall": array_literal(column["wall_s"], _seconds), "cpu": array_literal(column["cpu_s"], _seconds),
            "rss": array_literal(column["peak_rss"]), "extra": "{" + ",".join(extras) + "}"}


def extra_json(o: Outcome) -> Optional[str]:
    """A completion's result and final progress as a JSON object (already
    JSON text from the child), None when it has neither."""
    fields = []
    if o.result is not None:
        fields.append('"result":' + o.result)
    if o.progress is not None:
        fields.append('"progress":' + o.progress)
    return "{" + ",".join(fields) + "}" if fields else None


def settle_entry(outcome: Outcome) -> Dict[str, Any]:
    entry: Dict[str, Any] = {"id": outcome.job_id, "lease": outcome.lease, "outcome": outcome.outcome,
                             "wall_s": round(outcome.wall_s, 6), "cpu_s": round(outcome.cpu_s, 6)}
    if outcome.peak_rss is not None:
        entry["peak_rss"] = outcome.peak_rss
    if outcome.error is not None:
        entry["error"] = outcome.error
    if outcome.traceback is not None:
        entry["traceback"] = outcome.traceback
    if outcome.delay_s is not None:
        entry["delay_s"] = outcome.delay_s
    if outcome.result is not None:
        entry["result"] = json.loads(outcome.result)
    if outcome.progress is not None:
        entry["progress"] = json.loads(outcome.progress)
    return entry
