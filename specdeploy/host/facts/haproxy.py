"""What a whole box's local balancer (HAProxy) says about its instances: the `BalancerServers`
fact, read from `show stat` on HAProxy's runtime socket, and its parser; `specdeploy status` reads
it per host."""

from __future__ import annotations

import shlex

from specdeploy.host.facts.base import NO_ANSWER, Fact

BACKEND = "instances"  # the backend of templates/haproxy.cfg.j2


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
    """Parse BalancerServers' output (pure: recorded HAProxy 2.6 answers test it)."""
    lines = [line.rstrip() for line in output if line.strip()]
    if lines == ["@@missing"]:
        return {"status": "missing", "servers": {}}
    rc = lines.pop() if lines and lines[-1].startswith("@@rc ") else "@@rc ?"
    if rc != "@@rc 0" or not lines or not lines[0].startswith("# "):
        why = " ".join(lines)[-300:] or (f"socat exited {rc[5:]}" if output else NO_ANSWER)
        return {"status": "failed", "servers": {}, "error": why}
    columns = lines[0][2:].split(",")
    rows = [dict(zip(columns, line.split(","), strict=False)) for line in lines[1:]]
    servers = {
        row["svname"]: {key: value for key, value in row.items() if value and key != "-"}
        for row in rows
        if row.get("pxname") == backend and row.get("svname") not in ("FRONTEND", "BACKEND")
    }
    return {"status": "ok", "servers": servers}


def servers_down(servers: dict) -> list[str]:
    """The instances the balancer sends nothing to: not UP (DOWN, MAINT, DRAIN, NOLB...)."""
    return [name for name, row in servers.items() if not row.get("status", "").startswith("UP")]
