"""A box's control arm (host data `speculation_control`): which of its instances serve the
baseline unit, so the live verdict (decide/live_rule.py) compares two arms behind one balancer
that routes at random (templates/haproxy.cfg.j2: `balance random`). Pure, no host."""

from __future__ import annotations

from specdeploy.config.schema import ServeConfig
from specdeploy.decide.live_rule import control_count, fallback_keeps

# Set by the live autopilot's fall-back for its serve run: the box keeps one speculative instance
FALLBACK_ENV = "SPECDEPLOY_LIVE_FALLBACK"


def control_instances(
    cfg: ServeConfig, names: list[str], *, fallen_back: bool = False
) -> list[str]:
    """The instance names (of `names`, the box's instances in order) that serve the baseline unit:
    the last `speculation_control` ones; a box the autopilot fell back keeps only its first
    instance speculative (the new control arm). Empty without a control arm or on a plain host
    (there whole hosts of a class are the control arm, chosen by the rollout)."""
    control = cfg.speculation_control
    if control is None or len(names) < 2:
        return []
    if fallen_back:
        return names[fallback_keeps(len(names)) :]
    count = control_count(len(names), count=control.instances, share=control.share)
    count = min(count, len(names) - 1)  # checks/live.py refuses more; never every instance
    return names[len(names) - count :]


def arm_of(cfg: ServeConfig, names: list[str], name: str, role: str, **kwargs) -> str:
    """The role (render.ROLES) instance `name` is planned with: the baseline for a control
    instance, else the deploy's `role`."""
    return "baseline" if name in control_instances(cfg, names, **kwargs) else role
