"""The Kubernetes and KEDA recipe in deploy/ (docs/kubernetes.md): the
manifests parse, name only options the CLI has, keep their promises to each
other (grace period, probes, ports), and the KEDA scaler's query, run here
on a real database, follows the backlog. No cluster or Docker engine is run."""
from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import Any, Dict, Iterator, List

import psycopg2
import pytest
import typer
import yaml

from awa_pool import Job
from awa_pool.core.config import parse_duration
from awa_pool.ops.cli import app
from helpers import enqueue_jobs, query, scalar

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
def _documents(name: str) -> List[Dict[str, Any]]:
    with open(DEPLOY / "kubernetes" / name) as f:
        return [doc for doc in yaml.safe_load_all(f) if doc is not None]


def _options(command: str) -> set:
    click_command = typer.main.get_command(app).commands[command]
    return {opt for param in click_command.params for opt in (*param.opts, *param.secondary_opts)}


def _flags(args: List[str]) -> List[str]:
    return [arg.split("=", 1)[0] for arg in args if arg.startswith("-")]


def _value(args: List[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def _dockerfile() -> Dict[str, Any]:
    text = (DEPLOY / "Dockerfile").read_text()
    return {key: json.loads(value) for key, value in re.findall(r"^(ENTRYPOINT|CMD) (\[.*\])$", text, re.M)}


def _supervisor() -> Dict[str, Any]:
    [deployment] = _documents("deployment.yaml")
    assert (deployment["apiVersion"], deployment["kind"]) == ("apps/v1", "Deployment")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    return container


def test_every_manifest_parses_and_names_only_cli_options() -> None:
    docker = _dockerfile()
    assert docker["ENTRYPOINT"] == ["/usr/bin/tini", "--", "awa-pool", "start"]  # tini as PID 1
    start_options = _options("start")
    for flags in (_flags(docker["CMD"]), _flags(_supervisor()["args"])):
        assert flags and set(flags) <= start_options, set(flags) - start_options
    [job] = _documents("migrate-job.yaml")
    [migrate] = job["spec"]["template"]["spec"]["containers"]
    assert migrate["command"][:2] == ["awa-pool", "migrate"]
    assert set(_flags(migrate["command"])) <= _options("migrate")
    kinds = [(doc["apiVersion"], doc["kind"]) for doc in _documents("keda-scaledobject.yaml")]
    assert kinds == [("keda.sh/v1alpha1", "TriggerAuthentication"), ("keda.sh/v1alpha1", "ScaledObject")]


def test_the_deployment_keeps_its_promises() -> None:
    [deployment] = _documents("deployment.yaml")
    pod = deployment["spec"]["template"]["spec"]
    container = _supervisor()
    args = container["args"]
    shutdown_s = parse_duration(_value(args, "--shutdown-timeout"), what="--shutdown-timeout")
    assert pod["terminationGracePeriodSeconds"] > shutdown_s  # the drain ends before SIGKILL
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports["health"] == int(_value(args, "--health-port"))
    assert ports["metrics"] == int(_value(args, "--metrics-port"))
    assert container["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "health"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert container["startupProbe"]["httpGet"]["port"] == "health"
    requests, limits = container["resources"]["requests"], container["resources"]["limits"]
    assert int(_value(args, "--workers")) == int(requests["cpu"])  # -w matches what the pod gets
    assert requests["memory"] and limits["memory"]
    env = {item["name"]: item for item in container["env"]}
    assert "secretKeyRef" in env["DATABASE_URL"]["valueFrom"]  # no URL (password) in the manifest
    [_, scaled] = _documents("keda-scaledobject.yaml")
    assert scaled["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert scaled["spec"]["minReplicaCount"] >= 1  # someone must lead (promotion, cron, rescue)


def _keda_query() -> str:
    [_, scaled] = _documents("keda-scaledobject.yaml")
    [trigger] = scaled["spec"]["triggers"]
    assert trigger["type"] == "postgresql"
    return trigger["metadata"]["query"]


@pytest.fixture
def scaler_url(dsn: str) -> Iterator[str]:
    """A login role that may only call awa.live_counts (what KEDA needs)."""
    role = f"awa_scaler_{uuid.uuid4().hex[:12]}"
    query(dsn, f"CREATE ROLE {role} LOGIN")
    query(dsn, f"GRANT USAGE ON SCHEMA awa TO {role}")
    query(dsn, f"GRANT EXECUTE ON FUNCTION awa.live_counts(text[]) TO {role}")
    params = psycopg2.extensions.parse_dsn(dsn)
    params["user"] = role
    yield psycopg2.extensions.make_dsn(**params)
    query(dsn, f"REVOKE ALL ON SCHEMA awa FROM {role}")
    query(dsn, f"REVOKE ALL ON FUNCTION awa.live_counts(text[]) FROM {role}")
    query(dsn, f"DROP ROLE {role}")


def test_the_keda_query_moves_with_the_backlog(dsn: str, scaler_url: str) -> None:
    keda = _keda_query()

    def value() -> int:
        result = scalar(scaler_url, keda)
        assert isinstance(result, int)  # the scaler wants one integer
        return result

    assert value() == 0
    enqueue_jobs(dsn, [Job("render_tile", {"i": i}, queue="render") for i in range(6)]
                 + [Job("send_digest", queue="default") for _ in range(2)]
                 + [Job("elsewhere", queue="other")] + [Job("later", queue="render", delay=3600)])
    assert value() == 8  # ready now in the served queues; not the other queue, not the scheduled job
    claimed = query(dsn, "SELECT id, lease FROM awa.claim('render', 3, 1)")
    assert value() == 8  # running jobs still need their pods
    for job_id, lease in claimed:
        query(dsn, "SELECT awa.finish_attempt(%s, %s, 'completed')", (job_id, lease))
    assert value() == 5
    # above exact_below live jobs the count comes from the leader's census
    query(dsn, "UPDATE awa.live_census_meta SET exact_below = 0")
    query(dsn, "SELECT awa.take_live_census()")
    enqueue_jobs(dsn, [Job("render_tile", queue="render")])
    assert value() == 5  # the census as the leader last took it
    query(dsn, "SELECT awa.take_live_census()")
    assert value() == 6
    with pytest.raises(psycopg2.errors.InsufficientPrivilege):  # that role can read nothing else
        scalar(scaler_url, "SELECT count(*) FROM awa.jobs_hot")
