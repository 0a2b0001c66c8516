"""Step 7: a short `vllm bench serve` from the host's own install against its local server."""

from __future__ import annotations

from pyinfra import host, logger

from specdeploy.config.record import BenchResult
from specdeploy.config.schema import ServeConfig
from specdeploy.config.timestamps import utc_stamp
from specdeploy.host.bench import PendingBench
from specdeploy.report.bench_summary import format_summary
from specdeploy.report.paths import host_reports_dir


def smoke_bench(cfg: ServeConfig, tokenizer_path: str) -> PendingBench:
    """The smoke's benchmark, to be started as the server starts (bench.PendingBench)."""
    # an instance of a whole box names itself: its results sit beside the others' in one folder
    own = f"{cfg.instance_name}-" if cfg.instance_name else ""
    return PendingBench(cfg, tokenizer=tokenizer_path, name=f"smoke-{own}{utc_stamp()}")


def smoke(cfg: ServeConfig, bench: PendingBench) -> BenchResult:
    """Run the started smoke benchmark against the healthy server; print its summary."""
    result = bench.run(local=host_reports_dir(host.name) / f"{bench.name}.json")
    logger.info(format_summary(f"{host.name} {cfg.instance_name or ''}".strip(), result))
    return result
