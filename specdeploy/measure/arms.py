"""What one measurement measures: an arm (baseline, speculative, one k, prefix caching on/off) and
the measurement unit it runs as, rendered from the production template so the arms differ only in
what the arm changes."""

from __future__ import annotations

from dataclasses import dataclass, field

from specdeploy.config.schema import ServeConfig, Workload
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


def measure_unit(cfg: ServeConfig, arm: Arm) -> RenderedUnit:
    """The measurement instance for `arm`, rendered from the production template."""
    return render_unit(
        arm.config(cfg),
        "speculative" if arm.speculative else "baseline",
        prefix_caching=arm.prefix_caching,
        measurement_arm=arm.label,
    )
