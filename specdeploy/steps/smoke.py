"""Steps 6-7: the server's health check, and a short `vllm bench serve` from the host's own install
against it, started while the server starts."""

from __future__ import annotations

import contextlib
import time

from pyinfra import host, logger

from specdeploy.config.record import BenchResult
from specdeploy.config.schema import ServeConfig
from specdeploy.config.timestamps import utc_stamp
from specdeploy.host import server
from specdeploy.host.bench import PendingBench
from specdeploy.render.units import RenderedUnit
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


def health_and_smoke(
    cfg: ServeConfig, rendered: RenderedUnit, tokenizer_path: str, run_smoke: bool = True
) -> tuple[dict, BenchResult | None, dict]:
    """The restarted server healthy, then its smoke benchmark (whose imports run while the server
    starts). Returns (the health check, the smoke result or None, how long each took). A
    speculative server whose spec-decode counters did not grow fails here."""
    verify_started = time.monotonic()
    bench = smoke_bench(cfg, tokenizer_path) if run_smoke else None
    with bench or contextlib.nullcontext():
        speculative = rendered.role == "speculative"
        checked = server.wait_healthy(cfg, rendered.name, speculative=speculative)
        result = smoke(cfg, bench) if bench else None
    timings = {
        "server_start_seconds": checked["seconds_to_healthy"],
        "checks_and_smoke_seconds": round(
            time.monotonic() - verify_started - checked["seconds_to_healthy"], 1
        ),
    }
    if result is not None and speculative and not result.counters.drafts:
        raise server.HealthError(
            f"{host.name}: spec-decode counters did not grow during the smoke benchmark"
        )
    return checked, result, timings
