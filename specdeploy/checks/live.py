"""Refusals for the live verdict's host data (speculation_control, speculation_autopilot, the
window settings), before any host is touched: a control arm that leaves nothing to compare, an
autopilot without a control arm, a decision too small to ever reach decision_alpha; across the
inventory, a control class of plain hosts (render/control.class_key) too small to hold both arms
or whose hosts disagree on what its one judge reads."""

from __future__ import annotations

import json
import weakref
from collections.abc import Mapping

from specdeploy.config.problems import ConfigError, Problem, name_list
from specdeploy.config.schema import ServeConfig, config_from_data
from specdeploy.decide.live_rule import control_count, fallback_keeps, min_live_windows
from specdeploy.render.control import class_name, control_classes

# What the hosts of one control class must agree on: its one judge's settings and control share
# (observe/live_verdict.LiveJudge), and the engine both arms run
CLASS_SETTINGS = (
    "speculation_control",
    "speculation_autopilot",
    "speculation_autopilot_after",
    "live_window_s",
    "live_windows",
    "live_min_requests",
    "decision_alpha",
    "vllm_package",
    "vllm_version",
)


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
                "set speculation_control ({instances = 1} on a box, {share = ...} across a class "
                'of plain hosts), or speculation_autopilot = "off"',
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


def check_classes(configs: Mapping[str, ServeConfig]) -> list[Problem]:
    """Every problem with the control classes of `configs` (every host of the inventory: {name:
    config}), one per host of a refused class: a class of one host (no other host for the other
    arm), a share that leaves no speculative host, hosts that differ in CLASS_SETTINGS, "both" on
    a class too small to keep a speculative host after a fall-back."""
    problems: list[Problem] = []
    for hosts in control_classes(configs).values():
        cfg = configs[hosts[0]]
        name, size = class_name(cfg), len(hosts)
        where = f"class {name} ({cfg.target_model} with draft {cfg.draft_model})"
        every = _every(problems, hosts)
        if size < 2:
            every(
                "speculation_control",
                f"{where} has this one plain host: no host is left for the other arm",
                "give speculation_control to the other plain hosts serving the same target and "
                "draft behind the same balancer, or make it a box (instances = 2 or more)",
            )
            continue
        mixed = False
        for field in CLASS_SETTINGS:
            values: dict[str, list[str]] = {}
            for h in hosts:
                value = getattr(configs[h], field)
                shown = json.dumps(value.model_dump() if hasattr(value, "model_dump") else value,
                                   sort_keys=True)  # fmt: skip
                values.setdefault(shown, []).append(h)
            if len(values) > 1:
                mixed = True
                said = "; ".join(f"{v} on {name_list(hs)}" for v, hs in values.items())
                every(
                    field,
                    f"{where}: its hosts differ ({said}); one judge decides for the class",
                    f"set one {field} for every host of the class (group_data)",
                )
        if mixed:
            continue
        held = control_count(size, share=cfg.speculation_control.share)
        if held >= size:
            every(
                "speculation_control.share",
                f"{where}: {held} of its {size} hosts on the baseline leaves no speculative host "
                "to judge",
                f"keep at most {size - 1} of {size} on the baseline (a smaller share)",
            )
        if cfg.speculation_autopilot == "both" and fallback_keeps(size) == 0:
            every(
                "speculation_autopilot",
                f'"both" on {where} of {size} hosts: a fall-back leaves no speculative host to '
                "judge, so the verdict could never bring it back",
                'use "fallback" (a deploy brings speculation back), or 3 hosts or more',
            )
    return problems


def _every(problems: list[Problem], hosts: list[str]):
    """A class's refusal, said of each of its hosts (`specdeploy check` says it once, counted)."""

    def add(field: str, what: str, todo: str) -> None:
        problems.extend(Problem(h, field, what, todo) for h in hosts)

    return add


# pyinfra Inventory -> its configs, and each class host's (class, problems): read once per run
_CONFIGS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_CLASSES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def inventory_configs(inventory) -> dict[str, ServeConfig]:
    """{host name: config} of every host of a pyinfra inventory whose data is valid (an invalid
    host is in no class; its own check refuses it where it is deployed); once per inventory.
    None (no pyinfra state: a stand-in probe): none."""
    if inventory is None:
        return {}
    known = _CONFIGS.get(inventory)
    if known is None:
        known = {}
        for other in inventory:
            try:
                known[other.name] = config_from_data(other.data.dict())
            except ValueError:  # pydantic's ValidationError
                continue
        _CONFIGS[inventory] = known
    return known


def class_hosts(name: str, inventory) -> list[str]:
    """Inside a deploy: the hosts of host `name`'s control class in the pyinfra `inventory` (all of
    it, whatever --limit picks, so every run chooses the same control hosts); [] outside a class.
    Raises ConfigError with its class's problems before any host is touched."""
    if inventory is None:
        return []
    classes = _CLASSES.get(inventory)
    if classes is None:
        configs = inventory_configs(inventory)
        classes = {}
        for hosts in control_classes(configs).values():
            problems = check_classes({h: configs[h] for h in hosts})
            classes.update(dict.fromkeys(hosts, (hosts, problems)))
        _CLASSES[inventory] = classes
    hosts, problems = classes.get(name, ([], []))
    if problems:
        raise ConfigError(problems)
    return hosts
