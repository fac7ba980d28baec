"""Least-privilege roles (SPEC §6), behind `awa-pool grant`.

A producer role may only enqueue: it executes awa.insert_job and
awa.insert_jobs, which run as their owner, and holds no privilege on any
job table. A worker role may run a supervisor, leader maintenance included:
DML on the queue's tables, no DDL. The SQL lives in
schema/migrations/0008_privileges.sql; this module only calls it. Granting
takes effect in the caller's transaction, like every other call here, and
is idempotent.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List

from .drivers import cursor_for
from ..core.sql import QUERIES

PROFILES = ("producer", "worker")


@dataclass(frozen=True)
class Privilege:
    """One object a role may use, and how (`privileges` like "SELECT, UPDATE")."""

    kind: str        # schema, table, view, sequence, columns or function
    name: str
    privileges: str


def _check_role(role: Any) -> str:
    if not isinstance(role, str) or not role.strip():
        raise ValueError("a role name is required (a role created with CREATE ROLE ... LOGIN)")
    if "\x00" in role or len(role) > 63:
        raise ValueError(f"{role[:70]!r} is not a valid role name")
    return role


def grant(conn: Any, role: str, profile: str) -> None:
    """Grant `role` the `producer` or `worker` profile. Never commits."""
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}: use producer or worker")
    statement = QUERIES["grant_producer"] if profile == "producer" else QUERIES["grant_worker"]
    with cursor_for(conn) as cur:
        cur.execute(statement, {"role": _check_role(role)})


def grant_producer(conn: Any, role: str) -> None:
    """Let `role` enqueue (enqueue, enqueue_many, enqueue_batch,
    awa.insert_job) and nothing else."""
    grant(conn, role, "producer")


def grant_worker(conn: Any, role: str) -> None:
    """Let `role` run supervisors: claim, complete, settle, heartbeat,
    LISTEN, callbacks, progress and leader maintenance."""
    grant(conn, role, "worker")


def revoke(conn: Any, role: str) -> None:
    """Take back every privilege `role` holds on the awa schema."""
    with cursor_for(conn) as cur:
        cur.execute(QUERIES["revoke_privileges"], {"role": _check_role(role)})


def privileges(conn: Any, role: str) -> List[Privilege]:
    """What `role` may use in the awa schema now, object by object."""
    with cursor_for(conn) as cur:
        cur.execute(QUERIES["role_privileges"], {"role": _check_role(role)})
        return [Privilege(*row) for row in cur.fetchall()]
