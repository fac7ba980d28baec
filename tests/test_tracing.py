"""OpenTelemetry (SPEC §9): one trace from the enqueue span through each
attempt, retries included, inline and in a real pool's children; no
import and no trace metadata without the package.

The SDK's tracer provider is global to a process, so every program that
sets one runs in a subprocess: tests/apps/tracing_host.py produces (and
runs jobs inline), tests/apps/traced.py sets up the children's SDK.
"""
from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Dict, List

from awa_pool import Job
from helpers import enqueue_jobs, record, wait_for


def _produce(processes, dsn: str, tmp_path: Path, mode: str) -> dict:
    out = tmp_path / f"{mode}.json"
    proc = processes.start([sys.executable, "-m", "apps.tracing_host", mode, dsn, str(out)],
                           name=f"producer-{mode}", env={"AWA_TEST_LOG_DIR": str(tmp_path)})
    assert proc.wait(timeout=120) == 0, proc.log_path.read_text(errors="replace")
    return json.loads(out.read_text())


def _spans(path: Path) -> List[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _check_one_trace(produced: dict, consumer_spans: List[dict]) -> None:
    """The request span holds a producer span per enqueue call; every attempt of every
    job is a consumer span under the producer span of its enqueue call."""
    spans = produced["spans"]
    request, = [s for s in spans if s["name"] == "request"]
    ids = produced["ids"]
    producer_spans = [s for s in spans if s["kind"] == "PRODUCER"]
    own, = [s for s in producer_spans if s["attributes"].get("awa.job.id") == ids["own"]]
    producers = {s["name"]: s for s in producer_spans if s is not own}
    assert set(producers) == {"awa_pool enqueue", "awa_pool enqueue_many", "awa_pool enqueue_batch"}
    for span in producer_spans:
        assert (span["trace_id"], span["parent_id"]) == (request["trace_id"], request["span_id"])
        assert span["attributes"]["messaging.system"] == "awa_pool"
    assert producers["awa_pool enqueue"]["attributes"]["awa.job.id"] == ids["enqueue"]
    assert producers["awa_pool enqueue_many"]["attributes"]["messaging.batch.message_count"] == 3
    assert produced["metadata"][str(ids["own"])] == {"traceparent": produced["own"]}  # its own, kept
    stamped = [produced["metadata"][str(job_id)] for job_id in ids["enqueue_many"]]
    assert stamped[0] == stamped[1] == {"traceparent": stamped[0]["traceparent"]}  # one context, sent once
    assert stamped[2] == {"origin": "import", "traceparent": stamped[0]["traceparent"]}  # merged with its own

    # The W3C context each job carries is its enqueue span's.
    parent_of = {ids["enqueue"]: producers["awa_pool enqueue"],
                 **{i: producers["awa_pool enqueue_many"] for i in ids["enqueue_many"]},
                 **{i: producers["awa_pool enqueue_batch"] for i in ids["batch"] + [ids["then"]]}}
    for job_id, producer in parent_of.items():
        traceparent = produced["metadata"][str(job_id)]["traceparent"]
        assert traceparent.split("-")[1:3] == [producer["trace_id"], producer["span_id"]]

    attempts: Dict[int, List[dict]] = {}
    for span in consumer_spans:
        assert span["kind"] == "CONSUMER" and span["trace_id"] == request["trace_id"]
        attempts.setdefault(span["attributes"]["awa.job.id"], []).append(span)
    assert set(attempts) == set(parent_of)
    for job_id, runs in attempts.items():
        assert {span["parent_id"] for span in runs} == {parent_of[job_id]["span_id"]}
    retried = sorted(attempts[ids["enqueue"]], key=lambda span: span["attributes"]["awa.job.attempt"])
    assert [(s["attributes"]["awa.job.attempt"], s["attributes"]["awa.job.outcome"]) for s in retried] == [
        (1, "retry"), (2, "retry"), (3, "completed")]
    first = retried[0]
    assert first["name"] == "awa_pool run retry_then_ok"
    assert {key: first["attributes"][key] for key in ("awa.job.kind", "awa.job.queue", "awa.job.id")} == {
        "awa.job.kind": "retry_then_ok", "awa.job.queue": "default", "awa.job.id": ids["enqueue"]}
    assert first["attributes"]["awa.job.cpu_seconds"] >= 0
    for job_id in ids["enqueue_many"] + ids["batch"] + [ids["then"]]:
        assert [s["attributes"]["awa.job.outcome"] for s in attempts[job_id]] == ["completed"]


def test_one_trace_from_enqueue_through_every_inline_attempt(processes, dsn: str, tmp_path: Path) -> None:
    produced = _produce(processes, dsn, tmp_path, "inline")
    _check_one_trace(produced, [s for s in produced["spans"] if s["kind"] == "CONSUMER"])


def test_awaited_enqueues_open_the_same_producer_spans(processes, dsn: str, tmp_path: Path) -> None:
    """awa_pool.aio's enqueue, enqueue_many and enqueue_batch (asyncpg) make
    the sync API's spans and stamp the same trace context on their jobs."""
    produced = _produce(processes, dsn, tmp_path, "aio")
    _check_one_trace(produced, [s for s in produced["spans"] if s["kind"] == "CONSUMER"])


def test_a_pool_runs_each_attempt_in_a_span_under_the_enqueue(processes, pools, dsn: str, tmp_path: Path) -> None:
    spans = tmp_path / "child-spans.jsonl"
    supervisor = pools.start(app="apps.traced", workers=2,
                             env={"AWA_TEST_SPANS": str(spans), "AWA_TEST_OTEL_SETUP": "child"})
    produced = _produce(processes, dsn, tmp_path, "produce")
    ids = produced["ids"]
    every = [ids["enqueue"], *ids["enqueue_many"], *ids["batch"], ids["then"]]
    for job_id in every:
        wait_for(lambda: record(dsn, job_id).state == "completed", timeout=60,
                 message=f"job {job_id} to complete")
    # Each span was exported as it ended, before its outcome left the child.
    consumer = _spans(spans)
    assert len(consumer) == 8 and {s["pid"] for s in consumer}.isdisjoint({supervisor.pid})
    _check_one_trace(produced, consumer)
    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(timeout=60) == 0


def test_an_sdk_set_up_before_the_fork_exports_from_the_children(pools, dsn: str, tmp_path: Path) -> None:
    """BatchSpanProcessor restarts its thread in each forked child; its
    spans are exported when the child flushes on its way out."""
    spans = tmp_path / "batched-spans.jsonl"
    supervisor = pools.start(app="apps.traced", workers=1,
                             env={"AWA_TEST_SPANS": str(spans), "AWA_TEST_OTEL_SETUP": "parent"})
    job_id, = enqueue_jobs(dsn, [Job("add", {"a": 2, "b": 2})])
    wait_for(lambda: record(dsn, job_id).state == "completed", timeout=60, message="the job to complete")
    assert _spans(spans) == []  # still in the child's batch (a 10-minute schedule)
    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(timeout=60) == 0
    span, = _spans(spans)
    assert span["name"] == "awa_pool run add" and span["pid"] != supervisor.pid
    assert span["parent_id"] is None  # enqueued outside any trace: the attempt starts one
    assert (span["attributes"]["awa.job.id"], span["attributes"]["awa.job.outcome"]) == (job_id, "completed")


def test_without_opentelemetry_nothing_is_imported_or_stamped(processes, dsn: str, tmp_path: Path) -> None:
    result = _produce(processes, dsn, tmp_path, "blocked")
    assert result["attempts"] == 1  # tried once, then the answer is cached
    assert result["available"] is False and result["loaded"] == []
    assert result["ran"] >= 7 and result["inline"] == "completed"
    for job_id, metadata in result["metadata"].items():
        assert "traceparent" not in metadata, job_id
