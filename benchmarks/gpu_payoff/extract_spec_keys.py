"""Read a vLLM release's SpeculativeConfig fields and methods from its wheel source.

Usage: python extract_spec_keys.py path/to/vllm/config/speculative.py VERSION SOURCE_TEXT
Prints the JSON entry for specdeploy/data/speculative_keys.json (same shape as the existing
entries).
"""

from __future__ import annotations

import ast
import json
import sys

# Fields SpeculativeConfig fills from the engine config itself (post-init, or EngineArgs'
# create_speculative_config overwriting them); setting them in the JSON is meaningless at best.
# draft_load_config is not among them: it is an optional user setting ("If not specified, will use
# the load config from the target model"), read by the draft proposer.
DERIVED = (
    "draft_model_config",
    "draft_parallel_config",
    "target_model_config",
    "target_parallel_config",
)
DERIVED_WHY = "vLLM fills it from the engine config itself (SpeculativeConfig derived field)"


def literal_values(node: ast.AST, aliases: dict[str, ast.AST]) -> list[str]:
    """Expand a Literal[...] (possibly nesting other Literal aliases) into its strings."""
    out: list[str] = []
    if isinstance(node, ast.Subscript) and getattr(node.value, "id", None) == "Literal":
        elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        for elt in elts:
            if isinstance(elt, ast.Constant) and isinstance(elt.value, str):
                out.append(elt.value)
            elif isinstance(elt, ast.Name) and elt.id in aliases:
                out += literal_values(aliases[elt.id], aliases)
            else:
                raise ValueError(f"unexpected Literal element {ast.dump(elt)}")
    return out


def extract(path: str) -> tuple[list[str], list[str], str | None]:
    tree = ast.parse(open(path).read())
    aliases = {
        t.targets[0].id: t.value
        for t in tree.body
        if isinstance(t, ast.Assign) and isinstance(t.targets[0], ast.Name)
    }
    methods = sorted(set(literal_values(aliases["SpeculativeMethod"], aliases)))
    cls = next(
        n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SpeculativeConfig"
    )
    fields = [
        n.target.id
        for n in cls.body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    ]
    src = open(path).read()
    tp_msg = None
    if "'tensor_parallel_size' is not a valid argument in the" in src:
        tp_msg = (
            "'tensor_parallel_size' is not a valid argument in the speculative_config "
            "(SpeculativeConfig._verify_args)"
        )
    return fields, methods, tp_msg


def main() -> None:
    path, version, source = sys.argv[1:4]
    fields, methods, tp_msg = extract(path)
    rejected = {name: DERIVED_WHY for name in DERIVED if name in fields}
    if tp_msg:
        rejected["tensor_parallel_size"] = tp_msg
    keys = sorted(f for f in fields if f not in rejected)
    entry = {
        "keys": keys,
        "methods": methods,
        "rejected_keys": dict(sorted(rejected.items())),
        "source": source,
    }
    print(json.dumps({version: entry}, indent=1))


if __name__ == "__main__":
    main()
