"""The README's two commands, word for word: the run command works from a
clean state with no database URL and no Postgres server (embedded server,
its data under tmp_path), and the test command is the one CI runs; and the
README stays short, the rest being the pages of docs/."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from cli_run import ROOT, URL_VARS, parse_table

RUN_COMMAND = "pip install -e '.[embedded]' && python examples/quickstart.py"
TEST_COMMAND = "pip install -e '.[test]' && pytest -n auto"
README = (ROOT / "README.md").read_text()


def bash_blocks() -> list:
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", README, re.S)]


def test_readme_shows_exactly_the_two_commands() -> None:
    blocks = bash_blocks()
    assert blocks[0] == RUN_COMMAND
    assert blocks[1] == TEST_COMMAND
    ci = (ROOT / ".ci" / "run").read_text()
    assert "install --quiet -e '.[test]'" in ci and "pytest -n auto" in ci
    assert "embedded =" in (ROOT / "setup.cfg").read_text()  # the extra the run command installs
    for link in ("docs/metrics.md", "docs/benchmarks.md", "examples/quickstart.py",
                 "examples/tilework/tasks.py", "examples/tilework/web.py"):
        assert f"({link})" in README, link
        if not link.endswith("benchmarks.md"):  # produced separately, by the benchmark work
            assert (ROOT / link).exists(), link


def test_readme_stays_a_readme() -> None:
    """At most ~200 lines: the manual is the site under docs/, and the
    README links to its pages."""
    assert len(README.splitlines()) <= 200
    for page in ("getting-started", "tasks", "testing", "cli", "deployment", "kubernetes", "architecture"):
        assert f"(docs/{page}.md)" in README, page


def test_cli_page_kinds_table_is_what_the_cli_prints() -> None:
    """The `awa-pool kinds` example of docs/cli.md is aligned as the CLI
    aligns it: the same rows rendered by cli_output give its text back exactly."""
    from awa_pool.ops.cli_output import table, to_text

    page = (ROOT / "docs" / "cli.md").read_text()
    shown = page.split("`awa-pool kinds` printed")[1].split("```\n")[1].rstrip("\n")
    names = re.split(r"\s{2,}", shown.splitlines()[0].strip())
    headers, rows = parse_table(shown, right=names[1:])  # every column but KIND holds figures
    assert headers == names and headers[:2] == ["KIND", "RUNS"] and len(rows) == 3
    assert to_text(table(headers, rows, right=range(1, len(headers))), terminal=False) == shown


@pytest.mark.embedded_smoke
def test_readme_run_command_works_word_for_word(tmp_path) -> None:
    from awa_pool.core import embedded

    install, run = RUN_COMMAND.split(" && ")
    assert install.startswith("pip install")  # already installed in the test environment
    data = tmp_path / "pgdata"
    env = {key: value for key, value in os.environ.items() if key not in URL_VARS}
    env["AWA_EMBEDDED_DIR"] = str(data)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")  # `python` = this one
    try:
        result = subprocess.run(["bash", "-c", run], cwd=str(ROOT), env=env, capture_output=True,
                                text=True, timeout=600)
        output = result.stdout + result.stderr
        assert result.returncode == 0, output
        assert "Traceback" not in output
        lines = result.stdout.splitlines()
        assert lines[0] == f"using the embedded Postgres (data in {data})"
        assert "schema ready" in lines[1]
        assert sum(1 for line in lines if re.match(r"  tile \d: completed in child \d+", line)) == 8
        assert any(line.startswith("assemble: completed, 8 tiles") for line in lines)
        assert "send_digest: completed, sent to you@example.com" in lines
        assert "pool stopped (exit code 0)" in lines
        assert any("@@@@" in line for line in lines)  # the picture
        assert (data / "PG_VERSION").exists()
    finally:
        embedded.stop(data)
