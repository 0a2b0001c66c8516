"""The measurement watchdog: a transient systemd timer on the host that restores the deployed unit
when the control node dies (or hangs) mid-measurement, so production comes back without it. Armed
and renewed before every sample (sampling/sampler.py), removed by measure/harness.py once production
is back.
"""

from __future__ import annotations

import shlex
import time

from specdeploy.config.schema import ServeConfig
from specdeploy.host.facts.haproxy import BACKEND
from specdeploy.host.on_host import sh


def watchdog_prefix(cfg: ServeConfig) -> str:
    return f"{cfg.service_name}-measure-watchdog"


def watchdog_script(cfg: ServeConfig, unit: str, readmit: tuple[str, str] | None = None) -> str:
    """What the watchdog runs as root when it fires: restore_deployed's steps, without the
    control node (no health wait: systemd brings the deployed unit up, status shows it).
    `readmit`: (balancer admin socket, server name) of a whole box's instance the measurement
    drained: put back `ready`, so its /health check, not a dead control node, decides whether it
    serves (left in MAINT it would never serve again)."""
    measure = cfg.measure_unit
    q = shlex.quote
    # no quotes and no ";": systemd-run writes the command into the transient unit file, and a
    # daemon-reload (the harness installs units) re-reads it with ";" as a literal "\\;" (systemd
    # 252, seen on the sandbox) and quoted words split: the whole script became echo's arguments
    return " && ".join(
        [
            "echo specdeploy watchdog: the measurement was neither finished nor renewed in time, "
            f"restoring {unit}",
            f"(systemctl stop {q(measure)} || true)",
            f"rm -f {q(cfg.unit_path(measure))}",
            "systemctl daemon-reload",
            f"(systemctl reset-failed {q(measure)} {q(unit)} 2>/dev/null || true)",
            f"systemctl start {q(unit)}",
        ]
        + (
            # echo's words unquoted (see above): BACKEND and instance names are plain words
            [
                f"echo set server {BACKEND}/{readmit[1]} state ready | socat -t 5 stdio "
                f"UNIX-CONNECT:{q(readmit[0])}"
            ]  # fmt: skip
            if readmit
            else []
        )
    )


def arm_watchdog(
    cfg: ServeConfig, unit: str, seconds: int, readmit: tuple[str, str] | None = None
) -> str:
    """(Re)arm the host's measurement watchdog: a transient systemd timer that puts `unit` back in
    `seconds` unless the control node renews or removes it first, so production returns even when
    the control node dies mid-measurement. A renewal starts the new timer before it stops the old
    ones, so the host is never without one. Returns the new timer's name."""
    prefix = watchdog_prefix(cfg)
    name = f"{prefix}-{time.time_ns()}"
    sh(
        f"systemd-run --quiet --collect --unit={shlex.quote(name)} --on-active={int(seconds)}s "
        f"--timer-property=AccuracySec=1s "  # the default accuracy is a minute
        f"--description={shlex.quote(f'specdeploy: restore {unit} if the measurement stalls')} "
        f"/bin/sh -c {shlex.quote(watchdog_script(cfg, unit, readmit))}"
    )
    _stop_watchdogs(prefix, keep=f"{name}.timer")
    return f"{name}.timer"


def disarm_watchdog(cfg: ServeConfig) -> None:
    """The measurement ended on the host (the deployed unit is back): no watchdog is left."""
    _stop_watchdogs(watchdog_prefix(cfg), keep=None)


def _stop_watchdogs(prefix: str, *, keep: str | None) -> None:
    pattern = shlex.quote(f"{prefix}-*.timer")
    skip = f'[ "$t" = {shlex.quote(keep)} ] || ' if keep else ""
    sh(
        f"for t in $(systemctl list-units --all --plain --no-legend {pattern} | "
        f"awk '{{print $1}}'); do {skip}systemctl stop \"$t\"; done; true",
        check=False,
    )


def watchdog_timers(cfg: ServeConfig) -> list[str]:
    """The watchdog timers loaded on the host now."""
    pattern = shlex.quote(f"{watchdog_prefix(cfg)}-*.timer")
    out = sh(f"systemctl list-units --all --plain --no-legend {pattern}", check=False)
    return [line.split()[0] for line in out.splitlines() if line.strip()]
