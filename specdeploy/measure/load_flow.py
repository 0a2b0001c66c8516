"""Measuring across load levels (issue 39): tune_method = "load" (the baseline and every k of
tune_k at every level of workload.load_levels) and compare_across_load (a schedule, tune's
candidate or the deployed one, against the baseline and the fixed k at every level).

One visit = one freshly started server for one arm, then one `vllm bench serve` per load level on
it, lowest concurrency first (sampling/runs.py: same_server). Each level's runs of an arm therefore
come from distinct server starts, so they are independent samples at that level, as every other
measurement's are; a visit spends one start on all levels (the H200 sweep's shape), which is what
makes three levels affordable. Visits go in rounds whose order rotates (no arm always first).
Labels: `<arm>@c<concurrency>` (baseline@c4, k3@c1, schedule@c16, fixed@c16)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

from specdeploy.config.schema import LoadLevel, ServeConfig
from specdeploy.decide.load_rule import (
    SCHEDULE_KEY,
    level_alpha,
    level_label,
    proof_runs,
    schedule_config,
)
from specdeploy.decide.stats import min_runs_per_arm
from specdeploy.measure.arms import BASELINE, Arm, SharedStep, k_arm
from specdeploy.measure.conditions import LoadConditions
from specdeploy.releases.capabilities import Release
from specdeploy.render.argv import EngineFlags
from specdeploy.sampling.runs import visits as sampling_visits


def at_level(cfg: ServeConfig, arm: Arm, level: LoadLevel) -> Arm:
    return replace(
        arm,
        label=level_label(arm.label, level.concurrency),
        workload=cfg.workload.at_level(level),
    )


def visits(
    cfg: ServeConfig, arms: Sequence[Arm], *, repeats: int, warmup_runs: int
) -> list[SharedStep]:
    """Warm-up visits (the first level only, discarded), then `repeats` rounds over `arms`, the
    order rotating every round; each visit a fresh server and one run per level."""
    levels = cfg.workload.effective_load_levels
    steps = [
        SharedStep(at_level(cfg, arms[i % len(arms)], levels[0]), True, False)
        for i in range(warmup_runs)
    ]
    by_label = {a.label: a for a in arms}
    return steps + [
        SharedStep(at_level(cfg, by_label[v.arm], v.level), False, v.at > 0)
        for v in sampling_visits([a.label for a in arms], levels, repeats)
    ]


def tune_runs_per_arm(cfg: ServeConfig, ks: Sequence[int], alpha: float) -> int:
    """The fewest runs per arm at which a k can be shown faster than the baseline at one level:
    the one-sided test at alpha / L (levels) / K (Holm's first step): 4 for one k over three
    levels at 0.05, 5 for two or three k."""
    each = level_alpha(alpha, len(cfg.workload.effective_load_levels)) / max(len(ks), 1)
    return min_runs_per_arm(each, alternative="less")


def proof_runs_per_arm(cfg: ServeConfig, alpha: float) -> int:
    """load_rule.proof_runs over the workload's load levels."""
    return proof_runs(len(cfg.workload.effective_load_levels), alpha)


def _levels_json(cfg: ServeConfig) -> list[dict]:
    return [lv.model_dump() for lv in cfg.workload.effective_load_levels]


def _schedule_facts(release: Release, flags: EngineFlags) -> dict:
    """What the conditions say of the pinned release and the engine, read from the Release and
    the engine flags the measurement's start handed in (flows/measure.py)."""
    return {
        "schedule_supported": SCHEDULE_KEY in release.speculative_keys.keys,
        "data_parallel_size": flags.dp,
    }


@dataclass(frozen=True)
class LoadTune:
    """tune_method = "load": the baseline and every k at every level."""

    cfg: ServeConfig
    ks: tuple[int, ...]
    repeats: int
    warmup_runs: int
    # the pin's Release and the engine flags, read once at the measurement's start
    release: Release = field(kw_only=True)
    flags: EngineFlags = field(kw_only=True)

    def arms(self) -> list[Arm]:
        return [BASELINE, *(k_arm(self.cfg, k) for k in self.ks)]

    def __iter__(self) -> Iterator[SharedStep]:
        return iter(
            visits(self.cfg, self.arms(), repeats=self.repeats, warmup_runs=self.warmup_runs)
        )

    def conditions(self) -> LoadConditions:
        arms = " ".join(a.label for a in self.arms())
        return LoadConditions(
            ks=list(self.ks),
            repeats=self.repeats,
            warmup_runs=self.warmup_runs,
            tune_method="load",
            load_levels=_levels_json(self.cfg),
            arms=[a.label for a in self.arms()],
            fixed_k=None,
            order=f"warm-up, then rounds over {arms} rotating by one; each visit a fresh "
            "server and one run per load level, lowest first",
            **_schedule_facts(self.release, self.flags),
        )


@dataclass(frozen=True)
class LoadProof:
    """compare_across_load: a schedule against the baseline and the fixed k (the config without
    the schedule) at every level. The schedule: compare_schedule (a candidate tune printed,
    measured without ever being deployed), else the deployed config's; without either, the
    deployed config against the baseline."""

    cfg: ServeConfig
    fixed_k: int | None  # None: num_speculative_tokens of the deployed config
    repeats: int
    warmup_runs: int
    schedule: tuple[tuple[int, int, int], ...] | None = None  # compare_schedule
    # the pin's Release and the engine flags, read once at the measurement's start
    release: Release = field(kw_only=True)
    flags: EngineFlags = field(kw_only=True)

    def measured_schedule(self) -> list[list[int]] | None:
        if self.schedule:
            return [list(e) for e in self.schedule]
        return self.cfg.speculative_config.get(SCHEDULE_KEY)

    def arms(self) -> list[Arm]:
        spec = self.cfg.speculative_config
        schedule = self.measured_schedule()
        if not schedule:
            return [BASELINE, Arm("speculative", True)]
        k = self.fixed_k or spec.get("num_speculative_tokens")
        candidate = schedule_config(spec, schedule) if self.schedule else None  # None: deployed
        fixed = Arm("fixed", True, speculative_config=schedule_config(spec, None, k))
        return [BASELINE, Arm("schedule", True, speculative_config=candidate), fixed]

    def __iter__(self) -> Iterator[SharedStep]:
        return iter(
            visits(self.cfg, self.arms(), repeats=self.repeats, warmup_runs=self.warmup_runs)
        )

    def conditions(self) -> LoadConditions:
        arms = self.arms()
        fixed = next((a for a in arms if a.label == "fixed"), None)
        return LoadConditions(
            ks=[],
            repeats=self.repeats,
            warmup_runs=self.warmup_runs,
            tune_method=None,
            load_levels=_levels_json(self.cfg),
            arms=[a.label for a in arms],
            fixed_k=fixed.speculative_config["num_speculative_tokens"] if fixed else None,
            order=f"warm-up, then rounds over {' '.join(a.label for a in arms)} rotating by one; "
            "each visit a fresh server and one run per load level, lowest first",
            across_load=True,
            schedule=self.measured_schedule(),
            schedule_deployed=bool(self.measured_schedule()) and not self.schedule,
            **_schedule_facts(self.release, self.flags),
        )
