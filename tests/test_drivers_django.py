"""Django's connection inside atomic() (SPEC §9), on Django's postgresql
backend with psycopg 3 and with psycopg2, through the real example project
in examples/django_app: its view saves an order and enqueues the receipt
in one atomic() block; a rolled-back block leaves no job; the committed job
runs in a real pool whose handler reads the order through Django's ORM.
Each backend runs in its own process (tests/django_scenario.py), since
Django's settings and driver choice are per process."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import awa_pool
from conftest import ROOT, Pools
from helpers import connection

DJANGO_APP = ROOT / "examples" / "django_app"


def _env(database_url: str, hide_psycopg: bool) -> dict:
    env = dict(os.environ)
    env.update({
        "DATABASE_URL": database_url, "DJANGO_SETTINGS_MODULE": "shop.settings",
        "AWA_HIDE_PSYCOPG": "1" if hide_psycopg else "0",
        "PYTHONPATH": os.pathsep.join([str(DJANGO_APP), str(ROOT / "tests"), str(ROOT)]),
    })
    return env


@pytest.mark.parametrize("backend", ["psycopg", "psycopg2"])
def test_django_atomic_blocks_and_a_real_pool(backend, empty_dsn, processes, tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "django_scenario.py")],
                          env=_env(empty_dsn, hide_psycopg=backend == "psycopg2"),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"scenario failed:\n{done.stdout}\n{done.stderr}"
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    assert facts["driver"] == backend
    assert facts["psycopg_imported"] == (backend == "psycopg")

    log_dir = tmp_path / "exec"
    log_dir.mkdir()
    pool = Pools(processes, empty_dsn, log_dir)
    pool.start(app="shop.tasks", workers=1, env={
        key: value for key, value in _env(empty_dsn, hide_psycopg=False).items()
        if key in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE", "PYTHONPATH")})
    with connection(empty_dsn, autocommit=True) as conn:
        receipt, = awa_pool.wait(conn, [facts["receipt_job"]], timeout=60)
        assert receipt.state == "completed", receipt.errors
        assert receipt.result == {"order_id": facts["order_id"], "receipt": "1 x book"}
        kinds = [record.kind for record in awa_pool.list_jobs(conn, kind="send_receipt")]
    assert kinds == ["send_receipt"]   # the refused order's job never existed
