"""The package's shape: no import cycle between specdeploy modules, counting imports at any depth
(inside functions too), so each concept has one home that others depend on, not the reverse."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.unit import REPO

PACKAGE = REPO / "specdeploy"


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
    files = [
        p for p in PACKAGE.rglob("*.py") if p.parent.name != "scripts"
    ]  # host scripts: standalone
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
    assert "specdeploy.checks.host_data" in graph["specdeploy.cli.commands"]  # a top-level import
    assert "specdeploy.flows.rollout" in graph["specdeploy.cli.commands"]  # one inside a function


def test_no_import_cycle_inside_the_package():
    # `from . import sibling` names the parent package too; that edge is not a dependency on it
    graph = {
        module: {d for d in deps if not module.startswith(d + ".")}
        for module, deps in import_graph().items()
    }
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


# THE ROOMS: specdeploy's folders, ground floor first. This list is the one statement of the stage
# order: CONTRIBUTING.md's pipeline table lists the same rooms in the same order, and the package's
# folders are these (both tested below). A module imports only from its own folder or the folders
# below it, so the floors are the order of use, not of the data flow: each entry says why it stands
# where it does.
ROOMS = [
    "config",  # host data, the record, the request set, pinned revisions: every room reads it
    "decide",  # pure decisions (statistics, verdicts, gate rule, k, vLLM's counters): reads only
    #            config, so every room above and the benchmarks use it as a library
    "report",  # where reports land, bench summaries, summary.md/json, charts: reads config and
    #            decide; low so steps, measurements, flows and the CLI write and read reports
    "host",  # facts per tool, commands on a host, the server lifecycle, benchmarks, host scripts:
    #          reads config and decide's counters
    "render",  # argv, units and env files, a whole box's layout: pure, from host data and the
    #            facts' values the steps pass in (host/facts/cuda_boot.py)
    "releases",  # the release tables, the `Release` a pin is looked up to, the wheel probe of
    #              `releases add`, the release matrix: reads only its own tables, so the checks,
    #              the install step and the docs all read a release from here
    "checks",  # refusals before any host is touched; GPU, preflight, memory and the pinned
    #            release's rules: reads the argv readers (render), the facts (host), the releases
    "sampling",  # how a measurement runs on a host, once: the sampler (lease, early benchmark,
    #              fresh server, warm-up), the loop over a plan's samples, the gate's plans: below
    #              steps so the gate (a step) and measure/ both use it; the lease is handed in
    "steps",  # what a deploy does to a host: lock, install, weights, unit, gate, smoke, record, ...
    "measure",  # arms, the compare/tune plans and their harness, the tune flow: the harness takes
    #             the deploy lock and stages weights (steps)
    "flows",  # the deploys: serve (a host or a whole box), compare/tune, the fleet rollout
    "observe",  # status, its table, Prometheus and Grafana: reads what the deploys leave
    "cli",  # the `specdeploy` command and `migrate` (old vLLM flags to host data): runs the rooms
    #         below
    "docs",  # the manual's generated reference: reads the schema, the CLI's parsers, the releases
]
TOP_LEVEL = {"__init__", "templates"}  # all else lives in a room's folder


def room_of(module: str) -> int:
    top = module.split(".")[1] if "." in module else ""
    assert top in ROOMS, f"{module} is in no room of ROOMS: give it one"
    return ROOMS.index(top)


def test_every_folder_is_a_room_and_no_module_stands_at_the_top():
    top = {p.name.removesuffix(".py") for p in PACKAGE.iterdir() if p.name != "__pycache__"}
    assert top - TOP_LEVEL == set(ROOMS), top


def contributing_rooms() -> list[tuple[str, str]]:
    """(floor, room) of each row of CONTRIBUTING.md's pipeline table, in its order."""
    text = (PACKAGE.parent / "CONTRIBUTING.md").read_text()
    section = text.split("## The pipeline, and where it lives", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|") for line in section.splitlines() if line.startswith("| ")][1:]
    return [(cells[1].strip(), cells[2].strip().strip("`").removesuffix("/").removesuffix(".py"))
            for cells in rows]  # fmt: skip


def test_contributing_lists_the_rooms_in_their_order():
    """CONTRIBUTING's table is the reader's copy of ROOMS: same rooms, same order, same floors."""
    assert contributing_rooms() == [(str(floor), room) for floor, room in enumerate(ROOMS)]


def test_every_room_says_what_it_holds():
    """`ls specdeploy` shows the rooms; each folder's docstring says what it holds."""
    missing = [
        room
        for room in ROOMS
        if not ast.get_docstring(ast.parse((PACKAGE / room / "__init__.py").read_text()))
    ]
    assert not missing, missing


# The unit tests mirror the rooms: tests/unit/<room>/ holds the tests of specdeploy/<room>/ (a
# concept with several test modules gets a folder of its own inside its room: steps/gate/,
# flows/rollout/), PROJECT the tests of the repository itself (this layout, the tiers, the manual,
# the tools, the sandbox). What several rooms share (conftest.py, replays.py, data/) stays in
# tests/unit itself.
UNIT = REPO / "tests" / "unit"
PROJECT = "project"


def counts_its_own_depth(tree: ast.AST) -> bool:
    """Whether a module reaches a file from `Path(__file__).parent` or `.parents[n]`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("parent", "parents"):
            base = node.value
            if ast.unparse(base).endswith(".resolve()"):
                base = base.func.value
            if ast.unparse(base) == "Path(__file__)":
                return True
    return False


def unit_layout_problems(unit: Path) -> list[str]:
    """What keeps `unit` (a tests/unit tree) from mirroring ROOMS: a test module outside a room's
    folder or PROJECT's, a folder of test modules that is no package (pytest would import two
    test_x.py of different rooms under one name), a module that finds files by counting its own
    folders (it breaks when moved: tests.unit.REPO and DATA do not), a room with no test module."""
    problems, tested = [], set()
    for path in sorted(unit.rglob("test_*.py")):
        parts = path.relative_to(unit).parts
        if len(parts) < 2 or parts[0] not in {*ROOMS, PROJECT}:
            problems.append(f"{'/'.join(parts)}: in no room's folder; move it to <room>/")
            continue
        tested.add(parts[0])
        folder = path.parent
        while folder != unit:
            if not (folder / "__init__.py").is_file():
                problems.append(f"{folder.relative_to(unit)}/: no __init__.py")
            folder = folder.parent
    problems += [
        f"{path.relative_to(unit)}: finds files by its own depth; use tests.unit.REPO"
        for path in unit.glob("*/**/*.py")
        if counts_its_own_depth(ast.parse(path.read_text()))
    ]
    problems += [f"{room}/: no tests of specdeploy/{room}/" for room in ROOMS if room not in tested]
    return sorted(set(problems))


def test_the_unit_tests_mirror_the_rooms():
    assert unit_layout_problems(UNIT) == []


def test_a_flat_test_module_and_an_untested_room_are_named(tmp_path):
    for name in ROOMS[1:]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").touch()
        (tmp_path / name / "test_x.py").touch()
    (tmp_path / "test_flat.py").touch()
    (tmp_path / "gate").mkdir()
    (tmp_path / "gate" / "test_gate.py").touch()
    (tmp_path / "steps" / "lock").mkdir()
    (tmp_path / "steps" / "lock" / "test_lock.py").touch()
    (tmp_path / "host" / "test_x.py").write_text('DATA = Path(__file__).parent / "data"\n')
    assert unit_layout_problems(tmp_path) == [
        "config/: no tests of specdeploy/config/",
        "gate/test_gate.py: in no room's folder; move it to <room>/",
        "host/test_x.py: finds files by its own depth; use tests.unit.REPO",
        "steps/lock/: no __init__.py",
        "test_flat.py: in no room's folder; move it to <room>/",
    ]


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


def test_decide_is_pure():
    """decide/ reads no host and drives nothing: no pyinfra, no network, no subprocess, so the
    benchmarks and every flow can use its verdicts as a library."""
    impure = {"pyinfra", "requests", "subprocess", "paramiko", "specdeploy.host"}
    found = {
        f"{path.name} imports {name}"
        for path in (PACKAGE / "decide").glob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Import | ast.ImportFrom)
        for name in (
            [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        )
        if any(name == bad or name.startswith(bad + ".") for bad in impure)
    }
    assert not found, found


def test_render_is_pure():
    """render/ turns host data and the facts the steps pass in into text: it imports nothing of
    pyinfra (not even through the modules it imports) and reads no fact."""
    import subprocess
    import sys

    modules = sorted(module_name(p) for p in (PACKAGE / "render").glob("*.py"))
    code = "; ".join(f"import {m}" for m in modules)
    code += "; import sys; print(sorted(m for m in sys.modules if m.split('.')[0] == 'pyinfra'))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout
    reads = {
        f"{path.name}: {node.attr}"
        for path in (PACKAGE / "render").glob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and node.attr in {"get_fact", "get_facts"}
    }
    assert not reads, reads


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
    assert "specdeploy/flows/serve.py" in names and "specdeploy/templates/vllm.service.j2" in names
    assert "specdeploy/releases/tables/index.json" in names  # the release tables travel along
    (entry,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    script = zipfile.ZipFile(wheel).read(entry).decode()
    assert "specdeploy = specdeploy.cli:main" in script
    from specdeploy.cli import main  # what the console script calls

    assert callable(main)
    assert not [n for n in names if "sandbox" in n or "argparse_probe" in n]


def test_benchmarks_and_tests_import_code_rather_than_patch_the_path():
    """A test imports what it tests (product code from the package, a harness from tests/), never
    a benchmark nor a file by its path; a benchmark imports the package and its siblings as
    `benchmarks.*` (on the GPU machine too: the device runner carries the code tree and starts
    every module with -m), never edits sys.path."""
    repo = PACKAGE.parent
    patched = sorted(
        str(path.relative_to(repo))
        for path in (repo / "benchmarks").rglob("*.py")
        if re.search(r"sys\.path\s*(\.\w+\(|\[|\+?=)", path.read_text())
    )
    assert not patched, patched
    this = Path(__file__).resolve()
    by_path, from_benchmarks = [], []
    for path in sorted((repo / "tests").rglob("*.py")):
        if path == this:
            continue
        text = path.read_text()
        if "spec_from_file_location" in text:
            by_path.append(str(path.relative_to(repo)))
        for node in ast.walk(ast.parse(text)):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            if any(n == "benchmarks" or n.startswith("benchmarks.") for n in names):
                from_benchmarks.append(str(path.relative_to(repo)))
    assert not by_path, by_path
    assert not from_benchmarks, from_benchmarks


# Shell scripts in benchmarks/ that run on the control node (every GPU plan runs through
# `python -m benchmarks.device`).
CONTROL_NODE_SCRIPTS = {"benchmarks/suite_cpu/demo_cpu.sh"}


def test_every_gpu_plan_goes_through_the_one_device_runner():
    """benchmarks/device/plans.py names each plan's runner, plan builder and setup modules; each
    exists, and every device-side runner under benchmarks/ is one of them. The carrying,
    unpacking, starting and collecting live in benchmarks/device/__main__.py alone: no other
    benchmark script handles the device call's $OUT or the vLLM pack."""
    repo = PACKAGE.parent
    plans = (repo / "benchmarks" / "device" / "plans.py").read_text()
    named = set(re.findall(r'"(benchmarks(?:\.\w+)+)(?::\w+)?"', plans))
    assert named, "plans.py names no module"
    missing = sorted(m for m in named if not (repo / (m.replace(".", "/") + ".py")).is_file())
    assert not missing, missing
    runners = {
        ".".join(path.relative_to(repo).with_suffix("").parts)
        for path in (repo / "benchmarks").rglob("*.py")
        if path.stem in ("device_run", "swing_run")
    }
    assert runners and runners <= named, sorted(runners - named)
    scripts = {  # an experiment's scripts, not its recordings (host_proof's recorded command.sh)
        str(p.relative_to(repo))
        for pattern in ("*.sh", "*/*.sh")
        for p in (repo / "benchmarks").glob(pattern)
    }
    assert scripts <= CONTROL_NODE_SCRIPTS, sorted(scripts - CONTROL_NODE_SCRIPTS)
    runner = repo / "benchmarks" / "device" / "__main__.py"
    handling = sorted(
        str(path.relative_to(repo))
        for path in (repo / "benchmarks").rglob("*.py")
        if path != runner and re.search(r'environ\[?\.?(get\()?\W*"OUT"|vllm026', path.read_text())
    )
    assert not handling, handling


def test_deploys_are_entry_points_of_a_few_lines():
    """A deploy (`pyinfra INVENTORY deploys/x.py`) names its flow and calls it: what it does lives
    in specdeploy/flows/, where the layering and the operation fixtures see it."""
    for path in sorted((PACKAGE.parent / "deploys").glob("*.py")):
        body = ast.parse(path.read_text()).body
        kinds = [type(node).__name__ for node in body]
        assert kinds == ["ImportFrom", "Expr"], f"{path.name}: {kinds}"
        assert body[0].module.startswith("specdeploy.flows."), f"{path.name}: {body[0].module}"
        assert len(path.read_text().splitlines()) <= 15, f"{path.name}: say the rest in its flow"
