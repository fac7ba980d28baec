"""awa-pool jobs ... and awa-pool dlq ...: inspect and operate on jobs and
on the dead-letter queue."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import typer

from . import cli_output as out
from .cli_common import DB_URL, JSON_OUT, UserError, connection, duration, emit_json, say

jobs_app = typer.Typer(no_args_is_help=True, help="Inspect and operate on jobs.")
dlq_app = typer.Typer(no_args_is_help=True, help="The dead-letter queue (queues started with the dlq option).")


# -- jobs ----------------------------------------------------------------------------

@jobs_app.command("list")
def jobs_list(state: Optional[str] = typer.Option(None, "--state", "-s", help="Only jobs in this state."),
              queue: Optional[str] = typer.Option(None, "--queue", "-q"),
              kind: Optional[str] = typer.Option(None, "--kind", "-k"),
              older_than: Optional[str] = typer.Option(None, "--older-than", help="Created before this long "
                                                                                 "ago (30m, 2h, 7d)."),
              newer_than: Optional[str] = typer.Option(None, "--newer-than", help="Created within this long."),
              limit: int = typer.Option(100, "--limit", "-n", min=1),
              database_url: Optional[str] = DB_URL, json_out: bool = JSON_OUT) -> None:
    """List jobs, newest first."""
    from ..api.admin import list_jobs

    older = duration(older_than, "--older-than")
    newer = duration(newer_than, "--newer-than")
    with connection(database_url) as conn:
        records = list_jobs(conn, state=state, queue=queue, kind=kind, limit=limit,
                            older_than=older, newer_than=newer)
    if json_out:
        emit_json(records)
    else:
        say(out.jobs_table(records))


@jobs_app.command("show")
def jobs_show(job_id: int = typer.Argument(..., metavar="ID"),
              database_url: Optional[str] = DB_URL, json_out: bool = JSON_OUT) -> None:
    """Everything about one job: args, state, attempts with wall/CPU/RSS, errors, progress, result."""
    from ..api.admin import get_job

    with connection(database_url) as conn:
        record = get_job(conn, job_id)
    if record is None:
        raise UserError(f"no job with id {job_id}")
    if json_out:
        emit_json(record)
    else:
        say(out.job_detail(record))


@jobs_app.command("retry")
def jobs_retry(job_ids: List[int] = typer.Argument(..., metavar="ID..."),
               database_url: Optional[str] = DB_URL, json_out: bool = JSON_OUT) -> None:
    """Run failed, cancelled, scheduled or retryable jobs again now."""
    from ..api.admin import retry_job

    _act_on_jobs(job_ids, retry_job, {"scheduled", "retryable", "failed", "cancelled"},
                 {"available", "scheduled"}, ("retry", "retried"), database_url, json_out)


@jobs_app.command("cancel")
def jobs_cancel(job_ids: List[int] = typer.Argument(..., metavar="ID..."),
                reason: str = typer.Option("cancelled by an operator", "--reason"),
                database_url: Optional[str] = DB_URL, json_out: bool = JSON_OUT) -> None:
    """Cancel jobs that have not finished (a running one is told, then its child killed)."""
    from ..api.admin import cancel_job

    _act_on_jobs(job_ids, lambda conn, job_id: cancel_job(conn, job_id, reason),
                 {"scheduled", "available", "running", "retryable", "waiting_external"},
                 {"cancelled"}, ("cancel", "cancelled"), database_url, json_out)


def _act_on_jobs(job_ids: List[int], action: Any, applies_to: set, results_in: set,
                 verbs: Tuple[str, str], database_url: Optional[str], json_out: bool) -> None:
    """Apply a retry/cancel to each job in one transaction; report jobs that
    are unknown or in a state the action does not apply to as one error.
    A job counts as changed when it was in `applies_to` before and is in
    `results_in` after (a job that finished in between is reported)."""
    from ..api.admin import get_job

    verb, done = verbs
    results, refused = [], []
    with connection(database_url) as conn:
        for job_id in job_ids:
            record = get_job(conn, job_id)
            if record is None:
                refused.append(f"no job with id {job_id}")
                results.append({"id": job_id, "state": None, "changed": False})
                continue
            before = record.state.value
            after = action(conn, job_id)
            now = after.value if after is not None else before
            changed = before in applies_to and now in results_in
            results.append({"id": job_id, "state": now, "changed": changed, "previous_state": before})
            if not changed:
                refused.append(f"job {job_id} is {now}: nothing to {verb}")
        conn.commit()
    if json_out:
        emit_json(results)
    else:
        for entry in results:
            if entry["changed"]:
                say(f"job {entry['id']} {done} (now {entry['state']})")
    if refused:
        summary = refused[0] if len(refused) == 1 else \
            f"{len(refused)} of {len(job_ids)} job(s) not {done}: " + "; ".join(refused)
        raise UserError(summary)


# -- dead-letter queue -------------------------------------------------------------

@dlq_app.command("list")
def dlq_list_cmd(queue: Optional[str] = typer.Option(None, "--queue", "-q"),
                 kind: Optional[str] = typer.Option(None, "--kind", "-k"),
                 limit: int = typer.Option(100, "--limit", "-n", min=1),
                 database_url: Optional[str] = DB_URL, json_out: bool = JSON_OUT) -> None:
    """Dead-lettered jobs, most recent first."""
    from ..api.admin import dlq_list

    with connection(database_url) as conn:
        records = dlq_list(conn, queue=queue, kind=kind, limit=limit)
    if json_out:
        emit_json(records)
    else:
        say(out.dlq_table(records))


DLQ_ALL = typer.Option(False, "--all", help="Act on the whole dead-letter queue (no filter).")


def _dlq_filters(job_ids: Optional[List[int]], queue: Optional[str], kind: Optional[str],
                 all_: bool, verb: str) -> Dict[str, Any]:
    if not job_ids and queue is None and kind is None and not all_:
        raise UserError(f"dlq {verb} with no filter would {verb} the whole dead-letter queue: "
                        "give job ids, --queue or --kind, or --all")
    return {"ids": job_ids or None, "queue": queue, "kind": kind}


@dlq_app.command("retry")
def dlq_retry_cmd(job_ids: Optional[List[int]] = typer.Argument(None, metavar="[ID...]"),
                  queue: Optional[str] = typer.Option(None, "--queue", "-q"),
                  kind: Optional[str] = typer.Option(None, "--kind", "-k"), all_: bool = DLQ_ALL,
                  database_url: Optional[str] = DB_URL, json_out: bool = JSON_OUT) -> None:
    """Give dead-lettered jobs fresh attempts (filters combine with AND)."""
    from ..api.admin import dlq_retry

    filters = _dlq_filters(job_ids, queue, kind, all_, "retry")
    with connection(database_url) as conn:
        count = dlq_retry(conn, **filters)
        conn.commit()
    if json_out:
        emit_json({"retried": count})
    else:
        say(f"retried {count} dead-lettered job(s)")


@dlq_app.command("purge")
def dlq_purge_cmd(job_ids: Optional[List[int]] = typer.Argument(None, metavar="[ID...]"),
                  queue: Optional[str] = typer.Option(None, "--queue", "-q"),
                  kind: Optional[str] = typer.Option(None, "--kind", "-k"), all_: bool = DLQ_ALL,
                  database_url: Optional[str] = DB_URL, json_out: bool = JSON_OUT) -> None:
    """Delete dead-lettered jobs for good (filters combine with AND)."""
    from ..api.admin import dlq_purge

    filters = _dlq_filters(job_ids, queue, kind, all_, "purge")
    with connection(database_url) as conn:
        count = dlq_purge(conn, **filters, all=all_)
        conn.commit()
    if json_out:
        emit_json({"purged": count})
    else:
        say(f"purged {count} dead-lettered job(s)")
