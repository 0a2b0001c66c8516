"""The package's shape: no import cycle between specdeploy modules, counting imports at any depth
(inside functions too), so each concept has one home that others depend on, not the reverse."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "specdeploy"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            candidates = [target] + [f"{target}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        else:
            continue
        found |= {c for c in candidates if c in modules}
    return found - {name}


def import_graph() -> dict[str, set[str]]:
    files = [p for p in PACKAGE.rglob("*.py") if p.parent.name != "host_scripts"]
    modules = {module_name(p) for p in files}
    return {module_name(p): imports_of(p, modules) for p in files}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = 2
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_graph_sees_imports_inside_functions():
    graph = import_graph()
    assert "specdeploy.checks" in graph["specdeploy.cli"]  # a top-level import
    assert "specdeploy.rollout" in graph["specdeploy.cli"]  # one inside a function


def test_no_import_cycle_inside_the_package():
    # `from . import sibling` names the parent package too; that edge is not a dependency on it
    graph = {
        module: {d for d in deps if not module.startswith(d + ".")}
        for module, deps in import_graph().items()
    }
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))
