"""The plans compare and tune measure (which arms, in which order, how often), their settings and
the conditions every report states."""

from __future__ import annotations

import os

from pyinfra import host, logger

from .. import datasets
from ..bench import bench_args
from ..config import ServeConfig, Workload
from ..render import render_unit
from ..reports import raw_dir
from .arms import BASELINE, SPECULATIVE, Arm, k_arm
from .choose import min_runs_for_choose_k
from .decisions import RANDOM_REQUESTS_WARNING, RULE, round_order
from .tune_flow import PredictPlan

ORDER = "alternate"  # the run order of compare's rounds (decisions.round_order)

# --- settings: host data, overridden by the environment -------------------------------------------


def setting(cfg: ServeConfig, name: str):
    """A measurement setting: SPECDEPLOY_<NAME> from the environment, else the host's config."""
    env = os.environ.get(f"SPECDEPLOY_{name.upper()}")
    if env in (None, ""):
        return getattr(cfg, name)
    return getattr(
        ServeConfig.model_validate({**cfg.model_dump(), name: env}), name
    )  # validated like host data


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
    arms = {a.label: a for a in (BASELINE, SPECULATIVE)}
    plan: list[tuple[Arm, bool]] = [
        ((SPECULATIVE, BASELINE)[i % 2], True) for i in range(warmup_runs)
    ]
    for r in range(repeats):  # B S, S B, B S, ...: neither arm always first
        plan += [
            (arms[label], False) for label in round_order(list(arms), r, seed=None, mode=ORDER)
        ]
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
    arms = [BASELINE] + [k_arm(cfg, k) for k in ks]  # the baseline: is any k worth it at all?
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
            base_url=cfg.base_url,
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
        "decision_alpha": cfg.decision_alpha,
        "decision_rule": RULE,
        **extra,
    }


# --- what deploys/compare.py and deploys/tune.py measure ------------------------------------------


def compare_measurement(cfg: ServeConfig) -> tuple[list[tuple[Arm, bool]], dict, str]:
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
        run_order={"mode": ORDER, "seed": None},
        apc_profile=apc_workload(cfg)[2] if apc else None,
    )
    return plan, cond, f"A/B ({repeats} runs per arm, {warmup_runs} warm-up, APC profile {apc})"


def tune_measurement(cfg: ServeConfig) -> tuple[list[tuple[Arm, bool]], dict, str]:
    ks = setting(cfg, "tune_k")
    if cfg.workload.dataset == "random":
        logger.warning(f"{host.print_prefix}tune: {RANDOM_REQUESTS_WARNING}")
    predict = setting(cfg, "tune_method") == "predict"
    # None: the fewest runs at which choose_k can decide (the confirm window holds <= 3 k)
    repeats = setting(cfg, "tune_repeats") or min_runs_for_choose_k(
        min(len(ks), 3) if predict else len(ks), alpha=cfg.decision_alpha
    )
    warmup_runs = setting(cfg, "tune_warmup_runs")
    if predict:  # the adaptive default: tune_flow.py
        plan = PredictPlan(
            cfg,
            tuple(ks),
            repeats,
            warmup_runs,
            setting(cfg, "tune_share_server"),
            out_dir=raw_dir("tune", host.name),
            arm_for=lambda k: k_arm(cfg, k) if k else BASELINE,
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
