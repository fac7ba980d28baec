"""Structural rules of the codebase (STYLE.md): SQL lives in schema/, children
never touch the database, only the CLI prints or exits."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from awa_pool.sql import QUERIES

PACKAGE = Path(__file__).resolve().parent.parent / "awa_pool"
# every module of the package, subpackages included (dashboard/app.py -> "dashboard.app")
SOURCES = {".".join(path.relative_to(PACKAGE).with_suffix("").parts): path.read_text()
           for path in PACKAGE.rglob("*.py")}

CHILD_SIDE = ("child", "execute", "context", "protocol", "job", "errors", "tasks")
DB_MODULES = {"db", "drivers", "sql", "producer", "admin", "migrate", "fetcher", "completer", "notifier",
              "leader", "maintenance", "psycopg2"}


def _imports(source: str) -> set:
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level and module:
                names.add(module.split(".")[0])
            elif node.level:
                names.update(alias.name for alias in node.names)
            else:
                names.add(module.split(".")[0])
    return names


def test_child_side_modules_never_import_database_code() -> None:
    for name in CHILD_SIDE:
        if name not in SOURCES:
            continue
        tree = ast.parse(SOURCES[name])
        # module-level imports only: Task.enqueue imports the producer inside a function
        top = set()
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                top |= _imports(ast.unparse(node))
        assert not (top & DB_MODULES), f"{name}.py imports {top & DB_MODULES}"


def test_no_import_of_the_package_root_inside_the_package() -> None:
    for name, source in SOURCES.items():
        assert not re.search(r"^\s*from awa_pool import|^\s*import awa_pool\b", source, re.M), name


def test_every_named_query_is_used_and_exists() -> None:
    code = "\n".join(SOURCES.values())
    referenced = set(re.findall(r'QUERIES\["([a-z0-9_]+)"\]', code))
    assert referenced - set(QUERIES) == set(), "referenced but not defined"
    assert set(QUERIES) - referenced == set(), "defined but never used"


def test_no_sql_strings_outside_schema() -> None:
    for name, source in SOURCES.items():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value.lstrip()
                assert not re.match(r"(SELECT|INSERT|UPDATE|DELETE|CREATE|DROP|ALTER|LISTEN|UNLISTEN|NOTIFY)\s",
                                    text), f"{name}.py has inline SQL: {text[:60]!r}"


def test_only_cli_prints_or_exits() -> None:
    for name, source in SOURCES.items():
        if name == "__main__" or name == "cli" or (name.startswith("cli_") and name != "cli_output"):
            continue
        tree = ast.parse(source)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                func = node.func
                if isinstance(func, ast.Name) and func.id == "print":
                    raise AssertionError(f"{name}.py calls print()")
                if isinstance(func, ast.Attribute) and func.attr == "exit" and \
                        isinstance(func.value, ast.Name) and func.value.id == "sys":
                    raise AssertionError(f"{name}.py calls sys.exit()")


def test_only_the_signal_relay_and_child_install_signal_handlers() -> None:
    for name, source in SOURCES.items():
        if name in ("signals", "child"):
            continue
        assert "signal.signal(" not in source, f"{name}.py installs a signal handler"


# The layers of docs/architecture.md: a module imports (at module level) only
# from its own layer or lower ones. Imports inside functions may reach up
# (Task.enqueue -> producer, Pool.run -> supervisor): they load on use.
LAYERS = {
    0: {"errors", "job", "protocol", "inflight", "version"},
    1: {"config", "dispatcher", "context", "execute", "tasks", "periodic", "tracing"},
    2: {"db", "drivers", "sql", "migrate", "outcome_params"},
    3: {"producer", "admin", "stats", "periodic_admin", "fetcher", "completer", "notifier", "leader",
        "maintenance", "registration", "requests", "grants", "liveness", "pooling", "urgent_lane"},
    4: {"child", "child_handle", "children", "claimer", "cancels", "session", "signals", "lifecycle",
        "supervisor"},
}
LAYER_OF = {name: layer for layer, names in LAYERS.items() for name in names}


def _package_imports_at_module_level(source: str) -> set:
    names = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.ImportFrom) and node.level:
            names |= {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
    return names


def test_modules_import_only_their_layer_or_lower_ones() -> None:
    for name, source in SOURCES.items():
        own = LAYER_OF.get(name, 5)  # unlisted: entry points (pool, cli, testing, metrics, ...)
        for imported in _package_imports_at_module_level(source):
            assert LAYER_OF.get(imported, 5) <= own, \
                f"{name}.py (layer {own}) imports {imported} (layer {LAYER_OF.get(imported, 5)})"
    assert LAYER_OF["child"] == 4 and not (
        _package_imports_at_module_level(SOURCES["child"]) & (LAYERS[2] | LAYERS[3]))


def test_a_producer_does_not_load_the_supervisor_stack(dsn) -> None:
    """`import awa_pool` then enqueue: no supervisor modules, no
    multiprocess, no croniter in the web process."""
    import subprocess
    import sys

    script = (
        "import sys, psycopg2, awa_pool\n"
        f"conn = psycopg2.connect({dsn!r})\n"
        "awa_pool.enqueue(conn, awa_pool.Job('k', {'a': 1})); conn.commit()\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith(('awa_pool', 'multiprocess', "
        "'croniter')))))\n")
    loaded = set(subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                                check=True).stdout.split())
    forbidden = {"awa_pool.supervisor", "awa_pool.children", "awa_pool.claimer", "awa_pool.child",
                 "multiprocess", "croniter"}
    assert "awa_pool.producer" in loaded
    assert not loaded & forbidden, f"a producer loaded {sorted(loaded & forbidden)}"


def test_modules_stay_small() -> None:
    """No module over 500 lines; the supervisor's loop at most 550."""
    for name, source in SOURCES.items():
        limit = 550 if name == "supervisor" else 500
        lines = source.count("\n")
        assert lines <= limit, f"{name}.py has {lines} lines (at most {limit})"
