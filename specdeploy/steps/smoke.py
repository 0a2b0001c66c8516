"""Steps 6-7: the server's health check, and a short `vllm bench serve` from the host's own install
against it, started while the server starts."""

from __future__ import annotations

import time

from pyinfra import host, logger

from specdeploy.config.record import BenchResult
from specdeploy.config.timestamps import utc_stamp
from specdeploy.host import server
from specdeploy.render.units import RenderedUnit
from specdeploy.report.bench_summary import format_summary
from specdeploy.report.paths import host_reports_dir
from specdeploy.sampling.sampler import Sampler


def health_and_smoke(sampler: Sampler, rendered: RenderedUnit) -> tuple[dict, BenchResult, dict]:
    """The restarted server healthy, then a short `vllm bench serve` against it, started as the
    server starts (its imports overlap the start: host/bench.PendingBench). `sampler`: the
    server's benchmarks, as the verify step built it. Returns (the health check, the smoke result,
    how long each took). A speculative server whose spec-decode counters did not grow fails
    here."""
    verify_started = time.monotonic()
    # an instance of a whole box names itself: its results sit beside the others' in one folder
    instance = sampler.instance_name
    name = f"smoke-{instance}-{utc_stamp()}" if instance else f"smoke-{utc_stamp()}"
    speculative = rendered.role == "speculative"
    with sampler.bench(name) as bench:
        checked = sampler.healthy(rendered.name, speculative=speculative)
        result = bench.run(local=host_reports_dir(host.name) / f"{name}.json")
    logger.info(format_summary(f"{host.name} {instance or ''}".strip(), result))
    timings = {
        "server_start_seconds": checked["seconds_to_healthy"],
        "checks_and_smoke_seconds": round(
            time.monotonic() - verify_started - checked["seconds_to_healthy"], 1
        ),
    }
    if speculative and not result.counters.drafts:
        raise server.HealthError(
            f"{host.name}: spec-decode counters did not grow during the smoke benchmark"
        )
    return checked, result, timings
