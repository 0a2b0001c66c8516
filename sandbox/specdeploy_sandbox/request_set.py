"""The sample request set for the trained sandbox models: `data/sandbox-requests.jsonl` beside this
file.

vLLM's custom JSONL format (`{"prompt": ..., "output_tokens": ...}`), used by the demo through
`workload.dataset = "custom"`. Each prompt is the start of a function from a standard-library module
the trained models never saw (models.HELD_OUT_MODULES): its signature and first body lines, so the
continuation is code the models have to predict, not text they memorised.

    python -m specdeploy_sandbox.request_set   # rewrite the shipped file from this stdlib
"""

from __future__ import annotations

import ast
import json
import sysconfig
from pathlib import Path

from .models import HELD_OUT_MODULES

PATH = Path(__file__).resolve().parent / "data" / "sandbox-requests.jsonl"
PER_MODULE = 6
PROMPT_LINES = 6  # the def line and the first few lines of its body
OUTPUT_TOKENS = (64, 96, 128)  # varied per request, so per-request lengths are exercised


def rows(stdlib: Path | None = None) -> list[dict]:
    stdlib = stdlib or Path(sysconfig.get_paths()["stdlib"])
    out: list[dict] = []
    for module in HELD_OUT_MODULES:
        source = (stdlib / module).read_text()
        lines = source.splitlines(keepends=True)
        functions = [
            node
            for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.FunctionDef)
            and node.end_lineno - node.lineno >= 2 * PROMPT_LINES
        ]
        for node in sorted(functions, key=lambda n: n.lineno)[:PER_MODULE]:
            # No trailing newline: byte-level BPE merges "\n" with the next line's indentation, so a
            # prompt cut after "\n" would start the model at a token boundary it never saw.
            prompt = "".join(lines[node.lineno - 1 : node.lineno - 1 + PROMPT_LINES]).rstrip("\n")
            out.append(
                {"prompt": prompt, "output_tokens": OUTPUT_TOKENS[len(out) % len(OUTPUT_TOKENS)]}
            )
    return out


if __name__ == "__main__":
    PATH.write_text("".join(json.dumps(row) + "\n" for row in rows()))
    print(f"{PATH}: {len(rows())} requests")
