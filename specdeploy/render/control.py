"""A control arm (host data `speculation_control`): which of a box's instances, or which hosts of a
class of plain hosts, serve the baseline unit, so the live verdict (decide/live_rule.py) compares
two arms behind one balancer that routes at random (a box's: templates/haproxy.cfg.j2 `balance
random`; a class's: the operator's own). Pure, no host."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping

from specdeploy.config.schema import ServeConfig
from specdeploy.decide.live_rule import FALL_BACK, control_count, fallback_keeps

# Set by the live autopilot's fall-back for its serve run: the box keeps one speculative instance
FALLBACK_ENV = "SPECDEPLOY_LIVE_FALLBACK"
# ... and the evidence it falls back on (JSON: the autopilot's step, the deciding windows, the
# judge's file), which every record that run writes names
EVIDENCE_ENV = "SPECDEPLOY_LIVE_EVIDENCE"


def fallback_evidence(environ: Mapping[str, str]) -> dict | None:
    """The live evidence a fall-back run's records name (EVIDENCE_ENV, as
    observe/live_verdict.roll_command hands it in); None outside a fall-back. A fall-back without
    it (set by hand) is still said to be one."""
    if environ.get(FALLBACK_ENV) != "1":
        return None
    raw = environ.get(EVIDENCE_ENV)
    try:
        evidence = json.loads(raw) if raw else None
    except ValueError:
        evidence = None
    if not isinstance(evidence, dict):
        return {"action": FALL_BACK, "why": f"{FALLBACK_ENV}=1 without evidence", "evidence": raw}
    return evidence


def class_key(cfg: ServeConfig) -> str | None:
    """The control class a plain host with `speculation_control` belongs to: the plain hosts of
    the inventory that serve the same target (and revision) with the same draft
    (speculative_config). The gate's class (steps/gate.class_key: the units but their address,
    and the hardware) is known only from each host's facts at its turn; the control arm must be
    known before any host is touched, from host data alone, so the class is what the hosts serve,
    which the operator sees in the data; the settings its one judge reads are refused when they
    differ within it (checks/live.check_classes). None: a box, or no control arm."""
    if cfg.speculation_control is None or cfg.instances is not None:
        return None
    served = {
        "target_model": cfg.target_model,
        "target_revision": cfg.target_revision,
        "speculative_config": cfg.speculative_config,
    }
    return json.dumps(served, sort_keys=True, default=str)


def class_name(cfg: ServeConfig) -> str:
    """The name a control class is judged, exported and kept under (reports/<name>/): `class-`,
    the target's name and 8 hex digits of its class_key (two drafts of one target: two names)."""
    key = class_key(cfg) or ""
    short = re.sub(r"[^A-Za-z0-9._-]", "-", cfg.target_model.rsplit("/", 1)[-1])
    return f"class-{short}-{hashlib.sha256(key.encode()).hexdigest()[:8]}"


def control_classes(configs: Mapping[str, ServeConfig]) -> dict[str, list[str]]:
    """{class_key: its host names, sorted} over `configs` ({host name: config}, every host of the
    inventory: a class is the same whatever --limit picks)."""
    out: dict[str, list[str]] = {}
    for name in sorted(configs):
        key = class_key(configs[name])
        if key is not None:
            out.setdefault(key, []).append(name)
    return out


def ranked_hosts(names: list[str]) -> list[str]:
    """A class's hosts in the order its control arm is taken from (the last ones): by the sha256
    of each name, so the order depends on no inventory order, and a host added to the class falls
    in its own place: besides it, at most one host changes arm (the control count moves by at most
    one as the class grows)."""
    return sorted(names, key=lambda name: hashlib.sha256(name.encode()).hexdigest())


def control_instances(
    cfg: ServeConfig, names: list[str], *, fallen_back: bool = False
) -> list[str]:
    """The names (of `names`) that serve the baseline unit. On a box `names` are its instances in
    order: the last `speculation_control` ones. On a plain host `names` are the hosts of its
    control class (class_key), in any order: the last ones by ranked_hosts. A box or class the
    autopilot fell back keeps only its first speculative (the new control arm). Empty without a
    control arm or with fewer than 2 names (a plain host alone)."""
    control = cfg.speculation_control
    if control is None or len(names) < 2:
        return []
    if cfg.instances is None:
        names = ranked_hosts(names)
    if fallen_back:
        return names[fallback_keeps(len(names)) :]
    count = control_count(len(names), count=control.instances, share=control.share)
    count = min(count, len(names) - 1)  # checks/live.py refuses more; never every instance
    return names[len(names) - count :]


def arm_of(cfg: ServeConfig, names: list[str], name: str, role: str, **kwargs) -> str:
    """The role (render.ROLES) instance (or class host) `name` is planned with: the baseline for a
    control instance, else the deploy's `role`."""
    return "baseline" if name in control_instances(cfg, names, **kwargs) else role
