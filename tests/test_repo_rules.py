"""Rules of the repository itself: a run artefact (benchmark result, soak
data, plot) is committed only while a document cites it, new raw runs are
ignored by git, and every relative link in the documents points at a
committed file."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path, PurePosixPath
from typing import List, Set

import pytest

ROOT = Path(__file__).resolve().parent.parent
ARTEFACT_DIRS = ("scripts/bench/results/", "docs/soak/", "docs/img/")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _git(*args: str) -> subprocess.CompletedProcess:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("these rules are about the git checkout; this tree is not one")
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)


def _tracked() -> List[str]:
    done = _git("ls-files", "-z")
    assert done.returncode == 0, done.stderr
    return [path for path in done.stdout.split("\0") if path]


def _is_artefact(path: str) -> bool:
    return path.startswith(ARTEFACT_DIRS)


def _citing_sources(tracked: List[str]) -> List[str]:
    """Documents (every Markdown file outside the artefact folders) and the
    scripts that may read an artefact by name (scripts/**/*.py, *.sh)."""
    return [path for path in tracked if not _is_artefact(path) and (
        path.endswith(".md") or (path.startswith("scripts/") and path.endswith((".py", ".sh"))))]


def test_every_committed_run_artefact_is_cited_by_a_document() -> None:
    tracked = _tracked()
    text = "\n".join((ROOT / path).read_text(errors="replace") for path in _citing_sources(tracked))
    uncited = [path for path in tracked if _is_artefact(path) and PurePosixPath(path).name not in text]
    assert uncited == [], (f"{len(uncited)} committed run artefact(s) named by no document: cite them "
                           f"(docs/benchmarks.md, docs/soak.md) or `git rm` them: {uncited}")


@pytest.mark.parametrize("path", [
    "scripts/bench/results/raw-20991231-235959-mytag.jsonl",
    "scripts/bench/results/summary-20991231-235959-mytag.json",
    "scripts/bench/results/table-20991231-235959-mytag.md",
    "scripts/bench/results/runs-20991231-235959-mytag.md",
    "scripts/bench/results/env-20991231-235959-mytag.txt",
    "scripts/bench/results/run-20991231-235959-mytag.log",
    "docs/soak/soak-new-run.csv",
    "docs/soak/soak-new-run.png",
    "docs/soak/soak-new-run-slow.csv",
    "soak.csv",                      # soak.py's default --out
    "soak.png",
    "docs/soak.csv",                 # the --out of soak.py's docstring example
    "chaos-run/exec/exec-1234.log",  # a chaos --work-dir inside the checkout
    "chaos-run.json",                # and its --summary-json
])
def test_new_raw_run_output_is_ignored(path: str) -> None:
    done = _git("check-ignore", "--no-index", "-q", path)
    assert done.returncode == 0, f"{path} would show up as a new file to commit: .gitignore must ignore it"


def test_the_harness_calibration_is_not_ignored() -> None:
    done = _git("check-ignore", "--no-index", "-q", "scripts/bench/results/calibration.json")
    assert done.returncode == 1, "run.py reads results/calibration.json: it must stay committed"


def _link_targets(document: str) -> Set[str]:
    text = (ROOT / document).read_text(errors="replace")
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # code blocks hold commands, not links
    targets = set()
    for target in LINK.findall(text):
        target = target.split("#", 1)[0]
        if not target or re.match(r"^[a-z][a-z0-9+.-]*:", target):  # anchors, http:, mailto:
            continue
        targets.add(target)
    return targets


def test_every_relative_link_in_a_document_points_at_a_committed_file() -> None:
    tracked = _tracked()
    files = set(tracked)
    folders = {str(parent) for path in tracked for parent in PurePosixPath(path).parents}
    broken = []
    for document in (path for path in tracked if path.endswith(".md") and not _is_artefact(path)):
        base = (ROOT / document).parent
        for target in _link_targets(document):
            resolved = (base / target).resolve()
            try:
                relative = resolved.relative_to(ROOT).as_posix()
            except ValueError:
                broken.append(f"{document}: {target} (outside the repository)")
                continue
            if relative not in files and relative not in folders:
                broken.append(f"{document}: {target}")
    assert broken == [], "links to files that are not committed: " + "; ".join(broken)
