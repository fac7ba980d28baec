"""Database access for awa_pool's own sessions: URLs, connecting with retry,
recognising connection errors. (Callers' connections go through drivers.py.)

Every message that may carry a database URL goes through `redact` first, so
a password never reaches a log, an error or the terminal.
"""
from __future__ import annotations

import logging
import os
import re
import time
from typing import Any, Optional

import psycopg2
import psycopg2.extensions
from tenacity import (RetryError, Retrying, retry_if_exception, stop_after_delay,
                      wait_exponential, wait_random)

from .errors import ConfigError, DatabaseUnavailable

log = logging.getLogger(__name__)

URL_ENV_VARS = ("AWA_DATABASE_URL", "DATABASE_URL")
SESSION_URL_ENV_VAR = "AWA_SESSION_DATABASE_URL"   # a direct URL beside a pooler's (supervisors)
WAITING_LOG_EVERY_S = 10.0   # while retrying a connection, at most one log line this often
APPLICATION_NAME = "awa-pool"


def session_name(role: str, supervisor_id: Optional[int] = None) -> str:
    """application_name of a supervisor's session: which supervisor, which
    session ("awa-pool/17 listen"), as pg_stat_activity shows them."""
    return f"{APPLICATION_NAME}/{supervisor_id} {role}" if supervisor_id is not None else \
        f"{APPLICATION_NAME} {role}"

# Advisory lock keys (two-int form): class 0x61776100 ("awa\0") plus a purpose.
LOCK_CLASS = 0x61776100
LOCK_MIGRATE = 1
LOCK_LEADER = 2
LOCK_CLASS_LIVENESS = 0x61776101  # "awa\1": one lock per supervisor, keyed by its id (liveness.py)

_URL_PASSWORD = re.compile(r"(?P<head>[a-z][a-z0-9+.-]*://[^:/?#@\s]*:)(?P<pw>[^@/\s]*)(?P<tail>@)", re.I)
_KV_PASSWORD = re.compile(r"(?P<head>\bpassword\s*=\s*)(?P<pw>'(?:[^'\\]|\\.)*'|\S+)", re.I)
_QUERY_PASSWORD = re.compile(r"(?P<head>[?&]password=)(?P<pw>[^&#\s]*)", re.I)


def redact(text: Any) -> str:
    """Replace every password in URLs and key=value DSNs found in text."""
    text = str(text)
    text = _URL_PASSWORD.sub(lambda m: m.group("head") + "***" + m.group("tail"), text)
    text = _QUERY_PASSWORD.sub(lambda m: m.group("head") + "***", text)
    return _KV_PASSWORD.sub(lambda m: m.group("head") + "***", text)


def configured_url(explicit: Optional[str] = None) -> Optional[str]:
    """--database-url, else AWA_DATABASE_URL, else DATABASE_URL, else None."""
    if explicit:
        return explicit
    for name in URL_ENV_VARS:
        value = os.environ.get(name)
        if value:
            return value
    return None


def check_url(url: str) -> str:
    """Reject strings that are clearly not a Postgres URL or DSN, with one clear line."""
    if not isinstance(url, str) or not url.strip():
        raise ConfigError("the database URL is empty")
    url = url.strip()
    if "://" in url:
        scheme = url.split("://", 1)[0].lower()
        if scheme not in ("postgres", "postgresql"):
            raise ConfigError(f"unsupported database URL scheme {scheme!r} in {redact(url)}: "
                              "use postgresql://user:password@host:port/dbname")
    try:
        psycopg2.extensions.parse_dsn(url)
    except psycopg2.ProgrammingError as exc:
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else "malformed"
        raise ConfigError(f"invalid database URL {redact(url)}: {redact(detail)}") from None
    return url


def describe(url: str) -> str:
    """user@host:port/db of a URL, for log lines (never the password)."""
    try:
        parts = psycopg2.extensions.parse_dsn(url)
    except psycopg2.ProgrammingError:
        return redact(url)
    host = parts.get("host", "localhost")
    if host.startswith("/"):
        host = f"socket {host}"
    port = parts.get("port", "5432")
    return f"{parts.get('user', '')}@{host}:{port}/{parts.get('dbname', '')}"


# A server that vanishes without closing the connection (host down, network
# cut) must be noticed in seconds, not after the kernel's two-hour default.
# Keepalives cover an idle connection; tcp_user_timeout covers one waiting
# for a reply: without it a query sent into a partition blocks the caller
# until TCP gives up retransmitting (minutes), and a supervisor stuck there
# heeds no SIGTERM and enforces no timeout. libpq has it since version 12.
KEEPALIVES = {"keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2, "keepalives_count": 3}
if psycopg2.extensions.libpq_version() >= 120000:
    KEEPALIVES["tcp_user_timeout"] = 10_000  # ms of unacknowledged data before the connection fails


def _open(url: str, *, autocommit: bool, connect_timeout: int,
          application_name: str) -> psycopg2.extensions.connection:
    conn = psycopg2.connect(url, application_name=application_name,
                            connect_timeout=max(1, connect_timeout), **KEEPALIVES)
    conn.autocommit = autocommit
    return conn


def connect(url: str, *, autocommit: bool = False, retry_for: float = 0.0, connect_timeout: int = 10,
            application_name: str = APPLICATION_NAME) -> psycopg2.extensions.connection:
    """Open a connection; retry transient failures for up to `retry_for` seconds.

    Raises DatabaseUnavailable (with the password redacted) when it gives up.
    """
    url = check_url(url)
    waiting = _WaitingLog(url, retry_for)
    try:
        for attempt in Retrying(
            retry=retry_if_exception(lambda exc: isinstance(exc, psycopg2.OperationalError)
                                     and not is_bad_option(exc)),
            stop=stop_after_delay(retry_for),
            wait=wait_exponential(multiplier=0.1, max=2.0) + wait_random(0, 0.1),
            before_sleep=waiting.failed,
            reraise=True,
        ):
            with attempt:
                return _open(url, autocommit=autocommit, connect_timeout=connect_timeout,
                             application_name=application_name)
    except psycopg2.OperationalError as exc:
        if is_bad_option(exc):
            raise ConfigError(f"invalid database URL {redact(url)}: {redact(first_line(exc))}") from None
        raise DatabaseUnavailable(
            f"cannot connect to {describe(url)}: {first_line(exc)}") from None
    except RetryError as exc:  # pragma: no cover - reraise=True makes this unreachable
        raise DatabaseUnavailable(redact(exc)) from None
    raise DatabaseUnavailable(f"cannot connect to {describe(url)}")


class _WaitingLog:
    """While connect() retries: one line saying it waits (for which database,
    for how long), then at most one every WAITING_LOG_EVERY_S."""

    def __init__(self, url: str, retry_for: float) -> None:
        self.url, self.retry_for = url, retry_for
        self.started = time.monotonic()
        self.last_logged: Optional[float] = None

    def failed(self, state: Any) -> None:
        now = time.monotonic()
        error = state.outcome.exception() if state.outcome is not None else None
        why = first_line(error) if error is not None else "unreachable"
        if self.last_logged is None:
            log.info("waiting for the database at %s (up to %.3gs): %s", describe(self.url),
                        self.retry_for, why)
        elif now - self.last_logged >= WAITING_LOG_EVERY_S:
            log.info("still waiting for the database at %s (%.0fs so far): %s", describe(self.url),
                        now - self.started, why)
        else:
            return
        self.last_logged = now


def close_quietly(conn: Any) -> None:
    """Close a connection that may already be broken; never raises."""
    if conn is not None:
        try:
            conn.close()
        except psycopg2.Error:
            pass


def socket_of(conn: Any) -> Optional[int]:
    """The connection's socket fd, or None if it is closed or broken."""
    try:
        return conn.fileno() if conn is not None and not conn.closed else None
    except psycopg2.Error:
        return None


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return redact(text.splitlines()[0] if text else type(exc).__name__)


# SQLSTATEs that end the session: class 08 (connection exceptions), 57P01
# admin_shutdown (pg_terminate_backend), 57P02 crash_shutdown, 57P03
# cannot_connect_now, 53300 too_many_connections (no session was made).
SESSION_GONE = ("57P01", "57P02", "57P03", "53300")
# SQLSTATEs of a statement that failed while its session lives on and that
# succeed when tried again: class 40 (deadlock, serialization failure), 55P03
# lock_not_available (lock_timeout), 57014 query_canceled (statement_timeout).
RETRY_LATER = ("55P03", "57014")


# libpq's own verdicts on a URL's options, before it reaches any server
# (parse_dsn checks their names, not their values): retrying cannot help.
_BAD_OPTION = re.compile(r"^(invalid (\S+ )?(value|port number|integer value|connection option)"
                         r"|could not match \d+ port numbers to \d+ hosts)")


def is_bad_option(exc: BaseException) -> bool:
    """A connection option libpq rejects (sslmode=bogus, port=x): a mistake
    in the URL, not a server that may come up."""
    return bool(_BAD_OPTION.match(first_line(exc)))


def is_connection_error(exc: BaseException) -> bool:
    """True for errors that mean the session is gone (retry on a new one).
    psycopg2 also raises OperationalError for a deadlock or a lock or
    statement timeout; those carry a SQLSTATE of their own and leave the
    session (and the locks it holds) alive, so they are not counted here."""
    pgcode = getattr(exc, "pgcode", None) or ""
    if pgcode:
        return pgcode.startswith("08") or pgcode in SESSION_GONE
    # no SQLSTATE: the client lost the server (closed, reset, timed out)
    return isinstance(exc, (psycopg2.OperationalError, psycopg2.InterfaceError))


def is_transient(exc: BaseException) -> bool:
    """True for errors worth retrying as they are: a lost session, or a
    statement the server gave up on (deadlock, serialization failure, lock
    or statement timeout). Never a reason to fail a job."""
    pgcode = getattr(exc, "pgcode", None) or ""
    return is_connection_error(exc) or pgcode.startswith("40") or pgcode in RETRY_LATER
