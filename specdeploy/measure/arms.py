"""What one measurement measures: an arm (baseline, speculative, one k, prefix caching on/off) and
the measurement unit it runs as, rendered from the production template so the arms differ only in
what the arm changes."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from specdeploy.config.schema import ServeConfig, Workload
from specdeploy.host.facts.cuda_boot import CudaBootInfo
from specdeploy.render.units import RenderedUnit, render_unit


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


BASELINE = Arm("baseline", False)
SPECULATIVE = Arm("speculative", True)


class Step(NamedTuple):
    """One benchmark of a plan, in order: its arm, and whether it is a discarded warm-up run."""

    arm: Arm
    warmup: bool


class SharedStep(NamedTuple):
    """A step of the predict flow (tune_flow.predict_plan): also whether it runs on the server the
    previous step started for the same arm (tune_share_server) instead of a fresh one."""

    arm: Arm
    warmup: bool
    same_server: bool


# what harness.measure_plan runs: a list, or a generator that reads the samples written so far
Plan = Iterable[Step] | Iterable[SharedStep]


def measure_unit(cfg: ServeConfig, arm: Arm, cuda_boot: CudaBootInfo | None = None) -> RenderedUnit:
    """The measurement instance for `arm`, rendered from the production template (`cuda_boot`: the
    host's CudaBoot fact, steps/unit.cuda_boot)."""
    return render_unit(
        arm.config(cfg),
        "speculative" if arm.speculative else "baseline",
        prefix_caching=arm.prefix_caching,
        measurement_arm=arm.label,
        cuda_boot=cuda_boot,
    )
