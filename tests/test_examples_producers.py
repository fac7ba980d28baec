"""The producer examples, run as a user runs them (SPEC §12): the FastAPI app
saves an order and enqueues its receipt in one request transaction (and a
failed order leaves no job), the Node.js producer (the `pg` package) and
the psql one INSERT INTO awa.jobs; a real pool serving examples/receipts.py
completes their jobs. Node and psql are skipped, saying so, where missing."""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from conftest import ROOT
from helpers import query, record, scalar, wait_for

EXAMPLES = ROOT / "examples"
NODE_EXAMPLE = EXAMPLES / "node_producer"


def _start_receipts_pool(pools):
    path = os.pathsep.join([str(EXAMPLES), str(ROOT / "tests"), str(ROOT)])
    return pools.start(app="receipts", workers=2, env={"PYTHONPATH": path})


def _completed(dsn: str, job_id: int) -> dict:
    wait_for(lambda: record(dsn, job_id).state == "completed", timeout=60, message=f"job {job_id} to complete")
    return record(dsn, job_id).result


def test_the_fastapi_example_enqueues_in_the_request_transaction(dsn, pools, monkeypatch) -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    monkeypatch.setenv("DATABASE_URL", dsn)
    monkeypatch.syspath_prepend(str(EXAMPLES))
    import fastapi_app

    _start_receipts_pool(pools)
    order = {"reference": "A-1", "email": "a@example.com", "item": "book"}
    with TestClient(fastapi_app.app) as client:
        created = client.post("/orders", json=order)
        assert created.status_code == 201, created.text
        order_id, job_id = created.json()["order_id"], created.json()["job_id"]
        # the same reference again: the order's INSERT fails, its job rolls back with it
        again = client.post("/orders", json=dict(order, email="b@example.com"))
        assert again.status_code == 409 and "A-1" in again.json()["detail"]
        assert client.post("/orders", json=dict(order, item="")).status_code == 422

        assert _completed(dsn, job_id) == {"order_id": order_id, "sent_to": "a@example.com"}
        shown = client.get(f"/orders/{order_id}").json()
        assert shown["receipt"] == {"job_id": job_id, "state": "completed",
                                    "result": {"order_id": order_id, "sent_to": "a@example.com"}}
        assert client.get("/orders/999").status_code == 404
        assert client.get("/queues").status_code == 200
    assert query(dsn, "SELECT kind FROM awa.jobs") == [("send_receipt",)]
    assert scalar(dsn, "SELECT count(*) FROM example_orders") == 1


def _node_ready() -> str:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the Node.js producer example is not run")
    if not (NODE_EXAMPLE / "node_modules" / "pg").is_dir():
        npm = shutil.which("npm")
        if npm is None:
            pytest.skip("npm is not installed: cannot install the Node.js example's pg package")
        done = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=NODE_EXAMPLE, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, f"npm ci in examples/node_producer failed:\n{done.stderr}"
    return node


def test_the_node_producer_inserts_jobs_a_pool_runs(dsn, pools) -> None:
    node = _node_ready()
    _start_receipts_pool(pools)
    runs = [subprocess.run([node, "producer.js", "42", "n@example.com"], cwd=NODE_EXAMPLE, capture_output=True,
                           text=True, timeout=60, env=dict(os.environ, DATABASE_URL=dsn)) for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr
    first, second = (json.loads(run.stdout) for run in runs)
    now, reminder = first["ids"]
    assert first["audit"] == second["audit"]   # unique: the second run found the first's job
    assert record(dsn, reminder).state == "scheduled" and record(dsn, reminder).tags == ("node", "reminder")
    assert record(dsn, now).tags == ("node",) and record(dsn, now).args == {"order_id": 42, "email": "n@example.com"}
    assert _completed(dsn, now) == {"order_id": 42, "sent_to": "n@example.com"}
    assert scalar(dsn, "SELECT count(*) FROM awa.jobs") == 5


def test_a_node_producer_that_cannot_connect_says_why_in_one_line(dsn) -> None:
    node = _node_ready()
    down = subprocess.run([node, "producer.js"], cwd=NODE_EXAMPLE, capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, DATABASE_URL=dsn.rsplit("/", 1)[0] + "/no_such_database"))
    assert down.returncode == 1 and down.stderr.startswith("error: ") and "no_such_database" in down.stderr
    assert len(down.stderr.strip().splitlines()) == 1


def test_the_psql_producer_inserts_jobs_a_pool_runs(dsn, pools) -> None:
    psql = shutil.which("psql")
    if psql is None:
        pytest.skip("psql is not installed: the psql producer example is not run")
    _start_receipts_pool(pools)
    done = subprocess.run([psql, dsn, "-X", "-qAt", "-v", "ON_ERROR_STOP=1", "-v", "order_id=7",
                           "-v", "email=p@example.com", "-f", str(EXAMPLES / "psql_producer.sql")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    ids = [int(line) for line in done.stdout.split() if line.isdigit()]
    assert len(ids) == 4
    now, reminders = ids[0], ids[1:]
    assert [record(dsn, i).state for i in reminders] == ["scheduled"] * 3
    assert [record(dsn, i).args["day"] for i in reminders] == [1, 2, 3]
    assert _completed(dsn, now) == {"order_id": 7, "sent_to": "p@example.com"}

    bad = subprocess.run([psql, dsn, "-X", "-qAt", "-v", "ON_ERROR_STOP=1", "-v", "order_id=7",
                          "-f", str(EXAMPLES / "psql_producer.sql")], capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0   # no email given: psql refuses the script before the INSERT
    assert scalar(dsn, "SELECT count(*) FROM awa.jobs") == 4
