"""Parse a ``vllm serve`` command line with vLLM's own CLI parser and report what it means.

Run it with the Python of the venv that holds vLLM (this module and the product's host script
it runs, specdeploy/host/scripts/prove_argv.py, import only vLLM and the standard library, so
``PYTHONPATH=<repo>`` is enough)::

    python tests/integration/vllm_argparse_probe.py -- /models/target --dtype float32 \\
        --speculative-config \\
        '{"method":"draft_model","model":"/models/draft","num_speculative_tokens":3}'
    python tests/integration/vllm_argparse_probe.py --argv-file argv.json   # JSON list of strings
    python tests/integration/vllm_argparse_probe.py --batch cases.json  # many argvs, one import

The argv is everything that would follow ``vllm serve``. ``probe`` is the host script's (a deploy
proves every changed unit's argv on its host with it, steps/proof.py): it goes through the real
``serve`` subcommand parser (``FlexibleArgumentParser`` + ``make_arg_parser``), the serve
validator, ``AsyncEngineArgs.from_cli_args`` and, unless ``--no-engine-config`` is given,
``create_engine_config()``. The last step reads the model's and draft's ``config.json``
(local paths work; no weights are loaded, nothing is started) and applies the platform's
defaults, so the reported values are the ones a server would run with.

One JSON object goes to stdout (vLLM's own logging is sent to stderr):
``{"ok": bool, "stage": "parse"|"engine_args"|"engine_config", "error": str|None, "keys": [...],
"vllm_package": ..., "vllm_version": ..., "argv": [...], "cli": {...}, "engine": {...}|None}``.
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
import io
import json
import os
import sys
from typing import Any

from specdeploy.host.scripts.prove_argv import probe

__all__ = ["main", "probe"]


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
