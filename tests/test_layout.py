"""The layout (docs/decisions.md, "Layout: three products, arrows one way"): no import circle (the
benchmarks included), the arrows between the products one way, imports inside functions only to load
an optional dependency lazily, no module over 400 lines.

The import graph counts every import: at module top, inside functions and
under ``TYPE_CHECKING``. ``.importlinter`` states the same arrows for
``lint-imports``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator
from functools import cache
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parent.parent
RUNTIME = "consensus_api"
TESTKIT = "consensus_testkit"
CHAOS = "consensus_chaos"
BACKENDS = ("consensus_backends", "consensus_redis")
BENCHMARKS = "benchmarks"
PACKAGES = (RUNTIME, TESTKIT, CHAOS, *BACKENDS, BENCHMARKS)
MAX_LINES = 400
#: The shipped code: the runtime, the test kit, the chaos tools, the backends and the benchmarks.
PRODUCT_DIRECTORIES = ("consensus_api", "consensus_testkit", "consensus_chaos", "backends", "benchmarks")
SOURCE_DIRECTORIES = (*PRODUCT_DIRECTORIES, "tests")
#: The only packages a function may import (to load an optional dependency lazily, so the module loads
#: without it); every other import sits at module top, where a missing one fails at once.
LAZY_IMPORTS = frozenset(
    {
        # the otel and prometheus extras: consensus_api.observability measures only when they are installed
        "opentelemetry",
        "prometheus_client",
        # the spark extra: the chaos checker's Spark engine; the local engine runs without it
        "pyspark",
        # the postgresql and mysql extras: one SQL backend (and its test kit) serves every SQL scheme,
        # so SQLite needs neither driver, PostgreSQL no PyMySQL, MariaDB no psycopg
        "psycopg",
        "pymysql",
        # SQLAlchemy's PostgreSQL dialect, which SQLAlchemy itself loads only for a postgresql URL: the
        # SQL backend's one PostgreSQL-only statement (ON CONFLICT) imports it there, so that a session
        # on SQLite or MySQL does not carry it (2.3 MiB of its resident memory, issue 36)
        "sqlalchemy.dialects.postgresql",
        # the sql extra on Linux only: SQLite's file watch falls back to polling without it
        "inotify_simple",
        # the bridge (spec section 14), loaded only by a session opened with ``migrate_to``: a session at rest
        # on one store does not carry it (0.45 MiB of its resident memory, issue 36)
        "consensus_api.bridging",
    }
)


@cache
def graph() -> grimp.ImportGraph:
    """The import graph of the six packages; a package outside them is one (external) module."""
    return grimp.build_graph(*PACKAGES, include_external_packages=True, cache_dir=None)


def circles(modules: Iterable[str]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    inside = set(modules)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    work: list[tuple[str, Iterator[str]]] = []
    found: list[list[str]] = []

    def enter(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        work.append((module, iter(sorted(graph().find_modules_directly_imported_by(module) & inside))))

    def leave(module: str) -> None:
        if low[module] != index[module]:
            return
        component: list[str] = []
        while not component or component[-1] != module:
            component.append(stack.pop())
            on_stack.discard(component[-1])
        if len(component) > 1:
            found.append(sorted(component))

    for root in sorted(inside):
        if root in index:
            continue
        enter(root)
        while work:
            module, pending = work[-1]
            successor = next(pending, None)
            if successor is None:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[module])
                leave(module)
            elif successor not in index:
                enter(successor)
            elif successor in on_stack:
                low[module] = min(low[module], index[successor])
    return found


def describe(component: list[str]) -> str:
    """A circle's imports, each with the lines that make it."""
    lines = [f"import circle of {len(component)} modules:"]
    members = set(component)
    for importer in component:
        for imported in sorted(graph().find_modules_directly_imported_by(importer) & members):
            details = graph().get_import_details(importer=importer, imported=imported)
            where = ", ".join(str(detail["line_number"]) for detail in details)
            lines.append(f"  {importer} -> {imported} (line {where})")
    return "\n".join(lines)


def own_modules(*packages: str) -> set[str]:
    """The modules of ``packages`` (not the external ones they import)."""
    return {module for module in graph().modules if module.split(".")[0] in packages}


def backend_runtime_modules() -> set[str]:
    """Every module of the backends outside their ``testkit`` subpackages."""
    return {module for module in own_modules(*BACKENDS) if "testkit" not in module.split(".")}


#: Who must not reach what, directly or through other modules.
ARROWS: dict[str, tuple[Callable[[], set[str]], tuple[str, ...]]] = {
    "runtime": (lambda: own_modules(RUNTIME), (TESTKIT, CHAOS, *BACKENDS, "benchmarks")),
    "testkit": (lambda: own_modules(TESTKIT), (CHAOS, *BACKENDS, "benchmarks")),
    "backend-runtime": (backend_runtime_modules, (TESTKIT, CHAOS, "benchmarks")),
    "backend-testkit": (lambda: own_modules(*BACKENDS), (CHAOS, "benchmarks")),
}


def reached(importers: Iterable[str], forbidden: tuple[str, ...]) -> list[str]:
    """Every chain of imports from one of ``importers`` to a module of a ``forbidden`` package."""
    chains = []
    for importer in sorted(importers):
        for target in sorted(graph().find_upstream_modules(importer)):
            if target.split(".")[0] in forbidden:
                chain = graph().find_shortest_chain(importer=importer, imported=target) or ()
                chains.append(" -> ".join(chain))
    return chains


def test_no_import_circle() -> None:
    found = circles(own_modules(*PACKAGES))
    assert not found, "\n".join(describe(component) for component in found)


@pytest.mark.parametrize("name", ARROWS)
def test_arrows_run_one_way(name: str) -> None:
    importers, forbidden = ARROWS[name]
    modules = importers()
    assert modules
    assert reached(modules, forbidden) == []


def test_the_runtime_loads_no_test_kit_chaos_or_their_dependencies(tmp_path: Path) -> None:
    script = (
        "import sys\n"
        "import consensus_api, consensus_api.aio, consensus_api.migrate\n"
        "session = consensus_api.connect(sys.argv[1])\n"
        "session.close()\n"
        "print('\\n'.join(sorted(sys.modules)))\n"
    )
    url = f"sqlite:///{tmp_path / 'layout.db'}"
    proc = subprocess.run(
        [sys.executable, "-c", script, url], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    loaded = proc.stdout.split()
    banned = ("pytest", "psutil", "pyarrow", "pyspark", "matplotlib", TESTKIT, CHAOS, "benchmarks")
    assert [name for name in loaded if name.split(".")[0] in banned] == []


def test_no_module_over_400_lines() -> None:
    long = []
    for directory in SOURCE_DIRECTORIES:
        for path in sorted((ROOT / directory).rglob("*.py")):
            with path.open("rb") as source:
                lines = sum(1 for _ in source)
            if lines > MAX_LINES:
                long.append(f"{path.relative_to(ROOT)}: {lines} lines")
    assert not long, "\n".join(long)


def function_level_imports(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """The line and module of every import inside a function body (nested ones once); a relative
    import's module starts with its dots."""
    seen: set[int] = set()
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(function):
            if id(node) in seen:
                continue
            seen.add(id(node))
            if isinstance(node, ast.Import):
                yield from ((node.lineno, alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                yield node.lineno, "." * node.level + (node.module or "")


def test_function_level_imports_load_only_optional_dependencies() -> None:
    found = []
    for directory in PRODUCT_DIRECTORIES:
        for path in sorted((ROOT / directory).rglob("*.py")):
            tree = ast.parse(path.read_bytes(), filename=str(path))
            for line, module in function_level_imports(tree):
                if module not in LAZY_IMPORTS and module.split(".")[0] not in LAZY_IMPORTS:
                    found.append(f"{path.relative_to(ROOT)}:{line}: import of {module} inside a function")
    assert not found, "\n".join(found)
