"""The packages' imports read one way: ps_server <- spark_ps.client <- spark_ps.models <-
spark_ps.ml / spark_ps.context, and no module imports itself back through others.

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
#: The coordinator's process: service, coordinator, hosts, journal, migrate, host_service.
KNOWN_CYCLES = [
    {
        "ps_server.coordinator.servicer",
        "ps_server.coordinator.host_service",
        "ps_server.coordinator.hosts",
        "ps_server.coordinator.journal",
        "ps_server.coordinator.migrate",
        "ps_server.coordinator.service",
    },
]


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
