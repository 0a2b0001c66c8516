"""Checks of the user's request set (workload.dataset_path, a file on the control node, read by
datasets.py): readable, usable rows, enough distinct prompts, and every request within
max_model_len counted in the target's tokens."""

from __future__ import annotations

import functools

from specdeploy.config import datasets
from specdeploy.config.problems import Problem
from specdeploy.config.schema import ServeConfig


def check_request_set(host: str, cfg: ServeConfig) -> list[Problem]:
    w = cfg.workload
    field = "workload.dataset_path"
    if w.dataset not in datasets.SHIPPED:
        if w.dataset_path:
            return [
                Problem(
                    host,
                    field,
                    f"set, but dataset {w.dataset!r} generates its requests and ignores it",
                    f"remove it, or set workload.dataset to one of {', '.join(datasets.SHIPPED)}",
                )
            ]
        return []
    if not w.dataset_path:
        return [
            Problem(
                host,
                field,
                f"missing: dataset {w.dataset!r} replays a request file",
                "set it to the file's path on this control node (the deploy ships it to each host)",
            )
        ]
    path = w.dataset_path
    try:
        request_set = datasets.load(path, w.dataset)
    except datasets.RequestSetError as error:
        return [
            Problem(
                host,
                field,
                f"{path}: {error}",
                "point it at a readable file on this control node (the deploy ships it to each "
                "host)",
            )
        ]
    problems = []
    if request_set.bad_rows:
        shown = "; ".join(f"line {line}: {what}" for line, what in request_set.bad_rows[:3])
        more = f" (+{len(request_set.bad_rows) - 3} more)" if len(request_set.bad_rows) > 3 else ""
        problems.append(
            Problem(
                host,
                field,
                f"{path}: {len(request_set.bad_rows)} unusable rows: {shown}{more}",
                'fix or remove them: each row is a JSON object with a "prompt" string and an '
                'optional positive integer "output_tokens"'
                if w.dataset == "custom"
                else "fix or remove them",
            )
        )
    given = sum(row.output_tokens is not None for row in request_set.rows)
    if w.dataset == "custom" and 0 < given < len(request_set.rows):
        problems.append(
            Problem(
                host,
                field,
                f"{path}: {given} of {len(request_set.rows)} rows give output_tokens",
                "give every row output_tokens (each request then produces its own length) or none "
                "(every request produces workload.output_len tokens)",
            )
        )
    usable = request_set.distinct_prompts
    if w.dataset != "sonnet" and usable < w.num_prompts:
        problems.append(
            Problem(
                host,
                field,
                f"{path}: {usable} usable distinct prompts, fewer than workload.num_prompts = "
                f"{w.num_prompts} (repeated prompts would hit the prefix cache and flatter the "
                "measurement)",
                f"add rows, or lower workload.num_prompts to at most {usable}",
            )
        )
    if w.dataset != "sonnet":
        problems += _dataset_lengths(host, cfg, request_set)[0]
    return problems


def _dataset_lengths(
    host: str, cfg: ServeConfig, request_set
) -> tuple[list[Problem], list[Problem]]:
    """(problems, warnings): rows that need more than max_model_len counted in the target's tokens
    are refused; rows that only the byte bound says may not fit (the tokenizer could not be read)
    are a warning, since the bound overstates most prompts several times."""
    limit = cfg.effective_max_model_len
    rows = _rows_over_limit(
        request_set.path, cfg.workload.dataset, request_set.sha256, limit,
        cfg.workload.output_len, (cfg.target_model, cfg.target_revision, cfg.hf_endpoint,
                                  cfg.hf_token),
    )  # fmt: skip
    counted = [r for r in rows if r[2] == "tokens"]
    bounded = [r for r in rows if r[2] != "tokens"]
    field = "workload.dataset_path"

    def listed(found) -> str:
        shown = "; ".join(f"line {row.line}: {needed} {how}" for row, needed, how in found[:3])
        return shown + (f" (+{len(found) - 3} more)" if len(found) > 3 else "")

    problems = [
        Problem(
            host,
            field,
            f"{request_set.path}: {len(counted)} requests need more than max_model_len = {limit} "
            f"(prompt + output): {listed(counted)}",
            "shorten or drop those prompts, lower their output_tokens, or raise max_model_len",
        )
    ] if counted else []  # fmt: skip
    warnings = [
        Problem(
            host,
            field,
            f"{request_set.path}: {len(bounded)} requests may need more than max_model_len = "
            f"{limit} (prompt + output): {listed(bounded)}",
            "make the target's tokenizer.json readable on this control node (hf_endpoint, "
            "hf_token) to count them in tokens; vLLM refuses a request that does not fit",
        )
    ] if bounded else []  # fmt: skip
    return problems, warnings


@functools.lru_cache(maxsize=64)
def _rows_over_limit(
    path: str, dataset: str, sha256: str, limit: int, output_len: int, target: tuple
) -> tuple:
    """datasets.too_long counted in the target's tokens. The same for every host that shares the
    request set (its sha256), the target and the limits, so a fleet tokenizes it once, not once
    per host and check (a 2,000-row set took 1.4 s a host)."""
    model, revision, endpoint, token = target

    def count_tokens(text: str) -> int:
        tokenizer = datasets.target_tokenizer(model, revision, endpoint, token)
        return len(tokenizer.encode(text).ids)

    request_set = datasets.load(path, dataset)
    return tuple(datasets.too_long(request_set, max_model_len=limit, default_output=output_len,
                                   count_tokens=count_tokens))  # fmt: skip


def length_warnings(host: str, cfg: ServeConfig) -> list[Problem]:
    """The request set's rows that only the byte bound flags (see `_dataset_lengths`)."""
    w = cfg.workload
    if w.dataset not in datasets.SHIPPED or w.dataset == "sonnet" or not w.dataset_path:
        return []
    try:
        request_set = datasets.load(w.dataset_path, w.dataset)
    except datasets.RequestSetError:
        return []  # a problem, reported by check_host
    return _dataset_lengths(host, cfg, request_set)[1]
