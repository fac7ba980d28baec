"""The dashboard's actions (POST): retry and cancel jobs (one, or every job
a filter selects), pause and resume queues, retry and purge dead letters,
pause, resume and trigger periodic jobs.

Each goes through the same admin function as the CLI, commits, and
redirects to a page that says what it did (POST-redirect-GET, so a reload
never repeats it). auth.py has already checked the token, the CSRF field
and read-only mode before any of these run.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

from flask import Flask, abort, redirect, request, url_for

from ..api.admin import cancel_job, dlq_purge, dlq_retry, pause_queue, resume_queue, retry_job
from ..api.periodic_admin import UnknownSchedule, pause_schedule, resume_schedule, trigger_schedule
from . import reads
from .pages import connection

CANCEL_REASON = "cancelled from the dashboard"


def _checked(value: str, what: str) -> str:
    from ..core.job import check_name

    try:
        return check_name(value, what)
    except (TypeError, ValueError) as exc:
        raise reads.BadFilter(str(exc)) from None


def _optional(field: str, what: str) -> Optional[str]:
    value = (request.form.get(field) or "").strip()
    return _checked(value, what) if value else None


def _ids() -> Optional[List[int]]:
    values = [v for v in request.form.getlist("id") if v.strip()]
    return [reads.parse_id(v) for v in values] if values else None


def register(app: Flask) -> None:
    @app.post("/jobs/<int:job_id>/retry")
    def retry(job_id: int) -> Any:
        with connection() as conn:
            state = retry_job(conn, job_id)
            conn.commit()
        if state is None:
            abort(404, f"no job with id {job_id}")
        done: Dict[str, Any] = {"done": "retried"} if state.value == "available" else \
            {"done": "retry_refused", "state": state.value}
        return redirect(url_for("job", job_id=job_id, id=job_id, **done))

    @app.post("/jobs/<int:job_id>/cancel")
    def cancel(job_id: int) -> Any:
        with connection() as conn:
            before = reads.job_state(conn, job_id)
            state = cancel_job(conn, job_id, CANCEL_REASON)
            conn.commit()
        if state is None:
            abort(404, f"no job with id {job_id}")
        refused = before in reads.TERMINAL
        done: Dict[str, Any] = {"done": "cancel_refused", "state": before} if refused else {"done": "cancelled"}
        return redirect(url_for("job", job_id=job_id, id=job_id, **done))

    @app.post("/jobs/cancel")
    def cancel_many() -> Any:
        filt = reads.JobFilter.from_args(request.form)
        if not filt.active or not filt.selects_live_jobs:
            raise reads.BadFilter("cancelling by filter needs a filter that selects unfinished jobs")
        max_id = reads.parse_id(request.form.get("max_id", ""), "max_id")
        with connection() as conn:
            n = reads.cancel_matching(conn, filt, max_id, CANCEL_REASON)
            conn.commit()
        return redirect(url_for("jobs", done="cancelled_many", n=n, **filt.query_args()))

    def _queue(action: Any, done: str) -> Any:
        name = _checked((request.form.get("queue") or "").strip(), "queue")
        with connection() as conn:
            action(conn, name)
            conn.commit()
        return redirect(url_for("overview", done=done, name=name))

    @app.post("/queues/pause")
    def queue_pause() -> Any:
        return _queue(pause_queue, "paused")

    @app.post("/queues/resume")
    def queue_resume() -> Any:
        return _queue(resume_queue, "resumed")

    @app.post("/dlq/retry")
    def dlq_retry_action() -> Any:
        ids, queue, kind = _ids(), _optional("queue", "queue"), _optional("kind", "kind")
        if ids is None and queue is None and kind is None and request.form.get("all") != "1":
            raise reads.BadFilter("retrying needs job ids, a queue, a kind, or the confirmation of 'all'")
        with connection() as conn:
            n = dlq_retry(conn, ids=ids, queue=queue, kind=kind)
            conn.commit()
        return redirect(url_for("dlq", done="dlq_retried", n=n))

    @app.post("/dlq/purge")
    def dlq_purge_action() -> Any:
        ids, queue, kind = _ids(), _optional("queue", "queue"), _optional("kind", "kind")
        everything = request.form.get("all") == "1"
        if ids is None and queue is None and kind is None and not everything:
            raise reads.BadFilter("purging needs job ids, a queue, a kind, or the confirmation of 'all'")
        with connection() as conn:
            n = dlq_purge(conn, ids=ids, queue=queue, kind=kind, all=everything)
            conn.commit()
        return redirect(url_for("dlq", done="dlq_purged", n=n))

    def _cron(action: Any, done: str) -> Any:
        name = _checked((request.form.get("name") or "").strip(), "periodic job name")
        with connection() as conn:
            try:
                job_id = action(conn, name)
            except UnknownSchedule:
                abort(404, f"no periodic job named {name}")
            conn.commit()
        extra = {"id": job_id} if isinstance(job_id, int) else {}
        return redirect(url_for("cron", done=done, name=name, **extra))

    @app.post("/cron/pause")
    def cron_pause() -> Any:
        return _cron(pause_schedule, "cron_paused")

    @app.post("/cron/resume")
    def cron_resume() -> Any:
        return _cron(resume_schedule, "cron_resumed")

    @app.post("/cron/trigger")
    def cron_trigger() -> Any:
        return _cron(trigger_schedule, "cron_triggered")
