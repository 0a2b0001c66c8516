"""The sampling harness: measure arms on one host, one server at a time on the same accelerator
(deploys/compare.py and deploys/tune.py).

Rules every measurement here follows:
* one measurement unit, `<service>-measure.service`, rewritten for each sample from render_unit(),
  so the arms differ only in what the arm changes (--speculative-config, or num_speculative_tokens,
  or prefix caching in the separate APC profile); memory, batching and model flags are identical;
* the production units are stopped while measuring, and the unit the host was deployed with is
  started again and health-checked at the end, also when a measurement fails;
* before production stops, the host gets a watchdog (watchdog.arm_watchdog: a transient systemd
  timer) that restores the deployed unit by itself if the control node goes quiet; it is renewed
  with the deploy lock's lease before every sample and removed once the deployed unit is back;
* every sample is a fresh server (stop, start, /health, a discarded warm-up completion), then one
  `vllm bench serve` with bench_args(): the same dataset, seed, rate, concurrency and prompt count;
  how one sample runs, and the loop over a plan's samples, are sampling/'s, the gate's too (a
  visit's later samples on its server: same_server);
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
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyinfra import host

from specdeploy.config.record import BenchResult, service_record
from specdeploy.config.schema import ServeConfig, Workload
from specdeploy.config.timestamps import utc_iso
from specdeploy.host import server, watchdog
from specdeploy.host.bench import bench_time_limit
from specdeploy.host.on_host import read_text
from specdeploy.measure.arms import Plan, measure_unit
from specdeploy.sampling.runs import run_samples
from specdeploy.sampling.sampler import Sample, Sampler
from specdeploy.steps import lock, weights
from specdeploy.steps import unit as steps_unit


@dataclass(frozen=True)
class Samples:
    """A plan's steps (Step, or the predict flow's SharedStep) as the samples runs.run_samples runs:
    each a fresh server for its arm (or, same_server, one more benchmark on the server the previous
    sample started for this same arm: tune_flow.py's shared visits, and a visit's higher load
    levels), the deploy lock and the watchdog renewed first for as long as that may take
    (watchdog_seconds). Lazy: a sequential plan reads the samples written so far."""

    cfg: ServeConfig
    steps: Plan

    def __iter__(self) -> Iterator[Sample]:
        cfg = self.cfg
        boot = steps_unit.cuda_boot(cfg)  # the host's CudaBoot fact: the renderer reads none
        for i, (arm, warm, *same_server) in enumerate(self.steps):
            unit = measure_unit(cfg, arm, boot)
            workload = arm.workload or cfg.workload
            same = bool(same_server and same_server[0])
            yield Sample(
                unit,
                f"{i:02d}-{arm.label}",
                workload,
                {
                    "arm": arm.label,
                    "index": i,
                    "warmup": warm,
                    "speculative": arm.speculative,
                    "prefix_caching": arm.prefix_caching,
                    "unit_argv": unit.argv,
                    "speculative_config": arm.config(cfg).speculative_config
                    if arm.speculative
                    else None,
                    "fresh_server": not same,
                    "seed": workload.seed,
                },
                renew_s=watchdog_seconds(cfg, workload),
                same_server=same,
                extra=tuple(arm.bench_extra),
                says=f"sample {i:02d} {arm.label}{' (warm-up, discarded)' if warm else ''}",
                timed=True,
            )


def deployed_unit(cfg: ServeConfig) -> tuple[str, str]:
    """(unit name, role) the host was deployed with, from its deployment record."""
    record = service_record(cfg, lambda path: read_text(path, missing_ok=True), host=host.name)
    if record is None:
        raise RuntimeError(
            f"{host.name}: no deployment record at {cfg.record_path}; run deploys/serve.py first"
        )
    return record.unit.name, record.role


WATCHDOG_GRACE_S = 60  # beyond what the next step may take: connection, unit file, bookkeeping


def watchdog_seconds(cfg: ServeConfig, workload: Workload | None = None) -> int:
    """How long a measured host waits for the control node before restoring production itself:
    `measure_watchdog_s`, else what one sample may take (its server start, warm-up and benchmark,
    each at its own time limit); with no workload, what the restore may take."""
    if cfg.measure_watchdog_s:
        return cfg.measure_watchdog_s
    if workload is None:
        return cfg.health_timeout_s + WATCHDOG_GRACE_S
    sample_s = server.WARM_UP_TIMEOUT_S + bench_time_limit(cfg, workload)
    return cfg.health_timeout_s + sample_s + WATCHDOG_GRACE_S


def measure_plan(
    cfg: ServeConfig,
    plan: Plan,
    *,
    out_dir: Path,
    conditions: Mapping[str, Any],
    readmit: tuple[str, str] | None = None,
) -> list[BenchResult]:
    """Run `plan` (Steps, or the predict flow's SharedSteps, in order) on this host, then restore
    the deployed unit (always). `conditions`: conditions.json's object (plans.Conditions, with the
    kind and, on a whole box, the measured instance), to which the run's own keys are added."""
    snaps = weights.snapshots(cfg)
    missing = [role for role, snap in snaps.items() if not snap]
    if missing:  # vLLM runs offline here: say so before the production units are stopped
        raise RuntimeError(
            f"{host.name}: {' and '.join(missing)} weights are not on the host; run "
            "deploys/serve.py first"
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
    samples = Samples(cfg, plan)
    # the watchdog is armed before the first sample stops production, renewed before every other
    sampler = Sampler(
        cfg,
        tokenizer=tokenizer,
        renew_lease=lock.renewal(cfg),
        restores=prod_unit,
        readmit=readmit,
    )
    try:
        results = [ran.result for ran in run_samples(sampler, samples, out_dir)]
    finally:
        # for the restore itself
        watchdog.arm_watchdog(cfg, prod_unit, watchdog_seconds(cfg), readmit)
        try:
            restored = server.restore_deployed(cfg, prod_unit, prod_role)
        finally:
            watchdog.disarm_watchdog(cfg)
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
