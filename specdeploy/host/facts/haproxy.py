"""What a whole box's local balancer (HAProxy) says about its instances: `show stat` on its
runtime socket. `show_stat_servers` is the one parser of that CSV: the `BalancerServers` fact
(`specdeploy status`, per host) and the server lifecycle (host/server.py, draining an instance
mid-run) both read the answer through it."""

from __future__ import annotations

import shlex
from collections.abc import Iterable

from specdeploy.host.facts.base import NO_ANSWER, Fact

BACKEND = "instances"  # the backend of templates/haproxy.cfg.j2


def show_stat_servers(
    lines: Iterable[str], backend: str = BACKEND
) -> dict[str, dict[str, str]] | None:
    """`show stat`'s CSV -> {server name: the columns with a value} for `backend`'s servers (not
    its FRONTEND/BACKEND rows); None where the lines are not that CSV (no `# pxname,...` header)."""
    rows = [line.rstrip() for line in lines if line.strip()]
    if not rows or not rows[0].startswith("# "):
        return None
    columns = rows[0][2:].split(",")
    parsed = [dict(zip(columns, row.split(","), strict=False)) for row in rows[1:]]
    return {
        row["svname"]: {key: value for key, value in row.items() if value and key != "-"}
        for row in parsed
        if row.get("pxname") == backend and row.get("svname") not in ("FRONTEND", "BACKEND")
    }


class BalancerServers(Fact):
    """The servers of the balancer's backend: {"status": "ok", "servers": {name: the `show stat`
    columns with a value (status UP/DOWN/DRAIN/MAINT/NOLB, check_status, check_desc, addr, scur,
    lastchg...)}}, or status "missing" (no socket: no balancer on this host) or "failed" with
    `error`. socat talks to the socket (installed with HAProxy; the socket is root's 0600)."""

    def command(self, socket: str) -> str:
        s = shlex.quote(socket)
        return (
            f"if [ -S {s} ]; then printf 'show stat\\n' | socat -t 5 stdio UNIX-CONNECT:{s} 2>&1; "
            'echo "@@rc $?"; else echo @@missing; fi'
        )

    def process(self, output):
        return parse_balancer_stat(output)


def parse_balancer_stat(output: list[str], backend: str = BACKEND) -> dict:
    """BalancerServers' output -> its value: the `@@missing` / `@@rc N` tags the command adds,
    around socat's answer, which `show_stat_servers` reads."""
    lines = [line.rstrip() for line in output if line.strip()]
    if lines == ["@@missing"]:
        return {"status": "missing", "servers": {}}
    rc = lines.pop() if lines and lines[-1].startswith("@@rc ") else "@@rc ?"
    servers = show_stat_servers(lines, backend) if rc == "@@rc 0" else None
    if servers is None:
        why = " ".join(lines)[-300:] or (f"socat exited {rc[5:]}" if output else NO_ANSWER)
        return {"status": "failed", "servers": {}, "error": why}
    return {"status": "ok", "servers": servers}


def servers_down(servers: dict) -> list[str]:
    """The instances the balancer sends nothing to: not UP (DOWN, MAINT, DRAIN, NOLB...)."""
    return [name for name, row in servers.items() if not row.get("status", "").startswith("UP")]
