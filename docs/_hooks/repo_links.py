"""mkdocs hook: links from a docs page to files of the repository outside
docs/ (scripts, benchmark results, examples, the schema, deploy/) work in
the built site too. Each such file is copied into the site under repo/,
as it is (a Markdown file is not rendered), and the link is rewritten to
that copy; a link to a folder goes to its README.md when it has one, else
becomes plain text. A link to a file that does not exist fails the build,
like mkdocs' own check of links between pages (`mkdocs build --strict`).
"""
from __future__ import annotations

import os
import posixpath
import re
from typing import Dict, Optional

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files, InclusionLevel

LINK = re.compile(r"(!?\[[^\]]*\])\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")
PREFIX = "repo"


class RepoFile(File):
    """A repository file copied into the site byte for byte."""

    def is_documentation_page(self) -> bool:
        return False


def _targets(markdown: str):
    in_code = False
    for line in markdown.split("\n"):
        if FENCE.match(line):
            in_code = not in_code
            continue
        if not in_code:
            for match in LINK.finditer(line):
                yield match


def _outside(page_uri: str, target: str, docs_dir: str, root: str) -> Optional[str]:
    """The repository path a link points at when it leaves docs/ (else None)."""
    path = target.split("#", 1)[0]
    if not path or re.match(r"^[a-z][a-z0-9+.-]*:", path) or path.startswith("/"):
        return None
    absolute = os.path.normpath(os.path.join(docs_dir, posixpath.dirname(page_uri), path))
    if absolute == docs_dir or absolute.startswith(docs_dir + os.sep):
        return None
    relative = os.path.relpath(absolute, root)
    if relative.startswith(".."):
        raise PluginError(f"{page_uri}: the link {target!r} leaves the repository")
    return relative.replace(os.sep, "/")


_copies: Dict[str, Optional[str]] = {}   # repository path -> site path (None: plain text)


def on_files(files: Files, config) -> Files:
    docs_dir = os.path.normpath(config["docs_dir"])
    root = os.path.dirname(os.path.abspath(config["config_file_path"]))
    _copies.clear()
    for page in list(files.documentation_pages()):
        for match in _targets(page.content_string):
            path = _outside(page.src_uri, match.group(2), docs_dir, root)
            if path is None or path in _copies:
                continue
            absolute = os.path.join(root, path)
            if os.path.isdir(absolute):
                readme = posixpath.join(path, "README.md")
                path_file = readme if os.path.isfile(os.path.join(root, readme)) else None
            elif os.path.isfile(absolute):
                path_file = path
            else:
                raise PluginError(f"{page.src_uri}: the link {match.group(2)!r} points at "
                                  f"{path}, which does not exist")
            if path_file is None:
                _copies[path] = None
                continue
            site_path = posixpath.join(PREFIX, path_file)
            if files.get_file_from_path(site_path) is None:
                copy = RepoFile(site_path, src_dir=None, dest_dir=config["site_dir"],
                                use_directory_urls=config["use_directory_urls"],
                                inclusion=InclusionLevel.NOT_IN_NAV)
                copy.abs_src_path = os.path.join(root, path_file)
                copy.generated_by = "repo_links"
                files.append(copy)
            _copies[path] = site_path
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    docs_dir = os.path.normpath(config["docs_dir"])
    root = os.path.dirname(os.path.abspath(config["config_file_path"]))
    out, in_code = [], False

    def rewrite(match: "re.Match[str]") -> str:
        label, target = match.group(1), match.group(2)
        path = _outside(page.file.src_uri, target, docs_dir, root)
        if path is None:
            return match.group(0)
        site_path = _copies.get(path)
        if site_path is None:  # a folder without a README: say where it is
            return label.strip("[]") if label.startswith("[") else label
        return f"{label}({posixpath.relpath(site_path, posixpath.dirname(page.file.src_uri) or '.')})"

    for line in markdown.split("\n"):
        if FENCE.match(line):
            in_code = not in_code
        out.append(line if in_code else LINK.sub(rewrite, line))
    return "\n".join(out)
