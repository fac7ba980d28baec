"""Throwaway databases for tests: one migrated template per schema version,
and a fresh clone of it per test (what the pytest plugin's `awa_database`
hands out). No pytest here, so other test runners can use it too.

The template is named after a fingerprint of the migrations
(`awa_tpl_<fingerprint>`), built once under a server-wide advisory lock and
kept on the server: later sessions, and every xdist worker, clone it
without migrating again, and a schema change gets a template of its own.
A template no session used for TEMPLATE_TTL_DAYS is dropped when a new one
is built. Clones (`awa_t_<worker>_<pid>_<n>`) are dropped by background
threads: DROP DATABASE waits for a checkpoint, which takes seconds on a
busy server; a test need not wait for it, and drops that run side by side
share their checkpoints.
"""
from __future__ import annotations

import datetime
import hashlib
import itertools
import logging
import os
import queue
import secrets
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator, List, Optional
from urllib.parse import urlsplit, urlunsplit

import psycopg2
import psycopg2.errors
import psycopg2.extensions
from psycopg2 import sql

from ..core.db import LOCK_CLASS, redact
from ..api.migrate import MIGRATIONS, migrate
from ..core.sql import QUERIES

log = logging.getLogger(__name__)

LOCK_TEST_TEMPLATE = 3          # advisory key (with db.LOCK_CLASS) of template builds
TEMPLATE_TTL_DAYS = 14
TEMPLATE_MARKER = "awa_pool test template, last used "
MAINTENANCE_DATABASE = "postgres"
DROP_WAIT_S = 600.0             # how long close() waits for queued drops
# Drops at a time, per machine-wide session (split among xdist workers):
# each holds an admin connection while there is a backlog. Measured on the
# 2-vCPU VM, 16 drops took 41 s one at a time, 23-27 s four at a time and
# 13-18 s eight at a time.
DROPPERS = 8

_clone_numbers = itertools.count(1)   # per process: in-process pytest runs share it
_process_token = secrets.token_hex(2)


def with_database(url: str, name: str) -> str:
    """The same server URL (or key=value DSN) pointing at database `name`."""
    if "://" in url:
        parts = urlsplit(url)
        return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))
    params = psycopg2.extensions.parse_dsn(url)
    params["dbname"] = name
    return psycopg2.extensions.make_dsn(**params)


def schema_fingerprint() -> str:
    """12 hex digits that change whenever a migration is added or edited."""
    digest = hashlib.sha256()
    for version, name, text in MIGRATIONS:
        digest.update(f"{version}:{name}:{len(text)}:".encode())
        digest.update(text.encode())
    return digest.hexdigest()[:12]


def _name_part(text: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in text.lower())[:20]


class TestServer:
    """A PostgreSQL server that tests may create and drop databases on (the
    role needs CREATEDB). `worker` goes into the clones' names, so the
    databases of each pytest-xdist worker are told apart; `droppers` caps the
    connections that drop databases in the background."""

    __test__ = False  # not a test class, whatever pytest's naming rules say

    def __init__(self, url: str, *, worker: str = "main", droppers: int = DROPPERS) -> None:
        self.url = url
        self.droppers = max(1, droppers)
        self.tag = f"{_name_part(worker)}_{os.getpid()}_{_process_token}"
        self.template_name = f"awa_tpl_{schema_fingerprint()}"
        self._admin: Optional[psycopg2.extensions.connection] = None
        self._template_ready = False
        self._drops: "queue.Queue[Optional[str]]" = queue.Queue()
        self._droppers: List[threading.Thread] = []
        self.drop_errors: List[str] = []

    # -- connections ------------------------------------------------------
    def url_for(self, name: str) -> str:
        return with_database(self.url, name)

    def _connect_admin(self) -> psycopg2.extensions.connection:
        # The maintenance database, so advisory locks are seen by every
        # session (they are per database); the URL's own one if it has none.
        try:
            conn = psycopg2.connect(self.url_for(MAINTENANCE_DATABASE))
        except psycopg2.OperationalError:
            conn = psycopg2.connect(self.url)
        conn.autocommit = True
        return conn

    def _execute(self, statement: Any, params: Any = None, conn: Any = None) -> list:
        if conn is None:
            if self._admin is None or self._admin.closed:
                self._admin = self._connect_admin()
            conn = self._admin
        with conn.cursor() as cur:
            cur.execute(statement, params)
            return cur.fetchall() if cur.description else []

    # -- the template -----------------------------------------------------
    def ensure_template(self) -> str:
        """The migrated template of this schema version, built if missing."""
        if self._template_ready:
            return self.template_name
        lock = {"class": LOCK_CLASS, "key": LOCK_TEST_TEMPLATE}
        self._execute(QUERIES["server_lock"], lock)
        try:
            if not self._execute(QUERIES["database_exists"], {"name": self.template_name}):
                self._build_template()
                self._drop_stale_templates()
            self._mark_used()
        finally:
            self._execute(QUERIES["server_unlock"], lock)
        self._template_ready = True
        return self.template_name

    def _mark_used(self) -> None:
        today = datetime.date.today().isoformat()
        try:
            self._execute(_format(QUERIES["mark_test_template"], self.template_name),
                          {"comment": TEMPLATE_MARKER + today})
        except psycopg2.errors.InsufficientPrivilege:
            pass  # another role's template: its owner's sessions keep it marked

    def _build_template(self) -> None:
        # Migrated under another name, renamed when complete: a build cut
        # short never leaves a half-migrated template behind.
        building = f"awa_tplb_{self.template_name[len('awa_tpl_'):]}"
        log.info("building the test template %s", self.template_name)
        self._execute(_format(QUERIES["drop_database"], building))
        self._execute(_format(QUERIES["create_database"], building))
        conn = psycopg2.connect(self.url_for(building))
        try:
            migrate(conn)
        finally:
            conn.close()
        self._execute(_format(QUERIES["rename_database"], building, self.template_name))

    def _drop_stale_templates(self) -> None:
        cutoff = datetime.date.today() - datetime.timedelta(days=TEMPLATE_TTL_DAYS)
        stale = self._execute(QUERIES["stale_test_templates"], {
            "keep": self.template_name, "marker": TEMPLATE_MARKER, "cutoff": cutoff.isoformat()})
        for (name,) in stale:
            log.info("dropping the test template %s (unused since before %s)", name, cutoff)
            self._execute(_format(QUERIES["drop_database"], name))

    # -- clones -----------------------------------------------------------
    def create_database(self, *, migrated: bool = True) -> str:
        """A new database (a clone of the template, or empty); its name."""
        name = f"awa_t_{self.tag}_{next(_clone_numbers)}"
        if not migrated:
            self._execute(_format(QUERIES["create_database"], name))
            return name
        template = self.ensure_template()
        try:
            self._execute(_format(QUERIES["clone_database"], name, template))
        except psycopg2.errors.InvalidCatalogName:
            # dropped under us (by hand, or as stale by another session): rebuild once
            self._template_ready = False
            self._execute(_format(QUERIES["clone_database"], name, self.ensure_template()))
        return name

    def drop_database(self, name: str, *, wait: bool = False) -> None:
        """Drop a database this server handed out; in the background unless `wait`."""
        if wait:
            self._execute(_format(QUERIES["drop_database"], name))
            return
        self._drops.put(name)
        if self._drops.qsize() and len(self._droppers) < self.droppers:  # a backlog: one more dropper
            dropper = threading.Thread(target=self._drop_queued, daemon=True,
                                       name=f"awa-test-db-dropper-{len(self._droppers)}")
            dropper.start()
            self._droppers.append(dropper)

    @contextmanager
    def database(self, *, migrated: bool = True) -> Iterator[str]:
        """The URL of a new database, dropped (in the background) afterwards."""
        name = self.create_database(migrated=migrated)
        try:
            yield self.url_for(name)
        finally:
            self.drop_database(name)

    def _drop_queued(self) -> None:
        conn = None
        try:
            while True:
                name = self._drops.get()
                if name is None:
                    return
                try:
                    if conn is None or conn.closed:
                        conn = self._connect_admin()
                    self._execute(_format(QUERIES["drop_database"], name), conn=conn)
                except Exception as exc:  # keep dropping the others; close() reports it
                    self.drop_errors.append(f"{name}: {redact(exc)}".strip())
        finally:
            if conn is not None:
                conn.close()

    def close(self) -> None:
        """Wait for the background drops, then close the admin connection."""
        for _ in self._droppers:
            self._drops.put(None)
        deadline = time.monotonic() + DROP_WAIT_S
        for dropper in self._droppers:
            dropper.join(max(0.0, deadline - time.monotonic()))
        if any(dropper.is_alive() for dropper in self._droppers):
            self.drop_errors.append(f"drops still running after {DROP_WAIT_S:g}s")
        self._droppers = []
        if self._admin is not None:
            self._admin.close()
            self._admin = None


def _format(statement: str, *names: str) -> sql.Composed:
    """A named query with its {} placeholders filled by quoted identifiers."""
    return sql.SQL(statement).format(*(sql.Identifier(name) for name in names))
