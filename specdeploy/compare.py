"""Measure arms on one host, one server at a time on the same accelerator (deploys/compare.py,
deploys/tune.py, and the speculation gate of deploys/serve.py).

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
import os
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.operations import python

from . import datasets, report
from .bench import bench_args, reports_root
from .checks import host_config
from .config import DATA_DEFAULTS, ServeConfig, Workload
from .on_host import read_text, sh, write_text
from .render import RenderedUnit, measure_unit_name, render_unit, unit_name
from .steps import dataset, health, lock, weights
from .steps.health import base_url, request
from .steps.smoke import bench
from .timestamps import utc_iso, utc_stamp
from .tune_flow import PredictPlan

# --- settings: host data, overridden by the environment -------------------------------------------


def setting(cfg: ServeConfig, name: str):
    """A measurement setting: SPECDEPLOY_<NAME> from the environment, else the host's config."""
    env = os.environ.get(f"SPECDEPLOY_{name.upper()}")
    if env in (None, ""):
        return getattr(cfg, name)
    return getattr(
        ServeConfig.model_validate({**cfg.model_dump(), name: env}), name
    )  # validated like host data


_RUN_IDS: dict[str, str] = {}


def run_id(kind: str) -> str:
    """One id per pyinfra process and kind (every host of the run writes under it); SPECDEPLOY_RUN
    overrides it."""
    if kind not in _RUN_IDS:
        _RUN_IDS[kind] = os.environ.get("SPECDEPLOY_RUN") or f"{kind}-{utc_stamp()}"
    return _RUN_IDS[kind]


def run_dir(kind: str) -> Path:
    return reports_root() / run_id(kind)


# --- arms and the measurement unit ----------------------------------------------------------------


@dataclass(frozen=True)
class Arm:
    label: str  # "baseline", "speculative", "k3", "apc-off", "apc-on"
    speculative: bool
    prefix_caching: bool = False
    speculative_config: dict | None = None  # overrides cfg.speculative_config (tune)
    workload: Workload | None = None  # None: cfg.workload
    bench_extra: tuple[str, ...] = field(default=())

    def config(self, cfg: ServeConfig) -> ServeConfig:
        if self.speculative_config is None:
            return cfg
        return cfg.model_copy(update={"speculative_config": self.speculative_config})


def k_arm(cfg: ServeConfig, k: int) -> Arm:
    """The speculative arm with num_speculative_tokens = k (tune)."""
    return Arm(
        f"k{k}", True, speculative_config={**cfg.speculative_config, "num_speculative_tokens": k}
    )


def production_units(cfg: ServeConfig) -> list[str]:
    return [unit_name(cfg, "speculative"), unit_name(cfg, "baseline")]


def measure_unit(cfg: ServeConfig, arm: Arm) -> RenderedUnit:
    """The measurement instance for `arm`, rendered from the production template."""
    return render_unit(
        arm.config(cfg),
        "speculative" if arm.speculative else "baseline",
        prefix_caching=arm.prefix_caching,
        measurement_arm=arm.label,
    )


def _install_unit_file(cfg: ServeConfig, name: str, text: str) -> None:
    write_text(cfg.unit_path(name), text, mode="644")
    sh("systemctl daemon-reload")


def _stop(units: list[str]) -> None:
    sh(
        "; ".join(f"systemctl stop {shlex.quote(u)} 2>/dev/null" for u in units) + "; true",
        check=False,
    )


def start_fresh(
    cfg: ServeConfig, unit: RenderedUnit, *, speculative: bool, install: bool = True
) -> dict:
    """Stop every server on the port, (re)write the unit, start it, wait until healthy."""
    _stop([measure_unit_name(cfg), *production_units(cfg)])
    if install:
        _install_unit_file(cfg, unit.name, unit.text)
    name = shlex.quote(unit.name)
    sh(f"systemctl reset-failed {name} 2>/dev/null; systemctl start {name}")
    return health.wait_healthy(cfg, unit.name, speculative=speculative)


def warm_up(cfg: ServeConfig, workload: Workload) -> None:
    """One discarded completion of the workload's output length (the health check already sent
    one)."""
    request(
        cfg,
        "/v1/completions",
        data={
            "model": cfg.effective_served_name,
            "prompt": "warm up " * 8,
            "max_tokens": workload.output_len,
            "temperature": 0,
            "ignore_eos": True,
        },
        timeout=300,
    )


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
) -> dict:
    """A fresh server for `arm`, a discarded warm-up completion, one benchmark. same_server: one
    more benchmark on the server the previous sample started for this same arm (tune_flow.py's
    shared visits, which check the prefix-cache counters)."""
    unit = measure_unit(cfg, arm)
    t0 = time.monotonic()
    workload = arm.workload or cfg.workload
    checked = {}
    if not same_server:
        checked = start_fresh(cfg, unit, speculative=arm.speculative)
        warm_up(cfg, workload)
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
    result = bench(
        cfg,
        tokenizer=tokenizer,
        name=f"{index:02d}-{arm.label}",
        local=out_dir / f"{index:02d}-{arm.label}.json",
        workload=workload,
        extra=tuple(arm.bench_extra) + tuple(extra),
        meta=meta,
    )
    result["specdeploy"]["sample_seconds"] = round(time.monotonic() - t0, 1)
    (out_dir / f"{index:02d}-{arm.label}.json").write_text(json.dumps(result, indent=1))
    return result


def deployed_unit(cfg: ServeConfig) -> tuple[str, str]:
    """(unit name, role) the host was deployed with, from its deployment record."""
    text = read_text(cfg.record_path, missing_ok=True)
    if not text:
        raise RuntimeError(
            f"{host.name}: no deployment record at {cfg.record_path}; run deploys/serve.py first"
        )
    rec = json.loads(text)
    return rec["unit"]["name"], rec.get("role", "speculative")


def restore(cfg: ServeConfig, unit: str, role: str) -> dict:
    """Remove the measurement unit and bring the deployed unit back, healthy."""
    measure = measure_unit_name(cfg)
    _stop([measure])
    sh(
        f"rm -f {shlex.quote(cfg.unit_path(measure))} && systemctl daemon-reload && "
        f"systemctl reset-failed {shlex.quote(measure)} 2>/dev/null; true"
    )
    sh(f"systemctl start {shlex.quote(unit)}")
    checked = health.wait_healthy(cfg, unit, speculative=role == "speculative")
    logger.info(f"{host.print_prefix}back on {unit}, healthy")
    return checked


def measure_plan(
    cfg: ServeConfig, plan: list[tuple[Arm, bool]], *, out_dir: Path, conditions: dict
) -> list[dict]:
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
        restored = restore(cfg, prod_unit, prod_role)
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


# --- plans ----------------------------------------------------------------------------------------


def apc_workload(cfg: ServeConfig) -> tuple[Workload, tuple[str, ...], dict]:
    """Requests that share long prefixes (vLLM bench's prefix_repetition dataset), sized to fit."""
    w = cfg.workload
    prefix = max(64, min(512, (cfg.effective_max_model_len - w.output_len) // 2))
    suffix = max(1, min(w.prompt_len, cfg.effective_max_model_len - w.output_len - prefix))
    groups = max(1, w.num_prompts // 4)
    workload = w.model_copy(
        update={"dataset": "prefix_repetition", "dataset_path": None, "prompt_len": prefix + suffix}
    )
    extra = (
        "--prefix-repetition-prefix-len",
        str(prefix),
        "--prefix-repetition-suffix-len",
        str(suffix),
        "--prefix-repetition-num-prefixes",
        str(groups),
        "--prefix-repetition-output-len",
        str(w.output_len),
    )
    return (
        workload,
        extra,
        {
            "prefix_len": prefix,
            "suffix_len": suffix,
            "num_prefixes": groups,
            "output_len": w.output_len,
            "num_prompts": w.num_prompts,
        },
    )


def compare_plan(
    cfg: ServeConfig, *, repeats: int, warmup_runs: int, apc_profile: bool, apc_repeats: int
) -> list[tuple[Arm, bool]]:
    spec, base = Arm("speculative", True), Arm("baseline", False)
    plan: list[tuple[Arm, bool]] = [((spec, base)[i % 2], True) for i in range(warmup_runs)]
    for _ in range(repeats):  # A B A B ...
        plan += [(base, False), (spec, False)]
    if apc_profile:
        workload, extra, _ = apc_workload(cfg)
        off = Arm("apc-off", False, prefix_caching=False, workload=workload, bench_extra=extra)
        on = Arm("apc-on", False, prefix_caching=True, workload=workload, bench_extra=extra)
        for _ in range(apc_repeats):
            plan += [(off, False), (on, False)]
    return plan


def tune_plan(
    cfg: ServeConfig, *, ks: list[int], repeats: int, warmup_runs: int
) -> list[tuple[Arm, bool]]:
    arms = [k_arm(cfg, k) for k in ks]
    plan: list[tuple[Arm, bool]] = [(arms[i % len(arms)], True) for i in range(warmup_runs)]
    for r in range(repeats):  # rotate the order each round so no k always runs first
        shift = r % len(arms)
        plan += [(a, False) for a in arms[shift:] + arms[:shift]]
    return plan


def conditions(cfg: ServeConfig, **extra) -> dict:
    w = cfg.workload
    return {
        "workload": w.model_dump(),
        "request_set": datasets.describe(w.dataset_path, w.dataset),  # sha256, rows
        "bench_args": bench_args(
            cfg,
            base_url=base_url(cfg),
            tokenizer="<target snapshot>",
            result_dir="<dir>",
            result_filename="<name>.json",
        ),
        "baseline_argv": render_unit(cfg, "baseline", prefix_caching=False).argv,
        "speculative_argv": render_unit(cfg, "speculative", prefix_caching=False).argv,
        "speculative_config": cfg.speculative_config,
        "memory": dict([cfg.memory_mechanism]),
        "limits": {
            "max_model_len": cfg.effective_max_model_len,
            "max_num_seqs": cfg.effective_max_num_seqs,
            "max_num_batched_tokens": cfg.effective_max_num_batched_tokens,
        },
        "vllm": {"package": cfg.vllm_package, "version": cfg.vllm_version},
        "prefix_caching": "off for every speculative/baseline/k measurement instance",
        "restart_between_samples": True,
        "warm_up": "one discarded completion per server instance, plus the discarded warm-up runs",
        **extra,
    }


# --- the deploys ----------------------------------------------------------------------------------

_REPORTED_HOSTS: dict[str, int] = {}  # report dir -> hosts finished when the report was written


def _measure(cfg: ServeConfig, *, kind: str, plan: list[tuple[Arm, bool]], cond: dict) -> None:
    out = run_dir(kind) / "raw" / host.name
    try:
        measure_plan(cfg, plan, out_dir=out, conditions={"kind": kind, **cond})
    except Exception:
        lock.release_now(cfg)  # the host is back on its deployed unit (measure_plan's finally)
        raise


def _write_report(kind: str) -> None:
    """Runs on every host after all hosts measured; the first one writes the fleet report."""
    directory = run_dir(kind)
    finished = len(list((directory / "raw").glob("*/conditions.json")))
    if _REPORTED_HOSTS.get(str(directory)) == finished:
        return
    _REPORTED_HOSTS[str(directory)] = finished
    summary = report.write(directory, kind)
    logger.info(
        f"{host.print_prefix}report: {directory}/summary.md ({', '.join(summary['charts'])})"
    )
    if kind == "tune":
        for name, h in summary["hosts"].items():
            c = h["choice"]
            print(
                f"{name}: recommended num_speculative_tokens = {c['recommended_k']} (best "
                f"{c['best_k']}, currently {h['current_k']})"
            )
            print(f"  {h['host_data_change'] or 'no change needed'}")


def _compare_plan(cfg: ServeConfig) -> tuple[list[tuple[Arm, bool]], dict, str]:
    repeats = setting(cfg, "compare_repeats")
    warmup_runs = setting(cfg, "compare_warmup_runs")
    apc = setting(cfg, "compare_apc_profile")
    apc_repeats = setting(cfg, "compare_apc_repeats")
    plan = compare_plan(
        cfg, repeats=repeats, warmup_runs=warmup_runs, apc_profile=apc, apc_repeats=apc_repeats
    )
    cond = conditions(
        cfg,
        repeats=repeats,
        warmup_runs=warmup_runs,
        order="warm-up, then " + " ".join(a.label for a, w in plan if not w),
        apc_profile=apc_workload(cfg)[2] if apc else None,
    )
    return plan, cond, f"A/B ({repeats} runs per arm, {warmup_runs} warm-up, APC profile {apc})"


def _tune_plan(cfg: ServeConfig) -> tuple[list[tuple[Arm, bool]], dict, str]:
    ks = setting(cfg, "tune_k")
    repeats = setting(cfg, "tune_repeats")
    warmup_runs = setting(cfg, "tune_warmup_runs")
    if setting(cfg, "tune_method") == "predict":  # the adaptive default: tune_flow.py
        plan = PredictPlan(
            cfg,
            tuple(ks),
            repeats,
            warmup_runs,
            setting(cfg, "tune_share_server"),
            out_dir=run_dir("tune") / "raw" / host.name,
            arm_for=lambda k: k_arm(cfg, k) if k else Arm("baseline", False),
        )
        cond = conditions(cfg, ks=ks, repeats=repeats, warmup_runs=warmup_runs, **plan.conditions())
        return plan, cond, plan.describe()
    plan = tune_plan(cfg, ks=ks, repeats=repeats, warmup_runs=warmup_runs)
    cond = conditions(
        cfg,
        ks=ks,
        repeats=repeats,
        warmup_runs=warmup_runs,
        tune_method="sweep",
        order="warm-up, then " + " ".join(a.label for a, w in plan if not w),
    )
    return plan, cond, f"Sweep k over {ks} ({repeats} runs each, {warmup_runs} warm-up)"


MEASUREMENTS = {
    "compare": ("specdeploy: baseline vs speculative A/B", _compare_plan),
    "tune": ("specdeploy: num_speculative_tokens sweep", _tune_plan),
}


def measurement_deploy(kind: str):
    """deploys/compare.py and deploys/tune.py: measure every host under the deploy lock, then the
    fleet report."""
    title, make_plan = MEASUREMENTS[kind]

    @deploy(title, data_defaults=DATA_DEFAULTS)
    def _measure_fleet():
        cfg = host_config()
        plan, cond, what = make_plan(cfg)
        lock.acquire(name="Take the host's deploy lock", cfg=cfg)  # no serve deploy meanwhile
        dataset.ship_request_set(cfg)  # the request set every arm replays
        python.call(name=what, function=_measure, cfg=cfg, kind=kind, plan=plan, cond=cond)
        lock.release(name="Release the host's deploy lock", cfg=cfg)
        python.call(name=f"Report {run_dir(kind)}", function=_write_report, kind=kind)

    _measure_fleet()
