"""What systemd says about a unit: `systemctl is-active`, and `systemctl show` for `specdeploy
status`."""

from __future__ import annotations

import shlex

from specdeploy.host.facts.base import Fact


class ServiceActive(Fact):
    """`systemctl is-active UNIT` (active, inactive, failed, activating...)."""

    def command(self, unit: str) -> str:
        return f"systemctl is-active {shlex.quote(unit)} || true"

    def process(self, output):
        lines = [line.strip() for line in output if line.strip()]
        return lines[-1] if lines else "unknown"


class ServiceShow(Fact):
    """systemd's view of a unit (`systemctl show`), plus the host's uptime and its clock (`Now`,
    seconds since the epoch) to turn monotonic stamps into ages and times (when the main process
    started, against when its unit file changed); read by `specdeploy status`
    (observe/status.py). No systemd: only the uptime and the clock."""

    PROPERTIES = tuple(
        "LoadState ActiveState SubState UnitFileState ActiveEnterTimestamp "
        "ActiveEnterTimestampMonotonic ExecMainStartTimestampMonotonic NRestarts MainPID "
        "NeedDaemonReload".split()
    )

    def command(self, unit: str) -> str:
        props = ",".join(self.PROPERTIES)
        return (
            f"systemctl show {shlex.quote(unit)} -p {props} 2>/dev/null || true; "
            "echo Uptime=$(cut -d' ' -f1 /proc/uptime); echo Now=$(date +%s)"
        )

    def process(self, output):
        return dict(line.split("=", 1) for line in output if "=" in line)
