"""What load-aware speculation refuses before any host is touched (issue 39): load levels the
server cannot hold, and a per-batch-size schedule vLLM would refuse, change or drop silently."""

from __future__ import annotations

from specdeploy.config.problems import Problem
from specdeploy.config.schema import ServeConfig
from specdeploy.decide.load_rule import SCHEDULE_KEY, schedule_problems
from specdeploy.render.argv import EngineFlags


def check_load(host: str, cfg: ServeConfig, flags: EngineFlags) -> list[Problem]:
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
    # the deployed schedule's form is the pinned release's to judge (checks/release.py, from its
    # table); compare_schedule is only measured, at its largest k
    schedules = {"compare_schedule": cfg.compare_schedule}
    if SCHEDULE_KEY in cfg.speculative_config:
        schedules[f"speculative_config.{SCHEDULE_KEY}"] = None
    dp = flags.dp
    for field, schedule in schedules.items():
        if field == "compare_schedule" and schedule is None:
            continue
        for what in schedule_problems(schedule, None) if schedule is not None else ():
            problems.append(
                Problem(host, field, what, "write [[1, end, k], [end + 1, ..., k], ...] in order")
            )
        if dp > 1:
            problems.append(
                Problem(
                    host,
                    field,
                    f"vLLM drops the schedule silently with data parallelism > 1 "
                    f"(--data-parallel-size {dp}) and runs num_speculative_tokens at every batch "
                    "size",
                    f"remove {SCHEDULE_KEY} (set the fixed k tune recommends), or run without "
                    "data parallelism",
                )
            )
    return problems
