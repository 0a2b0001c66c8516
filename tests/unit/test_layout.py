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


# The rooms, ground floor first: a module imports only from its own room or rooms below it. The
# pipeline reads upwards: config -> checks/render -> server -> steps -> measure -> serve -> observe.
ROOMS = [
    [
        "config", "capabilities", "datasets", "on_host", "timestamps", "inventory", "metrics",
        "record", "bench_summary", "reports", "facts", "balancer_stat", "host_scripts", "problems",
        "host_text",
    ],
    [
        "argv", "memory_model", "instances", "revisions", "render", "gpu_checks", "preflight",
        "checks", "release_checks", "request_set_checks", "migrate",
    ],
    ["server", "watchdog", "bench"],
    ["steps"],
    ["measure"],
    ["serve", "serve_box"],
    ["status", "status_box", "status_table", "monitoring", "rollout"],
    ["cli"],
]  # fmt: skip


def room_of(module: str) -> int:
    top = module.split(".")[1] if "." in module else ""
    for floor, names in enumerate(ROOMS):
        if top in names:
            return floor
    raise AssertionError(f"{module} is in no room of ROOMS: give it one")


def test_every_import_runs_down_the_rooms():
    upward = [
        f"{module} (room {room_of(module)}) imports {dep} (room {room_of(dep)})"
        for module, deps in import_graph().items()
        if module != "specdeploy"
        for dep in deps
        if dep != "specdeploy"
        and not module.startswith(dep + ".")
        and room_of(dep) > room_of(module)
    ]
    assert not upward, "\n".join(upward)


def test_serve_path_takes_only_the_gate_from_measure():
    graph = import_graph()
    serve_path = {"specdeploy.serve"} | {m for m in graph if m.startswith("specdeploy.steps")}
    direct = {d for m in serve_path for d in graph[m] if d.startswith("specdeploy.measure.")}
    assert direct == {"specdeploy.measure.gate"}
    seen, todo = set(), ["specdeploy.measure.gate"]
    while todo:
        module = todo.pop()
        seen.add(module)
        todo += [d for d in graph.get(module, ()) if d not in seen]
    reached = {m for m in seen if m.startswith("specdeploy.measure.")}
    allowed = {"gate", "gate_rule", "decisions", "stats"}
    assert reached <= {f"specdeploy.measure.{name}" for name in allowed}, reached


def test_no_module_over_450_lines():
    long = {
        str(p.relative_to(PACKAGE.parent)): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 450
    }
    assert not long, long


def test_the_wheel_carries_no_sandbox(tmp_path):
    import subprocess
    import sys
    import zipfile

    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(tmp_path), str(PACKAGE.parent)],
        check=True,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("specdeploy-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "specdeploy/serve.py" in names and "specdeploy/templates/vllm.service.j2" in names
    assert not [n for n in names if "sandbox" in n or "argparse_probe" in n]
