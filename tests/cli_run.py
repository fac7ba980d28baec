"""Running `python -m awa_pool ...` as a user would, for the CLI tests."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple
from urllib.parse import urlsplit, urlunsplit

import psycopg2

ROOT = Path(__file__).resolve().parent.parent
URL_VARS = ("AWA_DATABASE_URL", "DATABASE_URL", "AWA_TEST_DATABASE_URL")


def cli_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """The test process's environment without database URLs (every command
    gets --database-url, so nothing starts an embedded server by accident),
    with tests/ importable for --app apps.*."""
    env = {key: value for key, value in os.environ.items() if key not in URL_VARS}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "tests"), str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.setdefault("COLUMNS", "200")
    env.update(extra or {})
    return env


def cli(*args: str, env: Optional[Dict[str, str]] = None, input: Optional[str] = None,
        timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "awa_pool", *args], capture_output=True, text=True,
                          env=cli_env(env), input=input, timeout=timeout, cwd=str(ROOT))


def ok(*args: str, **kwargs) -> str:
    """Run a command that must succeed; return its stdout."""
    result = cli(*args, **kwargs)
    assert result.returncode == 0, f"awa-pool {' '.join(args)} exited {result.returncode}:\n" \
                                   f"{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stderr, result.stderr
    return result.stdout


def assert_one_error_line(result: subprocess.CompletedProcess, *fragments: str) -> str:
    """A user mistake: non-zero exit, exactly one line on stderr starting with
    'error: ' and containing every fragment, and no traceback anywhere."""
    assert result.returncode != 0, f"expected a failure, got 0:\n{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{result.stderr}"
    line = lines[0]
    assert line.startswith("error: "), line
    for fragment in fragments:
        assert fragment in line, f"{fragment!r} not in {line!r}"
    return line


def url_with_password(dsn: str) -> "tuple[str, str]":
    """(a URL that carries a password, that password). Uses the URL's own
    password when it has one; otherwise adds one, which a trust-auth server
    ignores (checked by connecting)."""
    parts = urlsplit(dsn)
    if parts.password:
        return dsn, parts.password
    secret = "hunter2-s3cret"
    user = parts.username or "postgres"
    host = parts.netloc.split("@")[-1]
    url = urlunsplit((parts.scheme, f"{user}:{secret}@{host}", parts.path, parts.query, parts.fragment))
    psycopg2.connect(url).close()
    return url, secret


def parse_table(text: str, right: Iterable[str] = ()) -> Tuple[List[str], List[List[str]]]:
    """(headers, rows) of a table as the CLI prints it off a terminal, after
    checking that it is plain and aligned: columns are separated by at least
    two spaces on every line, and each header and cell starts at its
    column's left edge (ends at its right edge for the headers in `right`)."""
    assert "\x1b" not in text, f"escape codes in piped output:\n{text!r}"
    lines = text.splitlines()
    width = max(len(line) for line in lines)
    padded = [line.ljust(width + 1) for line in lines]
    used = [any(line[i] != " " for line in padded) for i in range(width)] + [False, False]
    spans, i = [], 0
    while i < width:
        if not used[i]:
            i += 1
            continue
        start = i
        while used[i] or used[i + 1]:  # a single space stays inside a cell ("3s ago")
            i += 1
        spans.append((start, i))
    headers = [padded[0][a:b].strip() for a, b in spans]
    right_set = set(right)
    for line in padded:
        for header, (a, b) in zip(headers, spans):
            cell = line[a:b]
            edge = cell[-1] if header in right_set else cell[0]
            assert not cell.strip() or edge != " ", f"column {header!r} misaligned in {line!r}"
    return headers, [[line[a:b].strip() for a, b in spans] for line in padded[1:]]
