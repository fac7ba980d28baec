"""The dashboard's pages (GET): overview and its 2-second fragment, jobs,
job detail, kinds, cron, dead letters, the confirmation pages of bulk
actions, and the login form. Reads only; actions.py holds the POSTs.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

from flask import Flask, abort, current_app, redirect, render_template, request, url_for

from . import auth, charts, kinds as kind_reads, reads
from .throughput import Throughput

# What an action did, shown after its redirect. Only these fixed sentences
# can appear; the URL supplies a code and numbers or a checked name.
NOTICES = {
    "retried": "Job {id} will run again.",
    "retry_refused": "Job {id} was not retried: it is {state}.",
    "cancelled": "Job {id} is cancelled.",
    "cancel_refused": "Job {id} was not cancelled: it is already {state}.",
    "cancelled_many": "Cancelled {n} job(s).",
    "paused": "Queue {name} is paused: no new job is claimed from it (running ones finish).",
    "resumed": "Queue {name} is resumed.",
    "dlq_retried": "{n} dead-lettered job(s) will run again.",
    "dlq_purged": "Deleted {n} dead-lettered job(s).",
    "cron_paused": "Periodic job {name} is paused.",
    "cron_resumed": "Periodic job {name} is resumed.",
    "cron_triggered": "Periodic job {name} enqueued job {id}.",
}


def connection() -> Any:
    return current_app.extensions["awa_connections"].connection()


def notice() -> Optional[str]:
    code = request.args.get("done")
    if code not in NOTICES:
        return None
    values: Dict[str, Any] = {}
    for key in ("id", "n"):
        text = request.args.get(key, "")
        values[key] = int(text) if text.isdigit() else "?"
    state = request.args.get("state", "")
    values["state"] = state if state in reads.ALL_STATES else "in another state"
    name = request.args.get("name", "")
    values["name"] = name[:200] if name else "?"
    return NOTICES[code].format(**values)


def throughput_chart(series: Throughput) -> Any:
    return charts.line_chart(
        [("completed per minute", series.completed, "ok"), ("failed per minute", series.failed, "bad"),
         ("cancelled per minute", series.cancelled, "muted")],
        title="Jobs finished per minute, last hour", x_left="60 min ago", x_right="now",
        y_format=lambda v: f"{v:,.0f}", area=True, width=1360, height=170)


def _overview_context() -> Dict[str, Any]:
    with connection() as conn:
        view = reads.overview(conn, current_app.extensions["awa_throughput"])
    sparks = {name: charts.sparkline([c + f + x for c, f, x in zip(s.completed, s.failed, s.cancelled)])
              for name, s in view.throughput.items()}
    return {"view": view, "chart": throughput_chart(view.total_throughput), "sparks": sparks}


SMALL = {"width": 330, "height": 130}   # the kinds page draws four charts side by side


def kind_charts(trend: kind_reads.KindTrend, window: str) -> Dict[str, Any]:
    left = f"{window} ago"
    return {
        "wall": charts.line_chart(
            [("wall p50", trend.series("wall", 0.5), "ok"), ("wall p95", trend.series("wall", 0.95), "warn")],
            title=f"{trend.kind}: wall time p50 and p95", x_left=left, x_right="now",
            y_format=_seconds, **SMALL),
        "cpu": charts.line_chart(
            [("CPU p50", trend.series("cpu", 0.5), "ok"), ("CPU p95", trend.series("cpu", 0.95), "warn")],
            title=f"{trend.kind}: CPU time p50 and p95", x_left=left, x_right="now",
            y_format=_seconds, **SMALL),
        "rss": charts.line_chart(
            [("peak RSS p50", trend.series("rss", 0.5), "ok"), ("peak RSS p95", trend.series("rss", 0.95), "warn")],
            title=f"{trend.kind}: peak RSS p50 and p95", x_left=left, x_right="now",
            y_format=_size, y_ceiling=charts.nice_bytes, **SMALL),
        "runs": charts.line_chart(
            [("attempts", [b.attempts for b in trend.buckets], "ok"),
             ("failures", [b.failures for b in trend.buckets], "bad"),
             ("crashes + timeouts", [b.crashes + b.timeouts for b in trend.buckets], "warn")],
            title=f"{trend.kind}: attempts and failures per slice", x_left=left, x_right="now",
            y_format=lambda v: f"{v:,.0f}", **SMALL),
    }


def _seconds(value: float) -> str:
    from ..ops.cli_output import seconds

    return seconds(value)


def _size(value: float) -> str:
    from ..ops.cli_output import size

    return size(value)


def register(app: Flask, *, token: Optional[str]) -> None:
    @app.get("/")
    def overview() -> str:
        return render_template("overview.html", notice=notice(), **_overview_context())

    @app.get("/fragment/overview")
    def overview_fragment() -> str:
        return render_template("_overview_live.html", **_overview_context())

    @app.get("/jobs")
    def jobs() -> Any:
        jump = (request.args.get("id") or "").strip()
        if jump:
            return redirect(url_for("job", job_id=reads.parse_id(jump)))
        filt = reads.JobFilter.from_args(request.args)
        with connection() as conn:
            queues = reads.queue_names(conn)
            rows, next_before = reads.jobs_page(conn, filt, queues)
        return render_template("jobs.html", filt=filt, rows=rows, next_before=next_before,
                               queues=queues, states=reads.ALL_STATES, notice=notice())

    @app.get("/jobs/<int:job_id>")
    def job(job_id: int) -> str:
        with connection() as conn:
            page = reads.job_page(conn, job_id)
        if page is None:
            abort(404, f"no job with id {job_id}")
        return render_template("job.html", page=page, job=page.record, notice=notice(),
                               members_cap=reads.BATCH_MEMBERS_SHOWN)

    @app.get("/jobs/cancel")
    def cancel_confirm() -> str:
        filt = reads.JobFilter.from_args(request.args)
        if not filt.active:
            raise reads.BadFilter("cancelling by filter needs at least one filter "
                                  "(state, queue, kind, tag or age)")
        if not filt.selects_live_jobs:
            raise reads.BadFilter(f"jobs in state {filt.state} are finished: there is nothing to cancel")
        with connection() as conn:
            count, max_id = reads.live_matching(conn, filt)
        return render_template("cancel_confirm.html", filt=filt, count=count, max_id=max_id)

    @app.get("/kinds")
    def kinds() -> str:
        try:
            window, window_s = kind_reads.parse_window(request.args.get("window"))
        except kind_reads.BadWindow as exc:
            raise reads.BadFilter(str(exc)) from None
        with connection() as conn:
            trends = current_app.extensions["awa_kind_trends"].read(conn, window_s)
        return render_template("kinds.html", trends=trends, window=window, windows=list(kind_reads.KIND_WINDOWS),
                               charts={t.kind: kind_charts(t, window) for t in trends},
                               buckets=kind_reads.KIND_BUCKETS, sample=kind_reads.KIND_SAMPLE)

    @app.get("/cron")
    def cron() -> str:
        with connection() as conn:
            schedules = reads.schedules(conn)
        return render_template("cron.html", schedules=schedules, notice=notice())

    @app.get("/dlq")
    def dlq() -> str:
        queue = (request.args.get("queue") or "").strip() or None
        kind = (request.args.get("kind") or "").strip() or None
        before_text = (request.args.get("before") or "").strip()
        before = reads.parse_id(before_text, "the page cursor (before)") if before_text else None
        with connection() as conn:
            rows, next_before = reads.dlq_page(conn, queue, kind, before)
        return render_template("dlq.html", rows=rows, next_before=next_before, queue=queue, kind=kind,
                               notice=notice())

    @app.get("/dlq/confirm")
    def dlq_confirm() -> str:
        action = request.args.get("action")
        if action not in ("retry", "purge"):
            raise reads.BadFilter("action must be retry or purge")
        queue = (request.args.get("queue") or "").strip() or None
        kind = (request.args.get("kind") or "").strip() or None
        with connection() as conn:
            count = reads.dlq_count(conn, queue, kind)
        return render_template("dlq_confirm.html", action=action, queue=queue, kind=kind, count=count)

    @app.get("/login")
    def login() -> Any:
        if token is None or auth.authorized(token):
            return redirect(auth.safe_next(request.args.get("next")))
        return render_template("login.html", next=request.args.get("next") or "", failed=False)

    @app.post("/login")
    def login_post() -> Any:
        if token is None:
            return redirect(url_for("overview"))
        next_path = request.form.get("next") or ""
        if not auth.token_matches(request.form.get("token"), token):
            return render_template("login.html", next=next_path, failed=True), 401
        response = redirect(auth.safe_next(next_path))
        auth.set_session_cookie(response, token)
        return response
