"""Structural rules of the codebase (STYLE.md): SQL lives in schema/, children
never touch the database, only the CLI prints or exits."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from awa_pool.core.sql import QUERIES

PACKAGE = Path(__file__).resolve().parent.parent / "awa_pool"
# every module of the package, subpackages included (dashboard/app.py -> "dashboard.app")
SOURCES = {".".join(path.relative_to(PACKAGE).with_suffix("").parts): path.read_text()
           for path in PACKAGE.rglob("*.py")}

# What a child process runs: no database code may load with it.
CHILD_SIDE = ("child", "worker.execute", "worker.context", "worker.protocol", "core.job", "core.errors",
              "core.tasks")
DB_MODULES = {"core.db", "core.sql", "api", "worker.fetcher", "worker.completer", "worker.notifier",
              "worker.leader", "worker.maintenance", "worker.session", "psycopg2"}


def _targets(node: ast.AST, module: str) -> set:
    """What an import statement in `module` (dotted, under awa_pool) loads:
    package-relative dotted names ("worker.claimer") for the package's own
    modules, top-level names ("psycopg2") for the others."""
    names = set()
    if isinstance(node, ast.Import):
        names.update(alias.name.split(".")[0] for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
        if not node.level:
            names.add((node.module or "").split(".")[0])
            return names
        package = module.split(".")[:-1]
        base = package[:len(package) - (node.level - 1)] if node.level > 1 else package
        if node.module:
            names.add(".".join(base + node.module.split(".")))
        else:
            names.update(".".join(base + [alias.name]) for alias in node.names)
    return names


def _module_level_imports(module: str) -> set:
    names = set()
    for node in ast.parse(SOURCES[module]).body:
        names |= _targets(node, module)
    return names


def _loads(imported: set, forbidden: set) -> set:
    """The imported names that are, or live inside, a forbidden one."""
    return {name for name in imported for bad in forbidden if name == bad or name.startswith(bad + ".")}


def test_child_side_modules_never_import_database_code() -> None:
    for name in CHILD_SIDE:
        # module-level imports only: Task.enqueue imports the producer inside a function
        bad = _loads(_module_level_imports(name), DB_MODULES)
        assert not bad, f"{name}.py imports {bad}"


def test_no_import_of_the_package_root_inside_the_package() -> None:
    for name, source in SOURCES.items():
        assert not re.search(r"^\s*from awa_pool import|^\s*import awa_pool\b", source, re.M), name


def test_every_named_query_is_used_and_exists() -> None:
    code = "\n".join(SOURCES.values())
    # QUERIES["name"] where code runs a query itself, Query("name", ...) in plans (api/plan.py)
    referenced = set(re.findall(r'(?:QUERIES\[|Query\()"([a-z0-9_]+)"', code))
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
        if name == "__main__" or name == "ops.cli" or (name.startswith("ops.cli_") and name != "ops.cli_output"):
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
        if name in ("worker.signals", "child"):
            continue
        assert "signal.signal(" not in source, f"{name}.py installs a signal handler"


# The layers of docs/architecture.md, one subpackage each: a module imports
# (at module level) only from its own layer or lower ones. Imports inside
# functions may reach up (Task.enqueue -> api.producer, Pool.run ->
# supervisor): they load on use. The top level (the public API, the
# supervisor and the child, testing, the pytest plugin) and the operator
# views sit above the worker core.
LAYERS = {"core": 0, "api": 1, "worker": 2, "supervisor": 2, "child": 2,
          "ops": 3, "testkit": 3, "dashboard": 3}
TOP_LEVEL = {"__init__", "__main__", "aio", "supervisor", "child", "testing", "pytest_plugin"}


def _layer(module: str) -> int:
    return LAYERS.get(module.split(".")[0], 3)


def test_the_top_level_holds_the_public_api_the_supervisor_the_child_and_subpackages() -> None:
    top = {name for name in SOURCES if "." not in name}
    assert top <= TOP_LEVEL, f"modules at awa_pool/'s top level that belong in a subpackage: {top - TOP_LEVEL}"
    packages = {path.parent.name for path in PACKAGE.glob("*/__init__.py")}
    assert packages == {"core", "api", "worker", "ops", "testkit", "dashboard"}, packages


def test_modules_import_only_their_layer_or_lower_ones() -> None:
    for name in SOURCES:
        own = _layer(name)
        for imported in _module_level_imports(name):
            if imported.split(".")[0] in LAYERS:
                assert _layer(imported) <= own, \
                    f"{name}.py (layer {own}) imports {imported} (layer {_layer(imported)})"
    # a child imports no database plumbing and no producer API
    assert not _loads(_module_level_imports("child"), {"core.db", "core.sql", "api"})


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
    forbidden = {"awa_pool.supervisor", "awa_pool.worker.children", "awa_pool.worker.claimer", "awa_pool.child",
                 "multiprocess", "croniter"}
    assert "awa_pool.api.producer" in loaded
    assert not loaded & forbidden, f"a producer loaded {sorted(loaded & forbidden)}"


def test_modules_stay_small() -> None:
    """No module over 500 lines; the supervisor at most 450, and the
    claimer, the children's table and the completer at most 400 each."""
    limits = {"supervisor": 450, "worker.claimer": 400, "worker.children": 400, "worker.completer": 400}
    for name, source in SOURCES.items():
        limit = limits.get(name, 500)
        lines = source.count("\n")
        assert lines <= limit, f"{name}.py has {lines} lines (at most {limit})"


# Code that runs in a thread other than the loop's, and the modules that
# hold or decide scheduling state: the first never loads the second, at any
# level (SPEC §7: one owner of scheduling state; they exchange messages).
OTHER_THREADS = ("worker.completer", "worker.outcome_buffer", "worker.flush_policy", "worker.leader",
                 "worker.maintenance", "worker.liveness", "worker.watchdog", "ops.metrics",
                 "worker.failure_log", "ops.health")
SCHEDULING_STATE = {"worker.children", "worker.child_handle", "worker.claimer", "worker.handout",
                    "worker.placement", "worker.dispatcher", "supervisor"}


def test_no_other_thread_can_reach_the_scheduling_state() -> None:
    for name in OTHER_THREADS:
        imported = set()
        for node in ast.walk(ast.parse(SOURCES[name])):
            imported |= _targets(node, name)
        assert not _loads(imported, SCHEDULING_STATE), f"{name}.py loads {_loads(imported, SCHEDULING_STATE)}"


def test_awa_pool_aio_loads_no_driver_until_one_is_passed(dsn) -> None:
    """`import awa_pool.aio` is as light as `import awa_pool` (no supervisor
    stack), imports no psycopg, asyncpg or SQLAlchemy, and an asyncpg
    connection passed loads asyncpg's seam only."""
    import subprocess
    import sys

    script = (
        "import sys, asyncio, awa_pool.aio\n"
        "def loaded():\n"
        "    return sorted(m for m in sys.modules if m.split('.')[0] in ('awa_pool', 'multiprocess', 'croniter',"
        " 'psycopg', 'asyncpg', 'sqlalchemy'))\n"
        "print(' '.join(loaded()))\n"
        "import asyncpg\n"
        "async def main():\n"
        f"    conn = await asyncpg.connect({dsn!r})\n"
        "    async with conn.transaction():\n"
        "        await awa_pool.aio.enqueue(conn, awa_pool.Job('k', {'a': 1}))\n"
        "    await conn.close()\n"
        "asyncio.run(main())\n"
        "print(' '.join(loaded()))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    imported, used = (set(line.split()) for line in done.stdout.splitlines())
    supervisor_stack = {"awa_pool.supervisor", "awa_pool.worker.children", "awa_pool.worker.claimer",
                        "awa_pool.child", "multiprocess", "croniter"}
    assert "awa_pool.aio" in imported and "awa_pool.api.aio_drivers" in imported
    assert not imported & supervisor_stack, f"import awa_pool.aio loaded {sorted(imported & supervisor_stack)}"
    drivers = {m for m in imported if m.split(".")[0] in ("psycopg", "asyncpg", "sqlalchemy")}
    assert not drivers, f"import awa_pool.aio loaded {sorted(drivers)}"
    assert "asyncpg" in used and not {m for m in used if m.split(".")[0] in ("psycopg", "sqlalchemy")}
    assert not used & supervisor_stack
