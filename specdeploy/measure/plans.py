"""The plans compare and tune measure (which arms, in which order, how often), their settings and
the conditions every report states."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from pyinfra import host, logger

from specdeploy.config import datasets
from specdeploy.config.problems import ConfigError, Problem
from specdeploy.config.schema import ServeConfig, Workload
from specdeploy.decide.choose import min_runs_for_choose_k
from specdeploy.decide.decisions import (
    ADD_RUN,
    DECIDE,
    RANDOM_REQUESTS_WARNING,
    RULE,
    next_step,
    round_order,
)
from specdeploy.decide.decisions import run_values as _run_values
from specdeploy.decide.load_rule import schedule_problems
from specdeploy.decide.stats import SEQUENTIAL_RULE, min_runs_per_arm, sequential_looks
from specdeploy.decide.tune_rule import runs_by_label
from specdeploy.host.bench import bench_args
from specdeploy.measure.arms import BASELINE, SPECULATIVE, Arm, Step, k_arm
from specdeploy.measure.conditions import (
    ApcProfile,
    CompareConditions,
    Conditions,
    Limits,
    RunOrder,
    SequentialRule,
    TuneConditions,
    VllmPin,
)
from specdeploy.measure.draft_flow import DraftPlan, draft_plan
from specdeploy.measure.load_flow import (
    LoadProof,
    LoadTune,
    proof_runs_per_arm,
    tune_runs_per_arm,
)
from specdeploy.measure.tune_flow import PredictPlan, read_raw
from specdeploy.releases.capabilities import Release
from specdeploy.render.argv import EngineFlags
from specdeploy.render.units import render_unit
from specdeploy.report.paths import raw_dir

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


class ApcWorkload(NamedTuple):
    """The prefix-caching profile's requests: the workload, the bench flags that shape it, and
    what conditions.json says of it."""

    workload: Workload
    bench_extra: tuple[str, ...]
    profile: ApcProfile


def apc_workload(cfg: ServeConfig) -> ApcWorkload:
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
    profile = ApcProfile(
        prefix_len=prefix,
        suffix_len=suffix,
        num_prefixes=groups,
        output_len=w.output_len,
        num_prompts=w.num_prompts,
    )
    return ApcWorkload(workload, extra, profile)


def compare_plan(
    cfg: ServeConfig, *, repeats: int, warmup_runs: int, apc_profile: bool, apc_repeats: int
) -> list[Step]:
    """The fixed plan (compare_repeats set): warm-up, `repeats` alternating rounds, the APC
    profile."""
    plan = _warmups(warmup_runs) + [
        Step(arm, False) for r in range(repeats) for arm in _round(r)
    ]  # B S, S B, B S, ...: neither arm always first
    return plan + apc_plan(cfg, apc_profile=apc_profile, apc_repeats=apc_repeats)


def _warmups(warmup_runs: int) -> list[Step]:
    return [Step((SPECULATIVE, BASELINE)[i % 2], True) for i in range(warmup_runs)]


def _round(r: int) -> list[Arm]:
    arms = {a.label: a for a in (BASELINE, SPECULATIVE)}
    return [arms[label] for label in round_order(list(arms), r, seed=None, mode=ORDER)]


def apc_plan(cfg: ServeConfig, *, apc_profile: bool, apc_repeats: int) -> list[Step]:
    if not apc_profile:
        return []
    workload, extra, _ = apc_workload(cfg)
    off = Arm("apc-off", False, prefix_caching=False, workload=workload, bench_extra=extra)
    on = Arm("apc-on", False, prefix_caching=True, workload=workload, bench_extra=extra)
    return [step for _ in range(apc_repeats) for step in (Step(off, False), Step(on, False))]


# --- the sequential compare (compare_repeats unset, the default) ----------------------------------


def sequential_compare_plan(
    *,
    max_runs: int,
    warmup_runs: int,
    alpha: float,
    read: Callable[[], list[dict]],
    then: Sequence[Step] = (),
    log: Callable[[str], None] = lambda _: None,
) -> Iterator[Step]:
    """compare's default plan: warm-up, then alternating rounds (B S, S B, ...) of fresh-server
    runs, starting with the fewest rounds at which the rule can decide (the first look of
    decisions.next_step) and adding one round while it says "add a run to each arm", up to
    max_runs per arm; then `then` (the APC profile). `read()` returns the samples written so far
    (runs.run_samples writes each before the next step is asked for). The report replays the same
    next_step over the raw files (report.sequential_steps), so what stopped the run is recorded
    from the runs themselves."""
    yield from _warmups(warmup_runs)
    first = sequential_looks(max_runs, alpha=alpha)[0]["runs"]
    r = 0
    while True:
        for arm in _round(r):
            yield Step(arm, False)
        r += 1
        if r < first:
            continue
        runs = runs_by_label(read())
        step = next_step(
            _run_values(runs.get("speculative", []), "tpot"),
            _run_values(runs.get("baseline", []), "tpot"),
            max_runs=max_runs,
            alpha=alpha,
        )
        log(f"sequential compare, {r} runs per arm: {step['action']}: {step['reason']}")
        if step["action"] == DECIDE:
            break
        if step["action"] != ADD_RUN:  # a run without a TPOT: the arms cannot be looked at
            raise RuntimeError(f"sequential compare stopped: {step['reason']}")
    yield from then


@dataclass(frozen=True)
class SequentialCompare:
    """sequential_compare_plan as harness.measure_plan iterates it: the generator starts when the
    measurement starts on the host and reads the raw files the samples wrote in out_dir."""

    max_runs: int
    warmup_runs: int
    alpha: float
    then: tuple[Step, ...]
    out_dir: Path
    apc_profile: ApcProfile | None = None  # what `then` measures, for the conditions

    def __iter__(self) -> Iterator[Step]:
        return sequential_compare_plan(
            max_runs=self.max_runs,
            warmup_runs=self.warmup_runs,
            alpha=self.alpha,
            read=read_raw(self.out_dir),
            then=self.then,
            log=lambda line: logger.info(f"{host.print_prefix}{line}"),
        )

    def conditions(self) -> CompareConditions:
        """What conditions.json says about this compare, its sequential rule included
        (report.sequential_steps replays it)."""
        looks = sequential_looks(self.max_runs, alpha=self.alpha)
        return CompareConditions(
            warmup_runs=self.warmup_runs,
            run_order=RunOrder(ORDER, None),
            apc_profile=self.apc_profile,
            repeats=None,
            sequential=SequentialRule(
                max_runs=self.max_runs,
                spending="first-last",
                looks=looks,
                first_runs=looks[0]["runs"],
                rule=SEQUENTIAL_RULE,
            ),
            order=f"warm-up, then alternating rounds ({' '.join(a.label for a in _round(0))},"
            f" {' '.join(a.label for a in _round(1))}, ...) from {looks[0]['runs']} runs per arm "
            f"while the rule says '{ADD_RUN}', at most {self.max_runs}"
            + ("; then apc-off apc-on" if self.then else ""),
        )


def tune_plan(cfg: ServeConfig, *, ks: list[int], repeats: int, warmup_runs: int) -> list[Step]:
    arms = [BASELINE] + [k_arm(cfg, k) for k in ks]  # the baseline: is any k worth it at all?
    plan = [Step(arms[i % len(arms)], True) for i in range(warmup_runs)]
    for r in range(repeats):  # rotate the order each round so no k always runs first
        shift = r % len(arms)
        plan += [Step(a, False) for a in arms[shift:] + arms[:shift]]
    return plan


def conditions(
    cfg: ServeConfig,
    plan: CompareConditions | TuneConditions,
    *,
    restart_between_samples: bool | str = True,
) -> Conditions:
    """What every report states about one host's measurement; `plan`: the plan's own part."""
    w = cfg.workload
    return Conditions(
        workload=w,
        request_set=datasets.describe(w.dataset_path, w.dataset),  # sha256, rows
        bench_args=bench_args(
            cfg,
            base_url=cfg.base_url,
            tokenizer="<target snapshot>",
            result_dir="<dir>",
            result_filename="<name>.json",
        ),
        baseline_argv=render_unit(cfg, "baseline", prefix_caching=False).argv,
        speculative_argv=render_unit(cfg, "speculative", prefix_caching=False).argv,
        speculative_config=cfg.speculative_config,
        memory=dict([cfg.memory_mechanism]),
        limits=Limits(
            max_model_len=cfg.effective_max_model_len,
            max_num_seqs=cfg.effective_max_num_seqs,
            max_num_batched_tokens=cfg.effective_max_num_batched_tokens,
        ),
        vllm=VllmPin(package=cfg.vllm_package, version=cfg.vllm_version),
        prefix_caching="off for every speculative/baseline/k measurement instance",
        restart_between_samples=restart_between_samples,
        warm_up="one discarded completion per server instance, plus the discarded warm-up runs",
        decision_alpha=cfg.decision_alpha,
        decision_rule=RULE,
        plan=plan,
    )


# --- what deploys/compare.py and deploys/tune.py measure ------------------------------------------


class Measurement(NamedTuple):
    """What compare or tune measures on one host: the plan harness.measure_plan runs, the
    conditions its report states (a mapping: conditions.json's object), and the line that says
    what (the pyinfra operation's name). Unpacks as (plan, cond, what)."""

    plan: list[Step] | SequentialCompare | PredictPlan | DraftPlan
    conditions: Conditions
    what: str


def compare_measurement(
    cfg: ServeConfig, *, release: Release | None, flags: EngineFlags
) -> Measurement:
    """compare_repeats set: that many runs per arm (one look at alpha); unset (the default): the
    sequential compare up to compare_max_repeats runs per arm. `release`, `flags`: the pin's
    Release and the engine flags the measurement's start read (the load proof states them)."""
    if setting(cfg, "compare_across_load"):
        return load_proof_measurement(cfg, release=release, flags=flags)
    repeats = setting(cfg, "compare_repeats")
    max_runs = setting(cfg, "compare_max_repeats")
    warmup_runs = setting(cfg, "compare_warmup_runs")
    apc = setting(cfg, "compare_apc_profile")
    apc_repeats = setting(cfg, "compare_apc_repeats")
    profile = apc_workload(cfg).profile if apc else None
    if repeats is None:
        looks = sequential_looks(max_runs, alpha=cfg.decision_alpha)
        if not looks:
            raise ConfigError([_budget_problem(cfg, max_runs)])
        plan = SequentialCompare(
            max_runs,
            warmup_runs,
            cfg.decision_alpha,
            tuple(apc_plan(cfg, apc_profile=apc, apc_repeats=apc_repeats)),
            raw_dir("compare", host.name),
            apc_profile=profile,
        )
        what = (
            f"A/B (sequential: {looks[0]['runs']} to {max_runs} runs per arm, {warmup_runs} "
            f"warm-up, APC profile {apc})"
        )
        return Measurement(plan, conditions(cfg, plan.conditions()), what)
    fixed = compare_plan(
        cfg, repeats=repeats, warmup_runs=warmup_runs, apc_profile=apc, apc_repeats=apc_repeats
    )
    part = CompareConditions(
        warmup_runs=warmup_runs,
        run_order=RunOrder(ORDER, None),
        apc_profile=profile,
        repeats=repeats,
        order="warm-up, then " + " ".join(step.arm.label for step in fixed if not step.warmup),
    )
    what = f"A/B ({repeats} runs per arm, {warmup_runs} warm-up, APC profile {apc})"
    return Measurement(fixed, conditions(cfg, part), what)


def _budget_problem(cfg: ServeConfig, max_runs: int) -> Problem:
    need = min_runs_per_arm(cfg.decision_alpha)
    return Problem(
        host.name,
        "compare_max_repeats",
        f"{max_runs} runs per arm can never reach decision_alpha = {cfg.decision_alpha:g} (the "
        f"exact test's smallest p at {max_runs} + {max_runs} runs is above it)",
        f"set it to at least {need}, or set compare_repeats for a fixed run count",
    )


def tune_measurement(
    cfg: ServeConfig, *, release: Release | None, flags: EngineFlags
) -> Measurement:
    """`release`, `flags`: as compare_measurement's."""
    ks = setting(cfg, "tune_k")
    if cfg.workload.dataset == "random":
        logger.warning(f"{host.print_prefix}tune: {RANDOM_REQUESTS_WARNING}")
    method = setting(cfg, "tune_method")
    if method == "load":
        return load_tune_measurement(cfg, ks, release=release, flags=flags)
    predict = method == "predict"
    # None: the fewest runs at which choose_k can decide; the predict flow sizes it to the k it
    # confirms (tune_flow.predict_plan), the sweep to all of tune_k
    repeats = setting(cfg, "tune_repeats")
    if not predict:
        repeats = repeats or min_runs_for_choose_k(len(ks), alpha=cfg.decision_alpha)
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
        cond = conditions(
            cfg, plan.conditions(), restart_between_samples=plan.restart_between_samples
        )
        return Measurement(plan, cond, plan.describe())
    sweep = tune_plan(cfg, ks=ks, repeats=repeats, warmup_runs=warmup_runs)
    part = TuneConditions(
        ks=ks,
        repeats=repeats,
        warmup_runs=warmup_runs,
        tune_method="sweep",
        order="warm-up, then " + " ".join(step.arm.label for step in sweep if not step.warmup),
    )
    what = f"Sweep k over {ks} ({repeats} runs each, {warmup_runs} warm-up)"
    return Measurement(sweep, conditions(cfg, part), what)


# --- across load levels (issue 39) ----------------------------------------------------------------

VISIT_NOTE = (
    "per visit: a fresh server for one arm, then one run per load level on it, lowest concurrency "
    "first; each level's runs of an arm come from distinct server starts"
)


def _levels_text(cfg: ServeConfig) -> str:
    return ", ".join(str(lv.concurrency) for lv in cfg.workload.effective_load_levels)


def load_tune_measurement(
    cfg: ServeConfig, ks: list[int], *, release: Release, flags: EngineFlags
) -> Measurement:
    """tune_method = "load": tune_repeats, else the fewest runs at which a k can be shown faster
    at one level under the levels' correction (load_flow.tune_runs_per_arm)."""
    repeats = setting(cfg, "tune_repeats") or tune_runs_per_arm(cfg, ks, cfg.decision_alpha)
    plan = LoadTune(
        cfg, tuple(ks), repeats, setting(cfg, "tune_warmup_runs"), release=release, flags=flags
    )
    cond = conditions(cfg, plan.conditions(), restart_between_samples=VISIT_NOTE)
    what = (
        f"Tune k over {ks} at concurrency {_levels_text(cfg)} ({repeats} visits per arm, one run "
        "per level each)"
    )
    return Measurement(plan, cond, what)


def load_proof_measurement(
    cfg: ServeConfig, *, release: Release, flags: EngineFlags
) -> Measurement:
    """compare_across_load: compare_repeats, else the fewest runs at which the two-sided test at
    alpha / L can decide (load_flow.proof_runs_per_arm)."""
    repeats = setting(cfg, "compare_repeats") or proof_runs_per_arm(cfg, cfg.decision_alpha)
    candidate = setting(cfg, "compare_schedule")  # from the environment too: check it here
    wrong = schedule_problems(candidate, None) if candidate is not None else []
    if wrong:
        fix = "set it as tune printed it: [[1, end, k], [end + 1, ..., k], ...]"
        raise ConfigError([Problem(host.name, "compare_schedule", what, fix) for what in wrong])
    plan = LoadProof(
        cfg,
        setting(cfg, "compare_fixed_k"),
        repeats,
        setting(cfg, "compare_warmup_runs"),
        tuple(tuple(e) for e in candidate) if candidate else None,
        release=release,
        flags=flags,
    )
    cond = conditions(cfg, plan.conditions(), restart_between_samples=VISIT_NOTE)
    arms = " vs ".join(a.label for a in plan.arms())
    what = f"{arms} at concurrency {_levels_text(cfg)} ({repeats} visits per arm)"
    return Measurement(plan, cond, what)


# --- which draft (deploys/choose_draft.py) --------------------------------------------------------


def draft_measurement(
    cfg: ServeConfig, *, release: Release | None, flags: EngineFlags
) -> Measurement:
    """The candidates checked (each refusal by name, before any download), then the pin runs at
    the largest tune_k and the proof of the best two pairs, up to compare_max_repeats runs per arm
    (measure/draft_flow.py). conditions.json also keeps every candidate's checks. `release`: the
    pin's, read at the measurement's start (every candidate is checked against its rules)."""
    if cfg.workload.dataset == "random":
        logger.warning(f"{host.print_prefix}choose_draft: {RANDOM_REQUESTS_WARNING}")
    plan = draft_plan(
        cfg,
        ks=setting(cfg, "tune_k"),
        warmup_runs=setting(cfg, "tune_warmup_runs"),
        max_runs=setting(cfg, "compare_max_repeats"),
        out_dir=raw_dir("choose_draft", host.name),
        release=release,
    )
    return Measurement(plan, draft_conditions(cfg, plan), plan.describe())


def draft_conditions(cfg: ServeConfig, plan: DraftPlan) -> dict:
    """conditions.json of a draft choice: every report's conditions, every candidate's checks (its
    refusals by name) and the proof's budget, which the report replays the decision with."""
    return {**conditions(cfg, plan.conditions()),
            "draft_candidates": [c.as_json() for c in plan.checks],
            "draft_max_runs": plan.max_runs,
            "draft_levels": list(plan.levels) or None}  # fmt: skip
