"""The packages' imports read one way: ps_server <- spark_ps.client <- spark_ps.models <-
spark_ps.ml / spark_ps.context, and no module imports itself back through others.

Inside ps_server, one package per process (coordinator, host, shard) sits on the modules
they share: a process's package imports the shared modules and never another process's
package, and a shared module imports no process's package.

The import graph is read from the sources with ``ast`` (every ``import``, at module level,
in functions and under ``TYPE_CHECKING`` alike: a deferred import is still a dependency).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Lower layers first; a module may import its own layer and those before it.
LAYERS = [
    ("ps_server",),
    ("spark_ps.client",),
    ("spark_ps.models",),
]

#: Import cycles left to break: each one here must still exist (the list only shrinks).
KNOWN_CYCLES: list[set[str]] = []

#: ps_server's process packages; the rest of ps_server is what they share.
PROCESSES = ("ps_server.coordinator", "ps_server.host", "ps_server.shard")
#: What starts the processes: it may import any of them.
LAUNCHERS = {"ps_server.__main__"}


def _modules() -> dict[str, Path]:
    mods = {}
    for package in ("spark_ps", "ps_server"):
        for path in (ROOT / package).rglob("*.py"):
            if "proto" in path.relative_to(ROOT).parts:
                continue  # generated stubs
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            mods[".".join(parts)] = path
    return mods


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of spark_ps and ps_server it imports."""
    mods = _modules()

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for mod, path in mods.items():
        package = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(resolve(a.name) for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package[: len(package) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets.update(resolve(f"{base}.{a.name}") for a in node.names)
        graph[mod] = {t for t in targets if t and t != mod}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def _layer(mod: str) -> int:
    for i, prefixes in enumerate(LAYERS):
        if any(mod == p or mod.startswith(p + ".") for p in prefixes):
            return i
    return len(LAYERS)  # spark_ps.ml, spark_ps.context and the rest of spark_ps: the top


def _process(mod: str) -> str | None:
    return next((p for p in PROCESSES if mod == p or mod.startswith(p + ".")), None)


def crossings(graph: dict[str, set[str]]) -> list[str]:
    """Imports of ps_server that cross a process boundary: from one process's package into
    another's, or from a shared module into a process's package."""
    return sorted(
        f"{mod} imports {target}"
        for mod, targets in graph.items()
        if mod.startswith("ps_server") and mod not in LAUNCHERS
        for target in targets
        if _process(target) is not None and _process(target) != _process(mod)
    )


def test_the_cycle_finder_finds_a_cycle_and_no_false_one():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [{"a", "b", "c"}]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_module_level_deferred_and_type_checking_imports():
    graph = import_graph()
    assert "spark_ps.client" in graph["spark_ps.models.tensors"]  # module level
    assert "spark_ps.worker_daemon" in graph["spark_ps.context"]  # inside a function
    assert "ps_server.shard.tensors" in graph["ps_server.shard.replica"]  # under TYPE_CHECKING
    assert "ps_server.proto" not in graph and len(graph) > 60


def test_the_crossing_finder_finds_each_kind_of_crossing_and_no_false_one():
    graph = {
        "ps_server.shard.server": {"ps_server.wire", "ps_server.shard.tensors"},
        "ps_server.coordinator.ui": {"ps_server.shard.tensors"},  # process -> process
        "ps_server.checkpoint": {"ps_server.shard.tensors"},  # shared -> process
        "ps_server.__main__": {"ps_server.coordinator.service"},  # the launcher
        "spark_ps.client.client": {"ps_server.shard.direct"},  # a higher layer
    }
    assert crossings(graph) == [
        "ps_server.checkpoint imports ps_server.shard.tensors",
        "ps_server.coordinator.ui imports ps_server.shard.tensors",
    ]


def test_processes_share_only_the_shared_modules():
    graph = import_graph()
    assert {"ps_server.coordinator.servicer", "ps_server.host.supervisor"} <= set(graph)
    assert not crossings(graph), "imports across ps_server's process packages"


def test_layers_import_downwards_only():
    upward = sorted(
        f"{mod} imports {target}"
        for mod, targets in import_graph().items()
        for target in targets
        if _layer(target) > _layer(mod)
    )
    assert not upward, "imports against the layers " + " <- ".join(p[0] for p in LAYERS)


def test_no_import_cycle_but_the_known_ones():
    found = cycles(import_graph())
    new = [sorted(c) for c in found if c not in KNOWN_CYCLES]
    assert not new, f"import cycles: {new}"
    gone = [sorted(c) for c in KNOWN_CYCLES if c not in found]
    assert not gone, f"broken (take them off KNOWN_CYCLES): {gone}"
