"""What load-aware speculation refuses before any host is touched (issue 39): load levels the
server cannot hold, and a per-batch-size schedule vLLM would refuse, change or drop silently."""

from __future__ import annotations

from specdeploy.config.problems import Problem
from specdeploy.config.schema import ServeConfig
from specdeploy.decide.load_rule import SCHEDULE_KEY, schedule_problems
from specdeploy.render.argv import engine_flags


def check_load(host: str, cfg: ServeConfig) -> list[Problem]:
    """Every load level within max_num_seqs; the schedule under vLLM's rules, never with data
    parallelism > 1 (vLLM drops it then with one warning and runs the fixed k)."""
    problems = []
    limit = cfg.effective_max_num_seqs
    for i, level in enumerate(cfg.workload.load_levels or []):
        if level.concurrency > limit:
            problems.append(
                Problem(
                    host,
                    f"workload.load_levels[{i}].concurrency",
                    f"{level.concurrency} is above max_num_seqs {limit}: the server never runs a "
                    "batch that large, so that level would measure a queue",
                    f"lower it to at most {limit}, or raise max_num_seqs",
                )
            )
    schedule = cfg.speculative_config.get(SCHEDULE_KEY)
    if schedule is None:
        return problems
    field = f"speculative_config.{SCHEDULE_KEY}"
    k = cfg.speculative_config.get("num_speculative_tokens")
    for what in schedule_problems(schedule, k if isinstance(k, int) else None):
        problems.append(
            Problem(host, field, what, "write [[1, end, k], [end + 1, ..., k], ...] in order")
        )
    dp = engine_flags(cfg).dp
    if dp > 1:
        problems.append(
            Problem(
                host,
                field,
                f"vLLM drops the schedule silently with data parallelism > 1 (--data-parallel-size"
                f" {dp}) and runs num_speculative_tokens at every batch size",
                f"remove {SCHEDULE_KEY} (set the fixed k tune recommends), or run without data "
                "parallelism",
            )
        )
    return problems
