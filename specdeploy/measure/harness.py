"""The sampling harness: measure arms on one host, one server at a time on the same accelerator
(deploys/compare.py and deploys/tune.py).

Rules every measurement here follows:
* one measurement unit, `<service>-measure.service`, rewritten for each sample from render_unit(),
  so the arms differ only in what the arm changes (--speculative-config, or num_speculative_tokens,
  or prefix caching in the separate APC profile); memory, batching and model flags are identical;
* the production units are stopped while measuring, and the unit the host was deployed with is
  started again and health-checked at the end, also when a measurement fails;
* every sample is a fresh server (stop, start, /health, a discarded warm-up completion), then one
  `vllm bench serve` with bench_args(): the same dataset, seed, rate, concurrency and prompt count;
* automatic prefix caching is OFF in every speculative/baseline/k measurement; the APC profile is
  the only place it is on;
* the server's spec-decode counters are read from /metrics with prometheus_client before and after
  each benchmark (after the warm-up), so the acceptance figures cover exactly the benchmark's
  requests.
Raw results land in reports/<run>/raw/<host>/NN-<arm>.json; specdeploy.report builds the summary
from those files only.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from pyinfra import host, logger

from .. import server
from ..bench import run_bench
from ..config import ServeConfig
from ..on_host import read_text
from ..record import BenchResult, service_record
from ..steps import weights
from ..timestamps import utc_iso
from .arms import Arm, measure_unit


def sample(
    cfg: ServeConfig,
    arm: Arm,
    *,
    index: int,
    tokenizer: str,
    out_dir: Path,
    warmup: bool = False,
    extra: tuple[str, ...] = (),
    same_server: bool = False,
) -> BenchResult:
    """A fresh server for `arm`, a discarded warm-up completion, one benchmark. same_server: one
    more benchmark on the server the previous sample started for this same arm (tune_flow.py's
    shared visits, which check the prefix-cache counters)."""
    unit = measure_unit(cfg, arm)
    t0 = time.monotonic()
    workload = arm.workload or cfg.workload
    checked = {}
    if not same_server:
        checked = server.start_fresh(cfg, unit, speculative=arm.speculative)
        server.warm_up(cfg, workload)
    logger.info(
        f"{host.print_prefix}sample {index:02d} "
        f"{arm.label}{' (warm-up, discarded)' if warmup else ''}"
    )
    meta = {
        "arm": arm.label,
        "index": index,
        "warmup": warmup,
        "speculative": arm.speculative,
        "prefix_caching": arm.prefix_caching,
        "unit_argv": unit.argv,
        "speculative_config": arm.config(cfg).speculative_config if arm.speculative else None,
        "seconds_to_healthy": checked.get("seconds_to_healthy"),
        "fresh_server": not same_server,
        "seed": workload.seed,
    }
    result = run_bench(
        cfg,
        tokenizer=tokenizer,
        name=f"{index:02d}-{arm.label}",
        local=out_dir / f"{index:02d}-{arm.label}.json",
        workload=workload,
        extra=tuple(arm.bench_extra) + tuple(extra),
        meta=meta,
    )
    result.run.sample_seconds = round(time.monotonic() - t0, 1)
    (out_dir / f"{index:02d}-{arm.label}.json").write_text(result.to_json())
    return result


def deployed_unit(cfg: ServeConfig) -> tuple[str, str]:
    """(unit name, role) the host was deployed with, from its deployment record."""
    record = service_record(cfg, lambda path: read_text(path, missing_ok=True), host=host.name)
    if record is None:
        raise RuntimeError(
            f"{host.name}: no deployment record at {cfg.record_path}; run deploys/serve.py first"
        )
    return record.unit.name, record.role


def measure_plan(
    cfg: ServeConfig, plan: list[tuple[Arm, bool]], *, out_dir: Path, conditions: dict
) -> list[BenchResult]:
    """Run `plan` ([(arm, is_warmup)], in order) on this host, then restore the deployed unit
    (always)."""
    snaps = weights.snapshots(cfg)
    if not snaps.get("target"):
        raise RuntimeError(
            f"{host.name}: target weights are not on the host; run deploys/serve.py first"
        )
    tokenizer = snaps["target"]["path"]
    prod_unit, prod_role = deployed_unit(cfg)
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.glob(
        "*.json"
    ):  # a reused run id: no sample of an earlier run may be counted
        stale.unlink()
    started = time.time()
    (out_dir / "conditions.json").write_text(
        json.dumps(
            {
                **conditions,
                "host": host.name,
                "restored_unit": prod_unit,
                "restored_role": prod_role,
                "started_at": utc_iso(started),
            },
            indent=1,
            default=str,
        )
    )
    results = []
    try:
        for i, (arm, warm, *same_server) in enumerate(plan):  # (arm, warm-up[, same server])
            results.append(
                sample(
                    cfg,
                    arm,
                    index=i,
                    tokenizer=tokenizer,
                    out_dir=out_dir,
                    warmup=warm,
                    same_server=bool(same_server and same_server[0]),
                )
            )
    finally:
        restored = server.restore_deployed(cfg, prod_unit, prod_role)
    cond = json.loads((out_dir / "conditions.json").read_text())
    cond.update(
        {
            "finished_at": utc_iso(),
            "seconds": round(time.time() - started, 1),
            "restored_health": restored,
        }
    )
    (out_dir / "conditions.json").write_text(json.dumps(cond, indent=1, default=str))
    return results
