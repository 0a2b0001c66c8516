"""Checks of host data against the pinned vLLM release: the pin itself, the release's table
(capabilities.py), its speculative keys and methods, and how it runs draft_model.

`checks.py` runs these with the config and workload checks; a pin without a usable table stops the
release-dependent checks (their answers would come from another release).
"""

from __future__ import annotations

import difflib
import re
from typing import Any

from packaging.version import InvalidVersion, Version

from specdeploy.checks import capabilities
from specdeploy.config.problems import Problem
from specdeploy.config.schema import ServeConfig
from specdeploy.render.argv import engine_flags, has_flag

# X.Y.Z with an optional .postN / rcN / .devN, and an optional local part (+cu129).
EXACT_PIN = r"^\d+\.\d+\.\d+(\.post\d+|rc\d+|\.dev\d+)?(\+[A-Za-z0-9]+(\.[A-Za-z0-9]+)*)?$"
# pip options that name where packages come from (a local build is on no public index).
INDEX_OPTIONS = ("--index-url", "-i", "--extra-index-url", "--find-links", "-f")


def label(pinned: str, table: str) -> str:
    """How a message names the release it checked against: its own, or the borrowed table's."""
    public = capabilities.public_release(pinned)
    return f"vLLM {public}" if public == table else f"vLLM {public} (table of vLLM {table})"


def check_version(
    host: str, version: Any, package: Any = "vllm", pip_args: Any = ()
) -> tuple[list[Problem], list[Problem]]:
    """(problems, warnings) of the pin: exact, new enough, described by a table of its own (or of
    its minor release), and, for a local build, installable from the index in pip_install_args."""
    todo = 'pin one release exactly, e.g. vllm_version = "0.32.0"'
    if not isinstance(version, str) or not re.match(EXACT_PIN, version.strip()):
        return [Problem(host, "vllm_version", f"{version!r} is not an exact version pin", todo)], []
    try:
        parsed = Version(version)
    except InvalidVersion:
        return [Problem(host, "vllm_version", f"{version!r} is not a valid version", todo)], []
    if parsed < capabilities.JSON_SPECULATIVE_CONFIG_SINCE:
        return [
            Problem(
                host,
                "vllm_version",
                f"{version} predates --speculative-config "
                f"(needs >= {capabilities.JSON_SPECULATIVE_CONFIG_SINCE})",
                "pin a newer vLLM",
            )
        ], []
    package = package if package in capabilities.PACKAGE_REMOVE_AFTER_INSTALL else "vllm"
    public = parsed.public
    add = capabilities.ADD_TABLE.replace("vllm==", f"{package}==").format(version=public)
    choice = capabilities.table_for(version)
    known = ", ".join(capabilities.known_versions())
    if choice is None:
        return [
            Problem(
                host,
                "vllm_version",
                f"vLLM {public} has no release table (specdeploy knows {known}): its speculative "
                "keys, methods, runtime rules and CUDA build are unknown here",
                f"pin a known release, or add its table: {add}",
            )
        ], []
    problems, warnings = [], []
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
    if not choice.exact:
        warnings.append(
            Problem(
                host,
                "vllm_version",
                f"vLLM {public} has no table of its own; checked against vLLM {choice.release}'s "
                "table (same minor release)",
                f"add its table to check it exactly: {add}",
            )
        )
    if capabilities.build_facts(version, package) is None:
        warnings.append(
            Problem(
                host,
                "vllm_version",
                f"vLLM {choice.release}'s table was not read from the {package} wheel: that "
                "build's torch pin, CUDA build and Python requirement are unchecked",
                f"add them: {add}",
            )
        )
    return problems, warnings


def _names_an_index(pip_args: Any) -> bool:
    args = [a for a in (pip_args or []) if isinstance(a, str)]
    return any(a.split("=", 1)[0] in INDEX_OPTIONS or a.startswith(("-i", "-f")) for a in args)


def check_speculative(host: str, cfg: ServeConfig) -> list[Problem]:
    spec = cfg.speculative_config
    known = capabilities.speculative_keys(cfg.vllm_version)
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


def draft_runtime(cfg: ServeConfig) -> capabilities.DraftModelRuntime:
    return capabilities.draft_model_runtime(
        cfg.vllm_version, bool(cfg.speculative_config.get("use_heterogeneous_vocab"))
    )


def check_draft_parallelism(host: str, cfg: ServeConfig) -> tuple[list[Problem], list[Problem]]:
    """(problems, warnings) for draft_tensor_parallel_size against the target's TP."""
    spec = cfg.speculative_config
    draft_tp = spec.get("draft_tensor_parallel_size")
    if spec.get("method") != "draft_model" or draft_tp is None:
        return [], []
    tp = engine_flags(cfg).tp
    if draft_tp == tp:
        return [], []
    runtime = draft_runtime(cfg)
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


def release_warnings(host: str, cfg: ServeConfig) -> list[Problem]:
    """Settings the pinned release makes pointless (draft_model only)."""
    if cfg.speculative_config.get("method") != "draft_model":
        return []
    runtime = draft_runtime(cfg)
    args = cfg.vllm_extra_args
    release = label(cfg.vllm_version, runtime.release)
    warnings = check_draft_parallelism(host, cfg)[1]
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
