"""The house: streamlake's modules import one way, down the layers, and never in a circle.

Every module under include/streamlake is parsed with ``ast``; every import counts, wherever it
stands (module level, inside a function, under ``if TYPE_CHECKING``): a function-level import is
a dependency all the same. The layers, lowest first (a module may import from its own layer or
from a lower one, never from a higher one):

    0  top-level helpers   streamlake/__init__.py, config.py, errors.py, logs.py, faults.py, jars.py,
                           procs.py, data_sources.py
    1  kafka, storage      the broker's client and records; the lake's paths and objects
    2  spark               the SparkSession, checkpoints, the class archive
    3  platform            the local processes: broker, Spark Connect, fork server, Airflow
    4  delta               Delta tables: log, transactions, sink, source
    5  pipeline            definitions, bronze -> silver -> gold, the driver
    6  quality, operations checks, suites; jobs, savepoints, backfills, the supervisor;
       monitoring          (beside them) the metrics exporter
    7  orchestration, cli  Airflow's DAG parts, operators and assets; the command line

(jobs/, plugins/ and dags/ sit above everything, outside include/streamlake.)
docs/ARCHITECTURE.md (## Layers) draws them.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[1] / "include" / "streamlake"

# package (first name under streamlake) -> layer; modules directly under streamlake/ are layer 0.
LAYERS = {
    "kafka": 1, "storage": 1,
    "spark": 2,
    "platform": 3,
    "delta": 4,
    "pipeline": 5,
    "quality": 6, "operations": 6, "monitoring": 6,
    "orchestration": 7, "cli": 7,
}
TOP_LEVEL = 0


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE_ROOT.rglob("*.py"))}


def _resolve(name: str, known: set[str]) -> str | None:
    """The longest known module ``name`` is, or is inside (an attribute of a module resolves to
    the module)."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def _imports(module: str, path: Path, known: set[str]) -> set[tuple[str, int]]:
    """The streamlake modules ``module`` imports, each with the line of its import."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    found: set[tuple[str, int]] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                drop = node.level - 1 if is_package else node.level
                base = base[: len(base) - drop] if drop else base
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            # `from streamlake.x import y`: y may be a module of its own (streamlake.x.y)
            # or a name in streamlake.x; either way a dependency on what it resolves to.
            names = [f"{prefix}.{alias.name}" for alias in node.names if alias.name != "*"] or [prefix]
            if any(alias.name == "*" for alias in node.names):
                names.append(prefix)
        for name in names:
            if name != "streamlake" and not name.startswith("streamlake."):
                continue
            target = _resolve(name, known)
            if target and target != module:
                found.add((target, node.lineno))
    return found


def _layer(module: str) -> int:
    parts = module.split(".")
    if len(parts) < 2 or parts[1] not in LAYERS:
        # streamlake itself and its top-level helpers; a new package must be given a layer.
        assert len(parts) < 3, f"{module}: its package {parts[1]!r} has no layer in tests/test_layers.py LAYERS"
        return TOP_LEVEL
    return LAYERS[parts[1]]


def _graph() -> dict[str, dict[str, int]]:
    modules = _modules()
    known = set(modules)
    graph: dict[str, dict[str, int]] = {}
    for module, path in modules.items():
        edges: dict[str, int] = {}
        for target, line in sorted(_imports(module, path, known)):
            edges.setdefault(target, line)
        graph[module] = edges
    return graph


def _circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan): the modules of
    each circle, whichever way round it runs."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [sorted(c) for c in components]


def _one_cycle(graph: dict[str, dict[str, int]], component: set[str]) -> list[str]:
    """A shortest cycle through the component's first module (breadth first, inside it)."""
    start = min(component)
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w not in component:
                    continue
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return [*reversed(path), start]
                if w not in parents:
                    parents[w] = v
                    following.append(w)
        frontier = following
    return sorted(component)  # not reached: a component of more than one module has a cycle


def _describe(graph: dict[str, dict[str, int]], circle: list[str]) -> str:
    """The circle's modules, then one cycle through it, import by import with their lines."""
    cycle = _one_cycle(graph, set(circle))
    steps = [f"{a} (line {graph[a][b]})" for a, b in zip(cycle, cycle[1:])]
    return f"{len(circle)} modules ({', '.join(circle)}), e.g. " + " -> ".join(steps + [cycle[-1]])


def test_every_module_is_parsed_and_every_package_has_a_layer():
    graph = _graph()
    assert len(graph) > 50, sorted(graph)
    packages = {m.split(".")[1] for m in graph if m.count(".") >= 2}
    assert packages <= set(LAYERS), f"packages without a layer: {sorted(packages - set(LAYERS))}"
    for module in graph:
        _layer(module)


def test_no_import_circles():
    graph = _graph()
    circles = _circles(graph)
    assert not circles, "import circles:\n" + "\n".join(_describe(graph, c) for c in circles)


def test_imports_run_down_the_layers_only():
    graph = _graph()
    upward = [f"{a} (layer {_layer(a)}, line {line}) imports {b} (layer {_layer(b)})"
              for a, edges in sorted(graph.items()) for b, line in edges.items() if _layer(b) > _layer(a)]
    assert not upward, "imports from a lower layer up:\n" + "\n".join(upward)


def test_the_check_sees_imports_inside_functions_and_type_checking(tmp_path):
    """The parser counts what the rule says it counts: an import in a function, under
    ``if TYPE_CHECKING``, relative imports."""
    source = ("from typing import TYPE_CHECKING\n"
              "if TYPE_CHECKING:\n    from streamlake.pipeline.definition import Definition\n"
              "def f():\n    import streamlake.delta.log\n    from ..kafka import client\n"
              "    from . import session\n")
    path = PACKAGE_ROOT / "spark" / "_probe.py"  # never written: parsed from tmp_path's copy
    copy = tmp_path / "probe.py"
    copy.write_text(source)
    known = {"streamlake.pipeline.definition", "streamlake.delta.log", "streamlake.kafka.client",
             "streamlake.spark.session", "streamlake.spark._probe"}
    module = _module_name(path)
    assert module == "streamlake.spark._probe"
    found = {target for target, _ in _imports(module, copy, known)}
    assert found == {"streamlake.pipeline.definition", "streamlake.delta.log", "streamlake.kafka.client",
                     "streamlake.spark.session"}


def _top_level_names(tree: ast.Module) -> set[str]:
    """The names a module defines at its top level (also inside top-level if/try blocks)."""
    names: set[str] = set()
    pending = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            pending += node.body + getattr(node, "orelse", []) + getattr(node, "finalbody", [])
            pending += [n for h in getattr(node, "handlers", []) for n in h.body]
    return names


def test_every_import_of_a_streamlake_module_names_one_that_exists():
    """After a module or a name moves, no caller is left behind: every ``import streamlake.X``
    and ``from streamlake.X import name`` in include/, jobs/, dags/, plugins/, tests/ and
    bench/ names a module that exists and, for a name that is not a module of its own, one the
    module defines at its top level (no re-exports to keep an old path alive are needed)."""
    modules = _modules()
    defined = {m: _top_level_names(ast.parse(p.read_text(), filename=str(p))) for m, p in modules.items()}
    repo = PACKAGE_ROOT.parents[1]
    stale = []
    for folder in ("include", "jobs", "dags", "plugins", "tests", "bench"):
        for path in sorted((repo / folder).rglob("*.py")):
            if ".venv" in path.parts or "artifacts" in path.parts:
                continue
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                where = f"{path.relative_to(repo)}:{node.lineno}" if hasattr(node, "lineno") else ""
                if isinstance(node, ast.Import):
                    for alias in node.names:
                        if alias.name.startswith("streamlake.") and alias.name not in modules:
                            stale.append(f"{where}: import {alias.name}")
                elif isinstance(node, ast.ImportFrom) and not node.level and node.module \
                        and (node.module == "streamlake" or node.module.startswith("streamlake.")):
                    if node.module not in modules:
                        stale.append(f"{where}: from {node.module} (no such module)")
                        continue
                    for alias in node.names:
                        if alias.name != "*" and f"{node.module}.{alias.name}" not in modules \
                                and alias.name not in defined[node.module]:
                            stale.append(f"{where}: from {node.module} import {alias.name} (not defined there)")
    assert not stale, "imports of streamlake names that do not exist:\n" + "\n".join(stale)
