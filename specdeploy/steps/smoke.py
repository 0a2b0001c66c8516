"""Step 7: a short `vllm bench serve` from the host's own install against its local server."""

from __future__ import annotations

from pyinfra import host, logger

from ..bench import format_summary, run_bench
from ..config import ServeConfig
from ..record import BenchResult
from ..reports import host_reports_dir
from ..timestamps import utc_stamp


def smoke(cfg: ServeConfig, tokenizer_path: str) -> BenchResult:
    name = f"smoke-{utc_stamp()}"
    result = run_bench(
        cfg, tokenizer=tokenizer_path, name=name, local=host_reports_dir(host.name) / f"{name}.json"
    )
    logger.info(format_summary(host.name, result))
    return result
