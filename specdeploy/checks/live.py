"""Refusals for the live verdict's host data (speculation_control, speculation_autopilot, the
window settings), before any host is touched: a control arm that leaves nothing to compare, an
autopilot without a control arm, a decision too small to ever reach decision_alpha."""

from __future__ import annotations

from specdeploy.config.problems import Problem
from specdeploy.config.schema import ServeConfig
from specdeploy.decide.live_rule import control_count, min_live_windows


def box_size(cfg: ServeConfig) -> int | None:
    """Instances of a whole box, None for a plain host."""
    if cfg.instances is None:
        return None
    return cfg.instances if isinstance(cfg.instances, int) else len(cfg.instances)


def check_live(host: str, cfg: ServeConfig) -> list[Problem]:
    """Every problem with this host's live-verdict settings; empty when there are none."""
    problems: list[Problem] = []
    control = cfg.speculation_control
    size = box_size(cfg)
    if control is not None:
        if (control.instances is None) == (control.share is None):
            problems.append(
                Problem(
                    host,
                    "speculation_control",
                    "needs exactly one of instances and share",
                    "set {instances = 1} on a box, or {share = 0.25}",
                )
            )
        elif size is None and control.instances is not None:
            problems.append(
                Problem(
                    host,
                    "speculation_control.instances",
                    "a plain host has no instances to keep on the baseline",
                    "set instances = 2 or more to make it a box, or use {share = ...} across its "
                    "class of plain hosts (whole hosts as the control arm)",
                )
            )
        elif size is not None:
            if size < 2:
                problems.append(
                    Problem(
                        host,
                        "speculation_control",
                        f"a box of {size} instance cannot keep one on the baseline and one "
                        "speculative",
                        "set instances = 2 or more, or drop speculation_control",
                    )
                )
            else:
                held = control_count(size, count=control.instances, share=control.share)
                if held >= size:
                    problems.append(
                        Problem(
                            host,
                            "speculation_control",
                            f"{held} of {size} instances on the baseline leaves no speculative "
                            "instance to judge",
                            f"keep at most {size - 1} on the baseline",
                        )
                    )
        if not cfg.speculative_config:
            problems.append(
                Problem(
                    host,
                    "speculation_control",
                    "there is no speculation to compare against",
                    "set speculative_config, or drop speculation_control",
                )
            )
    if cfg.speculation_autopilot != "off" and control is None:
        problems.append(
            Problem(
                host,
                "speculation_autopilot",
                f'"{cfg.speculation_autopilot}" needs a live verdict, which needs a control arm',
                "set speculation_control (e.g. {instances = 1} on a box), or speculation_autopilot "
                '= "off"',
            )
        )
    if cfg.speculation_autopilot == "both" and size is not None and size < 3:
        problems.append(
            Problem(
                host,
                "speculation_autopilot",
                f'"both" on a box of {size}: a fall-back leaves no speculative instance to '
                "judge, so the verdict could never bring it back",
                'use "fallback" (a deploy brings speculation back), or instances = 3 or more',
            )
        )
    fewest = min_live_windows(cfg.decision_alpha)
    if cfg.live_windows < fewest:
        problems.append(
            Problem(
                host,
                "live_windows",
                f"{cfg.live_windows} windows per decision can never reach decision_alpha = "
                f"{cfg.decision_alpha:g} (the exact sign test's smallest p is 2 / 2^windows)",
                f"set live_windows = {fewest} or more",
            )
        )
    return problems
