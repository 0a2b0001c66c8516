"""Measure arms on one host, one server at a time on the same accelerator (deploys/compare.py,
deploys/tune.py, and the speculation gate of deploys/serve.py).

Rules every measurement here follows:
* one measurement unit, `<service>-measure.service`, rewritten for each sample from render_unit(), so
  the arms differ only in what the arm changes (--speculative-config, or num_speculative_tokens, or
  prefix caching in the separate APC profile); memory, batching and model flags are identical;
* the production units are stopped while measuring, and the unit the host was deployed with is started
  again and health-checked at the end, also when a measurement fails;
* every sample is a fresh server (stop, start, /health, a discarded warm-up completion), then one
  `vllm bench serve` with bench_args(): the same dataset, seed, rate, concurrency and prompt count;
* automatic prefix caching is OFF in every speculative/baseline/k measurement; the APC profile is
  the only place it is on;
* the server's spec-decode counters are read from /metrics with prometheus_client before and after
  each benchmark (after the warm-up), so the acceptance figures cover exactly the benchmark's requests.
Raw results land in reports/<run>/raw/<host>/NN-<arm>.json; specdeploy.report builds the summary
from those files only.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import time
from dataclasses import dataclass, field
from io import StringIO
from pathlib import Path

from pyinfra import host, logger

from . import datasets
from .bench import bench_args
from .config import ServeConfig, Workload
from .render import RenderedUnit, render_unit, unit_name
from .steps import health, record, weights
from .steps.health import _curl, base_url
from .steps.remote import run
from .steps.smoke import bench
from .tuning import gate_decision, per_request_tpot_ms

UNIT_DIR = "/etc/systemd/system"


# --- settings: host data, overridden by the environment ---------------------------------------------


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
        _RUN_IDS[kind] = (
            os.environ.get("SPECDEPLOY_RUN") or f"{kind}-{time.strftime('%Y%m%dT%H%M%S')}"
        )
    return _RUN_IDS[kind]


def run_dir(kind: str) -> Path:
    return Path(os.environ.get("SPECDEPLOY_REPORTS", "reports")) / run_id(kind)


# --- arms and the measurement unit ------------------------------------------------------------------


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


def measure_unit_name(cfg: ServeConfig) -> str:
    return f"{cfg.service_name}-measure.service"


def production_units(cfg: ServeConfig) -> list[str]:
    return [unit_name(cfg, "speculative"), unit_name(cfg, "baseline")]


def measure_unit(cfg: ServeConfig, arm: Arm) -> RenderedUnit:
    """The production unit of the arm's role, rendered by render_unit() with the arm's prefix caching,
    renamed, conflicting with both production units, and never enabled."""
    base = render_unit(
        arm.config(cfg),
        "speculative" if arm.speculative else "baseline",
        prefix_caching=arm.prefix_caching,
    )
    text = re.sub(
        r"^Conflicts=.*$", "Conflicts=" + " ".join(production_units(cfg)), base.text, flags=re.M
    )
    text = re.sub(
        r"^Description=.*$",
        f"Description=specdeploy measurement instance ({arm.label})",
        text,
        flags=re.M,
    )
    text = re.sub(r"\n\[Install\]\n.*\Z", "\n", text, flags=re.S)
    text = (
        f"# specdeploy measurement instance, arm {arm.label}: started only by compare/tune/gate\n"
        + text
    )
    return RenderedUnit(role=arm.label, name=measure_unit_name(cfg), argv=base.argv, text=text)


def _install_unit_file(name: str, text: str) -> None:
    path = f"{UNIT_DIR}/{name}"
    host.put_file(StringIO(text), f"{path}.tmp")
    run(f"mv -f {path}.tmp {path} && chmod 644 {path} && systemctl daemon-reload")


def _stop(units: list[str]) -> None:
    run(
        "; ".join(f"systemctl stop {shlex.quote(u)} 2>/dev/null" for u in units) + "; true",
        check=False,
    )


def start_fresh(
    cfg: ServeConfig, unit: RenderedUnit, *, speculative: bool, install: bool = True
) -> dict:
    """Stop every server on the port, (re)write the unit, start it, wait until healthy."""
    _stop([measure_unit_name(cfg), *production_units(cfg)])
    if install:
        _install_unit_file(unit.name, unit.text)
    run(f"systemctl reset-failed {unit.name} 2>/dev/null; systemctl start {unit.name}")
    return health.wait_healthy(cfg, unit.name, speculative=speculative)


def warm_up(cfg: ServeConfig, workload: Workload) -> None:
    """One discarded completion of the workload's output length (the health check already sent one)."""
    _curl(
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
) -> dict:
    """A fresh server for `arm`, a discarded warm-up completion, one benchmark."""
    unit = measure_unit(cfg, arm)
    t0 = time.monotonic()
    checked = start_fresh(cfg, unit, speculative=arm.speculative)
    workload = arm.workload or cfg.workload
    warm_up(cfg, workload)
    logger.info(
        f"{host.print_prefix}sample {index:02d} {arm.label}{' (warm-up, discarded)' if warmup else ''}"
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
    text = run(f"cat {record.record_path(cfg)} 2>/dev/null || true", check=False).strip()
    if not text:
        raise RuntimeError(
            f"{host.name}: no deployment record at {record.record_path(cfg)}; "
            "run deploys/serve.py first"
        )
    rec = json.loads(text)
    return rec["unit"]["name"], rec.get("role", "speculative")


def restore(cfg: ServeConfig, unit: str, role: str) -> dict:
    """Remove the measurement unit and bring the deployed unit back, healthy."""
    _stop([measure_unit_name(cfg)])
    run(
        f"rm -f {UNIT_DIR}/{measure_unit_name(cfg)} && systemctl daemon-reload && systemctl reset-failed "
        f"{measure_unit_name(cfg)} 2>/dev/null; systemctl start {unit}",
        check=False,
    )
    checked = health.wait_healthy(cfg, unit, speculative=role == "speculative")
    logger.info(f"{host.print_prefix}back on {unit}, healthy")
    return checked


def run_plan(
    cfg: ServeConfig, plan: list[tuple[Arm, bool]], *, out_dir: Path, conditions: dict
) -> list[dict]:
    """Run `plan` ([(arm, is_warmup)], in order) on this host, then restore the deployed unit (always)."""
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
                "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            },
            indent=1,
            default=str,
        )
    )
    results = []
    try:
        for i, (arm, warm) in enumerate(plan):
            results.append(
                sample(cfg, arm, index=i, tokenizer=tokenizer, out_dir=out_dir, warmup=warm)
            )
    finally:
        restored = restore(cfg, prod_unit, prod_role)
    cond = json.loads((out_dir / "conditions.json").read_text())
    cond.update(
        {
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "seconds": round(time.time() - started, 1),
            "restored_health": restored,
        }
    )
    (out_dir / "conditions.json").write_text(json.dumps(cond, indent=1, default=str))
    return results


# --- plans ------------------------------------------------------------------------------------------


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
    arms = [
        Arm(
            f"k{k}",
            True,
            speculative_config={**cfg.speculative_config, "num_speculative_tokens": k},
        )
        for k in ks
    ]
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


# --- the speculation gate (deploys/serve.py) --------------------------------------------------------


def speculation_gate(
    cfg: ServeConfig, rendered: RenderedUnit, tokenizer: str
) -> tuple[RenderedUnit, dict | None, dict]:
    """Smoke A/B on the production units: baseline, then speculative, one fresh server and one
    `--save-detailed` benchmark each; per-request TPOT decides (tuning.gate_decision).

    Returns (the unit the host ends on, its health check, the gate record). With on_fail=baseline
    and a failed gate the host ends on the baseline unit, enabled, with the speculative unit disabled."""
    gate_cfg = cfg.speculation_gate
    baseline = render_unit(cfg, "baseline")
    out = Path(os.environ.get("SPECDEPLOY_REPORTS", "reports")) / host.name
    stamp = time.strftime("%Y%m%dT%H%M%S")
    results = {}
    start_fresh(cfg, baseline, speculative=False)
    warm_up(cfg, cfg.workload)
    results["baseline"] = bench(
        cfg,
        tokenizer=tokenizer,
        name=f"gate-{stamp}-baseline",
        local=out / f"gate-{stamp}-baseline.json",
        extra=["--save-detailed"],
        meta={"arm": "baseline", "gate": True},
    )
    checked = start_fresh(cfg, rendered, speculative=True, install=False)
    warm_up(cfg, cfg.workload)
    results["speculative"] = bench(
        cfg,
        tokenizer=tokenizer,
        name=f"gate-{stamp}-speculative",
        local=out / f"gate-{stamp}-speculative.json",
        extra=["--save-detailed"],
        meta={"arm": "speculative", "gate": True},
    )
    decision = gate_decision(
        per_request_tpot_ms(results["speculative"]),
        per_request_tpot_ms(results["baseline"]),
        max_tpot_ratio=gate_cfg.max_tpot_ratio,
        on_fail=gate_cfg.on_fail,
    )
    decision.update(
        {
            "speculative_unit_sha256": rendered.sha256,
            "baseline_unit_sha256": baseline.sha256,
            "files": {arm: str(out / f"gate-{stamp}-{arm}.json") for arm in results},
            "median_tpot_ms_from_bench": {
                arm: r.get("median_tpot_ms") for arm, r in results.items()
            },
            "acceptance": results["speculative"]["specdeploy"]["server_counters"],
            "method": "one fresh server and one benchmark per arm (baseline first), per-request TPOT, "
            "production units (prefix caching as deployed)",
        }
    )
    logger.info(f"{host.print_prefix}speculation gate: {decision['reason']}")
    if decision["passed"] or gate_cfg.on_fail != "baseline":
        return rendered, checked, decision
    # the staged copy deploys/serve.py compares against, so a re-run sees the baseline unit unchanged
    run(
        f"cp -p {UNIT_DIR}/{baseline.name} /etc/specdeploy/staged-{baseline.name} && "
        f"systemctl disable {rendered.name} && systemctl enable {baseline.name}"
    )
    checked = start_fresh(cfg, baseline, speculative=False, install=False)
    return baseline, checked, decision


class GateFailed(RuntimeError):
    pass


def disable_other_role(cfg: ServeConfig, rendered: RenderedUnit) -> None:
    """Only the unit the host serves with is enabled (the other may be left enabled by an earlier
    gate decision)."""
    other = unit_name(cfg, "baseline" if rendered.role == "speculative" else "speculative")
    run(
        f"systemctl is-enabled -q {other} 2>/dev/null && systemctl disable {other}; true",
        check=False,
    )


def gate_settled_unit(
    cfg: ServeConfig, rendered: RenderedUnit, previous: dict | None
) -> RenderedUnit:
    """Planning time, deploys/serve.py: when the gate already switched this host to the baseline for
    exactly this speculative unit and gate setting, keep serving the baseline (no re-measurement and
    no flip-flop on a re-run). Change the config (or the gate) to measure again."""
    gate = (previous or {}).get("gate") or {}
    if (
        rendered.role == "speculative"
        and cfg.speculation_gate is not None
        and gate
        and not gate.get("passed")
        and gate.get("on_fail") == "baseline"
        and (previous or {}).get("role") == "baseline"
        and gate.get("speculative_unit_sha256") == rendered.sha256
        and gate.get("max_tpot_ratio") == cfg.speculation_gate.max_tpot_ratio
        and cfg.speculation_gate.on_fail == "baseline"
    ):
        return render_unit(cfg, "baseline")
    return rendered


def gate_pending(cfg: ServeConfig, previous: dict | None) -> bool:
    """deploys/serve.py must verify (and so gate) again although the unit is unchanged: the gate was
    switched on or its setting changed since the record, or it failed with on_fail=fail."""
    if cfg.speculation_gate is None:
        return False
    gate = (previous or {}).get("gate") or {}
    if (
        not gate
        or gate.get("max_tpot_ratio") != cfg.speculation_gate.max_tpot_ratio
        or gate.get("on_fail") != cfg.speculation_gate.on_fail
    ):
        return True
    return not gate.get("passed") and gate.get("on_fail") == "fail"


# --- the deploys ------------------------------------------------------------------------------------

_WRITE_LOCK: dict[str, int] = {}


def _measure(cfg: ServeConfig, *, kind: str, plan: list[tuple[Arm, bool]], cond: dict) -> None:
    from .steps import lock

    out = run_dir(kind) / "raw" / host.name
    try:
        run_plan(cfg, plan, out_dir=out, conditions={"kind": kind, **cond})
    except Exception:
        lock.release_now(
            cfg
        )  # the host is back on its deployed unit (run_plan's finally) or says why
        raise


def _write_report(kind: str) -> None:
    """Runs on every host after all hosts measured; the first one writes the fleet report."""
    from . import report

    directory = run_dir(kind)
    finished = len(list((directory / "raw").glob("*/conditions.json")))
    if _WRITE_LOCK.get(str(directory)) == finished:
        return
    _WRITE_LOCK[str(directory)] = finished
    summary = report.write(directory, kind)
    logger.info(
        f"{host.print_prefix}report: {directory}/summary.md ({', '.join(summary['charts'])})"
    )
    if kind == "tune":
        for name, h in summary["hosts"].items():
            c = h["choice"]
            print(
                f"{name}: recommended num_speculative_tokens = {c['recommended_k']} (best {c['best_k']}, "
                f"currently {h['current_k']})"
            )
            print(f"  {h['host_data_change'] or 'no change needed'}")


def compare_deploy():
    """deploys/compare.py: baseline vs speculative A/B on every host, then the report."""
    from pyinfra.api import deploy
    from pyinfra.operations import python

    from .config import DATA_DEFAULTS
    from .serve import host_config
    from .steps import dataset, lock

    @deploy("specdeploy: baseline vs speculative A/B", data_defaults=DATA_DEFAULTS)
    def _compare():
        cfg = host_config()
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
        lock.acquire(name="Take the host's deploy lock", cfg=cfg)  # no serve deploy while measuring
        dataset.ship_request_set(cfg)  # the request set both arms replay
        python.call(
            name=f"A/B measurement ({repeats} runs per arm, {warmup_runs} warm-up, APC profile {apc})",
            function=_measure,
            cfg=cfg,
            kind="compare",
            plan=plan,
            cond=cond,
        )
        lock.release(name="Release the host's deploy lock", cfg=cfg)
        python.call(name=f"Report {run_dir('compare')}", function=_write_report, kind="compare")

    _compare()


def tune_deploy():
    """deploys/tune.py: sweep num_speculative_tokens on every host, then recommend k."""
    from pyinfra.api import deploy
    from pyinfra.operations import python

    from .config import DATA_DEFAULTS
    from .serve import host_config
    from .steps import dataset, lock

    @deploy("specdeploy: num_speculative_tokens sweep", data_defaults=DATA_DEFAULTS)
    def _tune():
        cfg = host_config()
        ks = setting(cfg, "tune_k")
        repeats = setting(cfg, "tune_repeats")
        warmup_runs = setting(cfg, "tune_warmup_runs")
        plan = tune_plan(cfg, ks=ks, repeats=repeats, warmup_runs=warmup_runs)
        cond = conditions(
            cfg,
            ks=ks,
            repeats=repeats,
            warmup_runs=warmup_runs,
            order="warm-up, then " + " ".join(a.label for a, w in plan if not w),
        )
        lock.acquire(name="Take the host's deploy lock", cfg=cfg)  # no serve deploy while measuring
        dataset.ship_request_set(cfg)  # the request set both arms replay
        python.call(
            name=f"Sweep k over {ks} ({repeats} runs each, {warmup_runs} warm-up)",
            function=_measure,
            cfg=cfg,
            kind="tune",
            plan=plan,
            cond=cond,
        )
        lock.release(name="Release the host's deploy lock", cfg=cfg)
        python.call(name=f"Report {run_dir('tune')}", function=_write_report, kind="tune")

    _tune()
