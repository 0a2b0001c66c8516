"""Sandbox fleet: local test hosts running real systemd + sshd in systemd-nspawn.

Public API (wired to `specdeploy-sandbox up|status|down`):

* :func:`up` -- idempotently bring N hosts up, start the sandbox services
  (`specdeploy_sandbox.services.start` when available) and write the state.
* :func:`status` -- per-host liveness and `systemctl is-system-running`.
* :func:`down` -- tear everything down; safe after a crash.
* :func:`reboot` -- reboot one host (its root boots again, /run is new).
* :func:`state_path` -- where the state JSON lives.

State file (`$SPECDEPLOY_STATE_DIR`, default `/run/specdeploy/sandbox`,
`/state.json`) keys: `prefix`, `bridge`, `bridge_ip`, `subnet`,
`ssh_key`, `ssh_pubkey`, `known_hosts`, `hosts` (list of `name`,
`address`, `netns`, `root`, `nspawn_pid`, `veth`, `dir`,
`host_pubkey`, `system_state`, `failed_units`), `services` (what
`services.start` returned, also merged at top level), `state_dir`,
`cache_dir`, `base_rootfs`, `created`, `updated`.
"""

from __future__ import annotations

import inspect
import ipaddress
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from . import hosts as _hosts
from . import rootfs as _rootfs
from . import state as _state
from .hosts import SandboxError

log = logging.getLogger(__name__)

__all__ = ["up", "status", "down", "reboot", "state_path", "load_state", "SandboxError"]

# Keys that belong to the fleet itself; services may not overwrite them.
_CORE_KEYS = {
    "prefix", "bridge", "bridge_ip", "subnet", "ssh_key", "ssh_pubkey", "known_hosts",
    "hosts", "state_dir", "cache_dir", "base_rootfs", "created", "updated", "services",
    "services_error",
}  # fmt: skip


def state_path() -> Path:
    return _state.state_path()


def load_state() -> dict | None:
    return _state.load()


def _services():
    try:
        from . import services  # type: ignore[attr-defined]
    except ImportError:
        return None
    return services


def _call_service(fn, st: dict, **kwargs):
    """Call services.start/stop/status with (state) or (state, bridge_ip), and `kwargs`."""
    try:
        params = [
            p
            for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
        ]
    except (TypeError, ValueError):
        params = []
    if len(params) >= 2:
        return fn(st, st["bridge_ip"], **kwargs)
    return fn(st, **kwargs)


def _check_root() -> None:
    if os.geteuid() != 0:
        raise SandboxError("the sandbox needs root (network namespaces, mounts, cgroups)")


def _new_state(prefix: str) -> dict:
    sdir = _state.state_dir()
    subnet = _hosts.pick_subnet()
    key, pub = _hosts.ensure_ssh_key(sdir)
    return {
        "prefix": prefix,
        "bridge": _hosts.bridge_name(prefix),
        "subnet": str(subnet),
        "bridge_ip": str(subnet.network_address + 1),
        "ssh_key": str(key),
        "ssh_pubkey": pub,
        "known_hosts": str(sdir / "known_hosts"),
        "hosts": [],
        "state_dir": str(sdir),
        "cache_dir": str(_rootfs.cache_dir()),
        "created": time.time(),
    }


def _services_enabled(services: bool | None) -> bool:
    if services is not None:
        return services
    return os.environ.get("SPECDEPLOY_SANDBOX_SERVICES", "1").lower() not in (
        "0",
        "no",
        "false",
        "off",
    )


def up(hosts: int = 3, services: bool | None = None, assets: str = "tests") -> dict:
    """Bring `hosts` sandbox hosts up (idempotent) and return the state dict.

    Hosts already running are kept; missing or dead ones are (re)created in
    parallel; hosts beyond `hosts` are removed. Then, unless `services` is
    False (default: env `SPECDEPLOY_SANDBOX_SERVICES`, on), calls
    `specdeploy_sandbox.services.start(state)` when that exists and merges
    the dict it returns into the state (top level and under `services`).
    If services fail, the hosts stay up, the state file is written with
    `services_error` and :class:`SandboxError` is raised. `assets`: what the
    services fetch and build, "tests" (everything) or "demo" (only what the
    demo deploys; `services.wanted`).
    """
    if hosts < 1:
        raise ValueError("hosts must be >= 1")
    _check_root()
    t0 = time.monotonic()
    with _state.locked():
        st = _state.load()
        if st and st.get("bridge") not in _hosts.list_links():
            log.info("state file is stale (bridge %s gone); cleaning up", st.get("bridge"))
            _teardown(st)
            st = None
        if not st:
            # Crash leftovers from earlier runs owned by this state dir.
            for p in _hosts.owned_prefixes():
                log.info("removing leftovers of %s", p)
                _hosts.teardown_prefix(p)
        with _hosts.alloc_lock():
            if not st:
                st = _new_state(_hosts.new_prefix())
                _hosts.mark_owner(st["prefix"])
                _state.save(st)  # early, so a crash below can still be cleaned up
            # Re-derive the key fields (state dir may hold a regenerated key).
            key, pub = _hosts.ensure_ssh_key(Path(st["ssh_key"]).parent)
            st["ssh_pubkey"] = pub
            prefix = st["prefix"]
            subnet = ipaddress.ip_network(st["subnet"])
            _hosts.ensure_bridge(prefix, st["bridge_ip"], subnet)

        svc = _services() if _services_enabled(services) else None
        with ThreadPoolExecutor(max_workers=1) as assets_pool:  # waits for it, even on errors
            return _up_hosts_and_services(st, hosts, svc, assets, assets_pool, t0)


def _up_hosts_and_services(st, hosts, svc, assets, assets_pool, t0) -> dict:
    """The rest of `up`, under its lock: the services' assets are fetched and built on
    `assets_pool` while the image is made and the hosts boot (neither needs the other)."""
    prefix = st["prefix"]
    prepared = None
    if svc is not None and hasattr(svc, "prepare_assets"):
        prepared = assets_pool.submit(svc.prepare_assets, assets=assets)
    log.info("image: Debian base root filesystem (debootstrap once, then cached) ...")
    base = _rootfs.ensure_base()  # debootstrap (cached) before the parallel part
    log.info("image: ready (%.0fs)", time.monotonic() - t0)
    st["base_rootfs"] = str(base)
    if svc is not None:  # hosts' apt source: the gateway's Debian repository
        st["debian_repo_url"] = svc.debian_repo_url(st)

    by_index = {h["index"]: h for h in st.get("hosts", [])}
    keep, extra = {}, []
    for idx, h in by_index.items():
        if idx <= hosts and _hosts.host_alive(h):
            keep[idx] = h
        elif idx > hosts:
            extra.append(h)
    for h in extra:
        log.info("%s: removing (fleet shrinks to %d)", h["name"], hosts)
        _hosts.teardown_host(prefix, h["name"], h.get("nspawn_pid"))
    todo = [i for i in range(1, hosts + 1) if i not in keep]
    log.info("hosts: %d to start, %d running ...", len(todo), len(keep))

    def bring_up(idx: int) -> dict:
        return _hosts.create_host(st, idx)

    created: list[dict] = []
    errors: list[BaseException] = []
    if todo:
        with ThreadPoolExecutor(max_workers=len(todo)) as ex:
            for fut in [ex.submit(bring_up, i) for i in todo]:
                try:
                    created.append(fut.result())
                except BaseException as e:
                    errors.append(e)
    st["hosts"] = sorted(list(keep.values()) + created, key=lambda h: h["index"])
    _hosts.write_known_hosts(st)
    _state.save(st)
    if errors:
        raise SandboxError(f"{len(errors)} host(s) failed to start: {errors[0]}") from errors[0]

    def ready(h: dict) -> dict:
        h["system_state"] = _hosts.wait_ready(st, h["name"], h["address"], h["nspawn_pid"])
        h["failed_units"] = (
            _hosts.failed_units(st, h["address"]) if h["system_state"] == "degraded" else []
        )
        return h

    with ThreadPoolExecutor(max_workers=len(st["hosts"])) as ex:
        futs = [ex.submit(ready, h) for h in st["hosts"]]
        for f in futs:
            try:
                f.result()
            except BaseException as e:
                errors.append(e)
    st["updated"] = time.time()
    _state.save(st)
    if errors:
        raise SandboxError(f"{len(errors)} host(s) did not boot: {errors[0]}") from errors[0]
    log.info("sandbox %s: %d host(s) up in %.1fs", prefix, len(st["hosts"]), time.monotonic() - t0)

    if svc is not None and hasattr(svc, "start"):
        st.pop("services_error", None)
        try:
            if prepared is not None:
                prepared.result()
            done = {"ensure_assets": False} if prepared is not None else {}
            extra_state = _call_service(svc.start, st, assets=assets, **done) or {}
        except Exception as e:
            st["services_error"] = f"{type(e).__name__}: {e}"
            _state.save(st)
            raise SandboxError(f"sandbox hosts are up, but services.start failed: {e}") from e
        st["services"] = dict(extra_state)
        for k, v in extra_state.items():
            if k not in _CORE_KEYS:
                st[k] = v
        _state.save(st)
    return st


def status() -> dict:
    """Per-host status (name, address, running, alive) plus services' state."""
    st = _state.load()
    if not st:
        return {"up": False, "state_path": str(state_path()), "hosts": []}
    out_hosts = []

    def one(h: dict) -> dict:
        alive = _hosts.host_alive(h)
        running = _hosts.system_state(st, h) if alive else "down"
        return {
            "name": h["name"],
            "address": h["address"],
            "nspawn_pid": h.get("nspawn_pid"),
            "alive": alive,
            "running": running,
        }

    with ThreadPoolExecutor(max_workers=max(1, len(st.get("hosts", [])))) as ex:
        out_hosts = list(ex.map(one, st.get("hosts", [])))
    res = {
        "up": bool(out_hosts) and all(h["alive"] for h in out_hosts),
        "state_path": str(state_path()),
        "prefix": st["prefix"],
        "bridge": st["bridge"],
        "bridge_ip": st["bridge_ip"],
        "subnet": st["subnet"],
        "hosts": out_hosts,
        "services": st.get("services", {}),
    }
    svc = _services()
    if svc is not None and hasattr(svc, "status"):
        try:
            res["services_status"] = _call_service(svc.status, st)
        except Exception as e:
            res["services_status"] = {"error": str(e)}
    return res


def reboot(name: str) -> dict:
    """Reboot host `name` of the running fleet and wait until it is up again; returns its state."""
    with _state.locked():
        st = _state.load()
        h = next((h for h in (st or {}).get("hosts", []) if h["name"] == name), None)
        if h is None:
            raise SandboxError(f"{name}: no such host in {state_path()}")
        h["nspawn_pid"] = _hosts.reboot_host(st, h)
        h["system_state"] = _hosts.system_state(st, h)
        st["updated"] = time.time()
        _state.save(st)
        return h


def _teardown(st: dict | None) -> None:
    prefixes = set(_hosts.owned_prefixes())
    env = os.environ.get("SPECDEPLOY_SANDBOX_PREFIX")
    if env:
        prefixes.add(env)
    if st:
        svc = _services()
        if svc is not None and hasattr(svc, "stop"):
            try:
                _call_service(svc.stop, st)
            except Exception as e:
                log.warning("services.stop failed: %s", e)
        prefixes.discard(st["prefix"])
        _hosts.teardown_prefix(st["prefix"], st.get("hosts", []))
    for p in sorted(prefixes):
        _hosts.teardown_prefix(p)


def down() -> None:
    """Tear the fleet down. Idempotent; also cleans leftovers after a crash."""
    _check_root()
    with _state.locked():
        st = _state.load()
        _teardown(st)
        _state.remove()
        kh = Path(st["known_hosts"]) if st else _state.state_dir() / "known_hosts"
        if kh.exists():
            kh.unlink()
