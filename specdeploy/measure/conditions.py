"""The conditions every measurement report states: raw/<host>/conditions.json, which
report/summary.py and the replays read back as JSON.

`Conditions` is what plans.conditions() builds for one host: the workload, the request set, the
argv of both arms, the limits and vLLM pin, the decision rule, and the plan's own part:
`CompareConditions` (compare: fixed or sequential) or `TuneConditions` (tune: predict or sweep).
Each reads as its JSON object wherever a mapping is expected (`{**cond, ...}`, `cond["repeats"]`,
`"sequential" in cond`): that object is the file's, key for key, in the order it has always had.
measure_plan adds the run's own keys (kind, host, the restored unit, times) when it writes it."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from specdeploy.config.schema import Workload


class JsonView(Mapping[str, Any]):
    """A typed record that reads as its JSON object (`as_json()`) wherever a mapping is
    expected."""

    def as_json(self) -> dict[str, Any]:
        raise NotImplementedError

    def __getitem__(self, key: str) -> Any:
        return self.as_json()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.as_json())

    def __len__(self) -> int:
        return len(self.as_json())


@dataclass(frozen=True)
class RunOrder:
    """How compare orders its rounds (decisions.round_order)."""

    mode: str
    seed: int | None


@dataclass(frozen=True)
class ApcProfile:
    """The prefix-caching profile's requests (plans.apc_workload): vLLM bench's
    prefix_repetition dataset, sized to fit."""

    prefix_len: int
    suffix_len: int
    num_prefixes: int
    output_len: int
    num_prompts: int


@dataclass(frozen=True)
class SequentialRule:
    """The sequential compare's rule (report.sequential_steps replays it from the raw files)."""

    max_runs: int  # per arm
    spending: str
    looks: list[dict[str, Any]]  # stats.sequential_looks: {runs, level, spent}
    first_runs: int
    rule: str


@dataclass(frozen=True, eq=False)
class CompareConditions(JsonView):
    """compare's part: warm-up, run order, the APC profile, and runs per arm: `repeats` (fixed),
    or None and the `sequential` rule."""

    warmup_runs: int
    run_order: RunOrder
    apc_profile: ApcProfile | None
    repeats: int | None
    order: str  # the order in words
    sequential: SequentialRule | None = None

    def as_json(self) -> dict[str, Any]:
        out = {
            "warmup_runs": self.warmup_runs,
            "run_order": asdict(self.run_order),
            "apc_profile": asdict(self.apc_profile) if self.apc_profile else None,
            "repeats": self.repeats,
        }
        if self.sequential is not None:
            out["sequential"] = asdict(self.sequential)
        return out | {"order": self.order}


@dataclass(frozen=True, eq=False)
class TuneConditions(JsonView):
    """tune's part: the k measured, runs per arm (None: set by the flow), warm-up, method."""

    ks: list[int]
    repeats: int | None
    warmup_runs: int
    tune_method: str  # "predict" or "sweep"
    order: str

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, eq=False)
class LoadConditions(JsonView):
    """A measurement across load levels (load_flow.py): tune_method "load" (ks, the baseline and
    every k) or compare_across_load (across_load: the deployed config, the baseline, the fixed k);
    the levels, the arms and runs per arm at every level."""

    ks: list[int]
    repeats: int
    warmup_runs: int
    tune_method: str | None  # "load" for tune, None for compare
    load_levels: list[dict[str, Any]]  # schema.LoadLevel's, lowest concurrency first
    arms: list[str]
    fixed_k: int | None
    order: str
    # what the release and the engine flags say of a schedule (releases/capabilities.py,
    # render/argv.py), for the report, which may not read them itself
    schedule_supported: bool = False
    data_parallel_size: int = 1
    across_load: bool = False
    schedule: list[list[int]] | None = None  # the schedule the proof measured
    schedule_deployed: bool = False  # False: a candidate (compare_schedule), never deployed

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Limits:
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int


@dataclass(frozen=True)
class VllmPin:
    package: str
    version: str


@dataclass(frozen=True, eq=False)
class Conditions(JsonView):
    """One host's measurement conditions (module docstring)."""

    workload: Workload
    request_set: dict[str, Any] | None  # datasets.describe: sha256, rows, paths (None: generated)
    bench_args: list[str]
    baseline_argv: list[str]
    speculative_argv: list[str]
    speculative_config: dict[str, Any]
    memory: dict[str, int | float]  # the one memory mechanism: {flag name: value}
    limits: Limits
    vllm: VllmPin
    prefix_caching: str
    restart_between_samples: bool | str  # True, or how a visit's runs share one server
    warm_up: str
    decision_alpha: float
    decision_rule: str
    plan: CompareConditions | TuneConditions | LoadConditions

    def as_json(self) -> dict[str, Any]:
        return {
            "workload": self.workload.model_dump(),
            "request_set": self.request_set,
            "bench_args": self.bench_args,
            "baseline_argv": self.baseline_argv,
            "speculative_argv": self.speculative_argv,
            "speculative_config": self.speculative_config,
            "memory": self.memory,
            "limits": asdict(self.limits),
            "vllm": asdict(self.vllm),
            "prefix_caching": self.prefix_caching,
            "restart_between_samples": self.restart_between_samples,
            "warm_up": self.warm_up,
            "decision_alpha": self.decision_alpha,
            "decision_rule": self.decision_rule,
            **self.plan.as_json(),
        }
