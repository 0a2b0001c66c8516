"""`specdeploy status` on a whole box (host data `instances`): one entry per instance, read like a
single server on its own port and units (status.HostProbe.read_server), and the local balancer:
its unit, its config against the host data, /health on vllm_port, and each backend as HAProxy's
runtime socket lists it (the `BalancerServers` fact). A drained or down instance is a problem:
the host answers with less than its capacity."""

from __future__ import annotations

import hashlib

from specdeploy.host.facts.files import FileSha1
from specdeploy.host.facts.haproxy import BalancerServers, servers_down
from specdeploy.host.facts.http import HttpGet
from specdeploy.host.facts.nvidia import GpuMemory
from specdeploy.host.facts.systemd import ServiceShow
from specdeploy.host.server import curl_config
from specdeploy.observe.rows import (
    BACKEND_FIELDS,
    BackendServer,
    BalancerStatus,
    HostStatus,
    InstanceStatus,
)
from specdeploy.render import instances
from specdeploy.render.control import arm_of
from specdeploy.render.units import render_balancer
from specdeploy.steps.servers import available_devices


def read_box(probe, cfg, row: HostStatus) -> None:
    """Each instance and the balancer, into the host's row."""
    problems = row.problems
    probe.step = "reading the instances"
    layout = instances.expand(cfg, available_devices(cfg, probe.fact))
    problems += [f"instances: {p}" for p in layout.problems]
    gpus = probe.fact(GpuMemory)
    row.gpu = gpus
    probe.prime([member.cfg for member in layout.instances])
    row.instances = []
    names = [member.name for member in layout.instances]
    for member in layout.instances:
        own: list[str] = []
        server = probe.read_server(member.cfg, own, role=arm_of(cfg, names, member.name,
                                                                "speculative"))  # fmt: skip
        entry = InstanceStatus(member.name, member.port, member.devices_text, own, server)
        if member.device_kind == "gpus":
            entry.gpu = [g for g in gpus if g["index"] in member.devices]
        problems += [f"{member.name}: {p}" for p in own]
        row.instances.append(entry)
    row.balancer = balancer = read_balancer(probe, cfg, layout, problems)
    members = row.instances
    row.healthy = bool(members) and all(e.server.healthy for e in members) and balancer.healthy
    row.matches_unit = all(e.server.matches_unit for e in members) and not balancer.config_drift


def read_balancer(probe, cfg, layout, problems: list[str]) -> BalancerStatus:
    probe.step = "reading the balancer"
    unit = cfg.balancer_unit
    show = probe.fact(ServiceShow, unit=unit)
    stat = probe.fact(BalancerServers, socket=cfg.balancer_socket)
    health = probe.fact(HttpGet, url=f"{cfg.base_url}/health", timeout=5, _stdin=curl_config(cfg))
    config, _ = render_balancer(cfg, layout.instances)
    sha = probe.fact(FileSha1, path=config.path)
    drift = (
        sha
        if sha in ("missing", "unreadable")
        else (sha != hashlib.sha1(config.text.encode()).hexdigest())
    )
    servers = {
        name: BackendServer(**{k: row.get(k) for k in BACKEND_FIELDS})
        for name, row in stat["servers"].items()
    }
    down = servers_down(stat["servers"])
    result = BalancerStatus(
        unit=unit,
        active=show.get("ActiveState"),
        restarts=int(show["NRestarts"]) if show.get("NRestarts", "").isdigit() else None,
        since=show.get("ActiveEnterTimestamp") or None,
        health=health["http"],
        stat=stat["status"],
        servers=servers,
        up=len(servers) - len(down),
        total=len(servers),
        config_drift=drift,
    )
    if result.active != "active":
        problems.append(f"balancer {unit} is {result.active} ({show.get('SubState')})")
    if health["http"] != 200:
        answer = health["http"] or health["body"][-200:] or "no answer"
        problems.append(f"balancer {cfg.base_url}/health: {answer}")
    if stat["status"] == "missing":
        problems.append(f"balancer: no admin socket at {cfg.balancer_socket}")
    elif stat["status"] != "ok":
        problems.append(f"balancer: show stat failed: {stat.get('error')}")
    for name in down:
        row = stat["servers"][name]
        why = row.get("check_desc") or row.get("check_status") or ""
        problems.append(f"balancer: {name} is {row.get('status')}" + (f" ({why})" if why else ""))
    missing = [m.name for m in layout.instances if stat["status"] == "ok" and m.name not in servers]
    if missing:
        problems.append(f"balancer: no backend server for {', '.join(missing)}")
    if drift == "unreadable":
        problems.append(f"{config.path} (root-only) is unreadable: set _sudo in host data")
    elif drift:
        problems.append(
            f"{config.path} "
            + ("is missing" if drift == "missing" else "differs from the host data")
        )
    result.healthy = result.active == "active" and health["http"] == 200 and not down
    return result
