"""--session-database-url (AWA_SESSION_DATABASE_URL, Pool(session_dsn=)): a
bad one is refused in one line before anything starts. (That the LISTEN
session and the locks use it is checked behind a real PgBouncer, in
tests/multihost/test_hosts_pgbouncer.py.)"""
from __future__ import annotations

import pytest

from awa_pool import ConfigError, Pool
from cli_run import assert_one_error_line, cli


@pytest.mark.parametrize("flag", [True, False])
def test_a_bad_session_url_is_one_line_before_start(dsn: str, flag: bool) -> None:
    bad = "mysql://worker:s3cret-pw@db/app"
    args = ["start", "--app", "apps.basic", "-w", "1", "--database-url", dsn]
    result = cli(*args, "--session-database-url", bad) if flag else \
        cli(*args, env={"AWA_SESSION_DATABASE_URL": bad})
    assert_one_error_line(result, "unsupported database URL scheme 'mysql'")
    assert "s3cret-pw" not in result.stderr


def test_pool_takes_the_session_url_from_its_argument_or_the_environment(monkeypatch, dsn: str) -> None:
    with pytest.raises(ConfigError, match="unsupported database URL scheme"):
        Pool(dsn, app="apps.basic", workers=1, session_dsn="redis://localhost")
    monkeypatch.setenv("AWA_SESSION_DATABASE_URL", dsn)
    assert Pool(dsn, workers=1).config.session_dsn == dsn
    with_option = dsn + ("&" if "?" in dsn else "?") + "application_name=x"   # the embedded URL has ?host=
    assert Pool(dsn, workers=1, session_dsn=with_option).config.session_dsn.endswith("=x")
