"""Sandbox hosts: systemd-nspawn containers booting real systemd + sshd.

Each host gets

* an overlayfs root (lower = the shared extracted base rootfs, upper/work per
  host, under `$SPECDEPLOY_CACHE/hosts/<prefix>/<name>`) plus a disk-backed
  `/tmp` bind mount,
* a network namespace `<name>` holding `eth0` (a veth whose peer is
  enslaved to the bridge `<prefix>br` in the root namespace). There is no
  default route inside: the only reachable network is the bridge subnet,
* a fresh ssh host key and root's `authorized_keys` from the sandbox key,
* its own cgroup `<prefix>/<name>` in the `name=systemd` (v1) and the
  unified (v2) hierarchies, entered before `exec systemd-nspawn`.

Everything created is named with the run's prefix, so teardown can also find
leftovers after a crash. Only processes inside our own cgroups, or
`systemd-nspawn --machine=<prefix>-...` processes, are ever signalled.
"""

from __future__ import annotations

import fcntl
import ipaddress
import json
import logging
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

from . import debian_repo, rootfs
from . import state as state_mod

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_HIERARCHIES = ("systemd", "unified")
NSPAWN_PROPAGATE = Path("/run/systemd/nspawn/propagate")
PREFIX_RE = re.compile(r"^[a-z][a-z0-9]{1,9}$")
BOOT_TIMEOUT = float(os.environ.get("SPECDEPLOY_SANDBOX_BOOT_TIMEOUT", "120"))

# Popen objects of nspawn processes started by this Python process (to reap).
_children: dict[int, subprocess.Popen] = {}


class SandboxError(RuntimeError):
    pass


# --------------------------------------------------------------------------- utils


def run(cmd: list[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    p = subprocess.run(cmd, **kw)
    if check and p.returncode != 0:
        raise SandboxError(
            f"command failed ({p.returncode}): {' '.join(cmd)}\n{(p.stderr or '').strip()}"
        )
    return p


def hosts_root() -> Path:
    return rootfs.cache_dir() / "hosts"


def prefix_dir(prefix: str) -> Path:
    return hosts_root() / prefix


def host_dir(prefix: str, name: str) -> Path:
    return prefix_dir(prefix) / name


def bridge_name(prefix: str) -> str:
    return f"{prefix}br"


def host_name(prefix: str, index: int) -> str:
    return f"{prefix}-h{index}"


def veth_name(prefix: str, index: int) -> str:
    return f"{prefix}v{index}"


def host_index(prefix: str, name: str) -> int:
    m = re.fullmatch(re.escape(prefix) + r"-h(\d+)", name)
    if not m:
        raise ValueError(f"not a host of {prefix}: {name}")
    return int(m.group(1))


def list_links() -> list[str]:
    out = run(["ip", "-j", "link", "show"]).stdout
    return [link["ifname"] for link in json.loads(out or "[]")]


def list_netns() -> list[str]:
    out = run(["ip", "-j", "netns", "list"], check=False).stdout
    try:
        return [n["name"] for n in json.loads(out or "[]")]
    except ValueError:
        return []


def new_prefix() -> str:
    env = os.environ.get("SPECDEPLOY_SANDBOX_PREFIX")
    if env:
        if not PREFIX_RE.match(env):
            raise SandboxError(
                f"SPECDEPLOY_SANDBOX_PREFIX={env!r}: need 2-10 chars [a-z0-9], "
                "starting with a letter"
            )
        return env
    taken = set(list_links()) | set(list_netns())
    existing = set(os.listdir(hosts_root())) if hosts_root().is_dir() else set()
    for _ in range(100):
        p = "sd" + secrets.token_hex(2)
        if p in existing or any(t.startswith(p) for t in taken):
            continue
        return p
    raise SandboxError("could not find a free sandbox prefix")


def pick_subnet() -> ipaddress.IPv4Network:
    """A random 10.x.y.0/24 that overlaps no route or address on this machine."""
    used: list[ipaddress.IPv4Network] = []
    routes = json.loads(run(["ip", "-j", "-4", "route", "show", "table", "all"]).stdout or "[]")
    for r in routes:
        dst = r.get("dst")
        if not dst or dst == "default":
            continue
        try:
            used.append(ipaddress.ip_network(dst if "/" in dst else dst + "/32", strict=False))
        except ValueError:
            pass
    for link in json.loads(run(["ip", "-j", "-4", "addr", "show"]).stdout or "[]"):
        for a in link.get("addr_info", []):
            try:
                used.append(
                    ipaddress.ip_network(f"{a['local']}/{a.get('prefixlen', 32)}", strict=False)
                )
            except (KeyError, ValueError):
                pass
    rng = secrets.SystemRandom()
    for _ in range(1000):
        net = ipaddress.ip_network(f"10.{rng.randint(100, 250)}.{rng.randint(0, 255)}.0/24")
        if not any(net.overlaps(u) for u in used):
            return net
    raise SandboxError("could not find a free 10.x.y.0/24 subnet")


@contextmanager
def alloc_lock():
    """Machine-wide lock around choosing a prefix/subnet and creating the bridge,
    so concurrent runs (different state dirs) never pick the same ones."""
    hosts_root().mkdir(parents=True, exist_ok=True)
    with open(hosts_root() / ".alloc.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def host_address(subnet: ipaddress.IPv4Network, index: int) -> str:
    return str(subnet.network_address + 10 + index)


# --------------------------------------------------------------------------- ssh


def ensure_ssh_key(sdir: Path) -> tuple[Path, str]:
    key = sdir / "id_ed25519"
    if not key.exists():
        sdir.mkdir(parents=True, exist_ok=True, mode=0o700)
        run(
            [
                "ssh-keygen",
                "-q",
                "-t",
                "ed25519",
                "-N",
                "",
                "-C",
                "specdeploy-sandbox",
                "-f",
                str(key),
            ]
        )
    os.chmod(key, 0o600)
    return key, (key.with_suffix(".pub")).read_text().strip()


def ssh_command(st: dict, address: str, *remote: str, connect_timeout: int = 3) -> list[str]:
    return [
        "ssh",
        "-F", "/dev/null",
        "-i", st["ssh_key"],
        "-o", "IdentitiesOnly=yes",
        "-o", "BatchMode=yes",
        "-o", "StrictHostKeyChecking=yes",
        "-o", f"UserKnownHostsFile={st['known_hosts']}",
        "-o", f"ConnectTimeout={connect_timeout}",
        "-o", "LogLevel=ERROR",
        f"root@{address}",
        *remote,
    ]  # fmt: skip


def write_known_hosts(st: dict) -> None:
    lines = [
        f"{h['address']} {h['host_pubkey']}" for h in st.get("hosts", []) if h.get("host_pubkey")
    ]
    kh = Path(st["known_hosts"])
    tmp = kh.with_suffix(".tmp")
    tmp.write_text("".join(line + "\n" for line in lines))
    os.replace(tmp, kh)


# --------------------------------------------------------------------------- network


def ensure_bridge(prefix: str, bridge_ip: str, subnet: ipaddress.IPv4Network) -> None:
    br = bridge_name(prefix)
    if br not in list_links():
        run(["ip", "link", "add", br, "type", "bridge", "stp_state", "0", "forward_delay", "0"])
    cidr = f"{bridge_ip}/{subnet.prefixlen}"
    addrs = run(["ip", "-4", "-o", "addr", "show", "dev", br]).stdout
    if cidr not in addrs:
        run(["ip", "addr", "add", cidr, "dev", br])
    run(["ip", "link", "set", br, "up"])


def delete_bridge(prefix: str) -> None:
    br = bridge_name(prefix)
    if br in list_links():
        run(["ip", "link", "del", br], check=False)


def setup_netns(prefix: str, name: str, address: str, subnet: ipaddress.IPv4Network) -> str:
    idx = host_index(prefix, name)
    veth, peer = veth_name(prefix, idx), f"{prefix}p{idx}"
    if name in list_netns():
        run(["ip", "netns", "del", name], check=False)
    links = list_links()
    for ln in (veth, peer):
        if ln in links:
            run(["ip", "link", "del", ln], check=False)
    run(["ip", "netns", "add", name])
    run(["ip", "link", "add", veth, "type", "veth", "peer", "name", peer])
    run(["ip", "link", "set", peer, "netns", name])
    run(["ip", "-n", name, "link", "set", peer, "name", "eth0"])
    run(["ip", "-n", name, "addr", "add", f"{address}/{subnet.prefixlen}", "dev", "eth0"])
    run(["ip", "-n", name, "link", "set", "lo", "up"])
    run(["ip", "-n", name, "link", "set", "eth0", "up"])
    run(["ip", "link", "set", veth, "master", bridge_name(prefix)])
    run(["ip", "link", "set", veth, "up"])
    return veth


# --------------------------------------------------------------------------- cgroups


def cgroup_dirs(prefix: str, name: str | None = None) -> list[Path]:
    rel = Path(prefix) / name if name else Path(prefix)
    return [CGROUP_ROOT / h / rel for h in CGROUP_HIERARCHIES if (CGROUP_ROOT / h).is_dir()]


def cgroup_pids(d: Path) -> set[int]:
    """All PIDs in cgroup `d` and its descendants."""
    pids: set[int] = set()
    if not d.is_dir():
        return pids
    for dirpath, _dirs, files in os.walk(d):
        if "cgroup.procs" in files:
            try:
                pids.update(int(x) for x in Path(dirpath, "cgroup.procs").read_text().split())
            except OSError:
                pass
    return pids


def remove_cgroup_tree(d: Path) -> None:
    if not d.is_dir():
        return
    for dirpath, _dirs, _files in os.walk(d, topdown=False):
        try:
            os.rmdir(dirpath)
        except OSError as e:
            log.warning("could not remove cgroup %s: %s", dirpath, e)


# --------------------------------------------------------------------------- processes


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _alive(pid: int) -> bool:
    """True when pid exists and is not a zombie (reaping our own children)."""
    child = _children.get(pid)
    if child is not None and child.poll() is not None:
        _children.pop(pid, None)
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def is_our_nspawn(pid: int, name: str) -> bool:
    cmd = _cmdline(pid)
    return (
        bool(cmd)
        and any(c.endswith("systemd-nspawn") for c in cmd[:1])
        and f"--machine={name}" in cmd
    )


def find_nspawn_pids(prefix: str) -> dict[int, str]:
    """systemd-nspawn processes with `--machine=<prefix>-...` (ours by name)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        cmd = _cmdline(int(entry))
        if not cmd or not cmd[0].endswith("systemd-nspawn"):
            continue
        for c in cmd:
            if c.startswith(f"--machine={prefix}-"):
                found[int(entry)] = c.split("=", 1)[1]
    return found


def container_init_pid(nspawn_pid: int) -> int | None:
    try:
        kids = Path(f"/proc/{nspawn_pid}/task/{nspawn_pid}/children").read_text().split()
    except OSError:
        return None
    return int(kids[0]) if kids else None


# --------------------------------------------------------------------------- mounts


def mounts_under(path: Path) -> list[str]:
    p = str(path).rstrip("/")
    res = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            mp = line.split()[4].replace("\\040", " ")
            if mp == p or mp.startswith(p + "/"):
                res.append(mp)
    return res


def is_mounted(path: Path) -> bool:
    return str(path).rstrip("/") in mounts_under(path)


# --------------------------------------------------------------------------- host lifecycle


def prepare_root(st: dict, name: str, address: str) -> tuple[Path, str]:
    """Mount the overlay and personalize it. Returns (root, host public key)."""
    prefix = st["prefix"]
    hd = host_dir(prefix, name)
    upper, work, root, tmp = hd / "upper", hd / "work", hd / "root", hd / "tmp"
    if is_mounted(root):
        run(["umount", str(root)], check=False)
    for d in (upper, work, root, tmp):
        d.mkdir(parents=True, exist_ok=True)
    os.chmod(tmp, 0o1777)
    base = rootfs.ensure_base()
    run(
        [
            "mount", "-t", "overlay", f"sd-{name}",
            "-o", f"lowerdir={base},upperdir={upper},workdir={work}",
            str(root),
        ]
    )  # fmt: skip
    etc = root / "etc"
    (etc / "hostname").write_text(name + "\n")
    (etc / "hosts").write_text(
        "127.0.0.1\tlocalhost\n"
        f"127.0.1.1\t{name}\n"
        f"{address}\t{name}\n"
        f"{st['bridge_ip']}\tsandbox-gateway\n"
        "::1\tlocalhost ip6-localhost ip6-loopback\n"
    )
    # ssh host key, fresh per host
    hk = etc / "ssh/ssh_host_ed25519_key"
    for k in (etc / "ssh").glob("ssh_host_*"):
        k.unlink()
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{name}", "-f", str(hk)])
    (etc / "ssh/sshd_config.d/10-specdeploy-hostkey.conf").write_text(
        "HostKey /etc/ssh/ssh_host_ed25519_key\n"
    )
    pub = hk.with_suffix(".pub").read_text().split()
    ssh_dir = root / "root/.ssh"
    ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(ssh_dir, 0o700)
    ak = ssh_dir / "authorized_keys"
    ak.write_text(st["ssh_pubkey"] + "\n")
    os.chmod(ak, 0o600)
    # The deploy user (created in the base image) logs in with the same sandbox key.
    home = root / "home" / rootfs.DEPLOY_USER
    uid, gid = home.stat().st_uid, home.stat().st_gid
    (home / ".ssh").mkdir(mode=0o700, exist_ok=True)
    (home / ".ssh/authorized_keys").write_text(st["ssh_pubkey"] + "\n")
    os.chmod(home / ".ssh/authorized_keys", 0o600)
    for path in (home / ".ssh", home / ".ssh/authorized_keys"):
        os.chown(path, uid, gid)
    # Packages come from the sandbox's Debian repository (the organisation's mirror of a real
    # fleet).
    apt_url = st.get("debian_repo_url")
    (etc / "apt/sources.list").write_text(debian_repo.sources_line(apt_url) if apt_url else "")
    return root, f"{pub[0]} {pub[1]}"


def start_nspawn(prefix: str, name: str, root: Path) -> int:
    hd = host_dir(prefix, name)
    cgs = cgroup_dirs(prefix, name)
    for d in cgs:
        d.mkdir(parents=True, exist_ok=True)
    enter = "".join(f"echo $$ > {d}/cgroup.procs && " for d in cgs)
    nspawn = [
        "systemd-nspawn",
        "--boot",
        f"--directory={root}",
        f"--machine={name}",
        f"--network-namespace-path=/run/netns/{name}",
        "--register=no",
        "--keep-unit",
        "--resolv-conf=off",
        "--timezone=off",
        "--link-journal=no",
        "--console=read-only",
        f"--bind={hd / 'tmp'}:/tmp",
    ]
    script = enter + "exec " + " ".join(nspawn)
    logf = open(hd / "console.log", "ab")
    try:
        p = subprocess.Popen(
            ["sh", "-c", script],
            stdin=subprocess.DEVNULL,
            stdout=logf,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    finally:
        logf.close()
    _children[p.pid] = p
    return p.pid


def wait_ready(st: dict, name: str, address: str, pid: int, timeout: float = BOOT_TIMEOUT) -> str:
    """Wait for sshd and a finished boot; return running/degraded."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if not _alive(pid):
            raise SandboxError(
                f"{name}: systemd-nspawn exited during boot:\n{console_tail(st['prefix'], name)}"
            )
        remaining = max(5, int(deadline - time.monotonic()))
        p = subprocess.run(
            ssh_command(st, address, f"timeout {remaining} systemctl is-system-running --wait"),
            capture_output=True,
            text=True,
            timeout=remaining + 10,
        )
        out = p.stdout.strip()
        if out in ("running", "degraded"):
            return out
        last = (out + " " + p.stderr.strip()).strip()
        time.sleep(0.3)
    raise SandboxError(
        f"{name}: not ready after {timeout:.0f}s (last: {last})\n{console_tail(st['prefix'], name)}"
    )


def reboot_host(st: dict, h: dict, timeout: float = BOOT_TIMEOUT) -> int:
    """Reboot one host the way a machine reboots: its systemd stops every unit, /run (and a deploy
    lock in it) is gone, and the same root boots again with the units enabled there. Inside, it
    is `systemctl reboot`; nspawn then exits 133, and the sandbox boots the root again (what
    systemd-nspawn@.service's RestartForceExitStatus=133 does; these hosts run unregistered).
    Returns the new nspawn pid (the caller records it)."""
    name, old = h["name"], h["nspawn_pid"]
    if not (_alive(old) and is_our_nspawn(old, name)):
        raise SandboxError(f"{name}: not running (nspawn pid {old}), nothing to reboot")
    # the ssh session ends with the container's sshd: its exit status says nothing
    subprocess.run(ssh_command(st, h["address"], "systemctl reboot"), capture_output=True,
                   timeout=30, check=False)  # fmt: skip
    if _wait_gone({old}, timeout):
        raise SandboxError(f"{name}: still running {timeout:.0f}s after systemctl reboot")
    pid = start_nspawn(st["prefix"], name, Path(h["root"]))
    wait_ready(st, name, h["address"], pid, timeout)
    return pid


def console_tail(prefix: str, name: str, n: int = 30) -> str:
    try:
        lines = (host_dir(prefix, name) / "console.log").read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


def create_host(st: dict, index: int) -> dict:
    """Bring one host up from scratch; returns its state record."""
    prefix = st["prefix"]
    subnet = ipaddress.ip_network(st["subnet"])
    name = host_name(prefix, index)
    address = host_address(subnet, index)
    t0 = time.monotonic()
    teardown_host(prefix, name)  # clear leftovers of an earlier incarnation
    veth = setup_netns(prefix, name, address, subnet)
    root, host_pub = prepare_root(st, name, address)
    pid = start_nspawn(prefix, name, root)
    rec = {
        "name": name,
        "index": index,
        "address": address,
        "netns": name,
        "veth": veth,
        "root": str(root),
        "dir": str(host_dir(prefix, name)),
        "nspawn_pid": pid,
        "host_pubkey": host_pub,
    }
    log.info("%s: started nspawn pid %d (%.1fs)", name, pid, time.monotonic() - t0)
    return rec


def failed_units(st: dict, address: str) -> list[str]:
    p = subprocess.run(
        ssh_command(st, address, "systemctl --failed --plain --no-legend --no-pager"),
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    return [line.split()[0] for line in p.stdout.splitlines() if line.strip()]


def host_alive(h: dict) -> bool:
    pid = h.get("nspawn_pid")
    return (
        bool(pid) and _alive(pid) and is_our_nspawn(pid, h["name"]) and is_mounted(Path(h["root"]))
    )


def system_state(st: dict, h: dict, timeout: int = 10) -> str:
    """`systemctl is-system-running` via ssh, falling back to nsenter."""
    try:
        p = subprocess.run(
            ssh_command(st, h["address"], "systemctl is-system-running"),
            capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        if p.stdout.strip():
            return p.stdout.strip()
    except subprocess.TimeoutExpired:
        pass
    pid = h.get("nspawn_pid")
    init = container_init_pid(pid) if pid and host_alive(h) else None
    if init:
        p = subprocess.run(
            ["nsenter", "-t", str(init), "-m", "-u", "-i", "-n", "-p",
             "systemctl", "is-system-running"],
            capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        if p.stdout.strip():
            return p.stdout.strip() + " (nsenter; ssh failed)"
    return "down"


# --------------------------------------------------------------------------- teardown


def _wait_gone(pids: set[int], timeout: float) -> set[int]:
    deadline = time.monotonic() + timeout
    while True:
        pids = {p for p in pids if _alive(p)}
        if not pids or time.monotonic() > deadline:
            return pids
        time.sleep(0.1)


def teardown_host(prefix: str, name: str, pid: int | None = None, grace: float = 15.0) -> None:
    """Stop one host and remove everything it had. Idempotent."""
    cgs = cgroup_dirs(prefix, name)
    # 1. SIGTERM nspawn (nspawn turns it into a clean poweroff of the container).
    nspawn_pids = {p for p, n in find_nspawn_pids(prefix).items() if n == name}
    if pid and _alive(pid) and is_our_nspawn(pid, name):
        nspawn_pids.add(pid)
    for p in nspawn_pids:
        try:
            os.kill(p, signal.SIGTERM)
        except ProcessLookupError:
            pass
    left = _wait_gone(nspawn_pids, grace)
    # 2. Anything still in our cgroups gets killed.
    unified = [d for d in cgs if d.parts[-3] == "unified"]
    for d in unified:
        if cgroup_pids(d) and (d / "cgroup.kill").exists():
            try:
                (d / "cgroup.kill").write_text("1")
            except OSError as e:
                log.warning("cgroup.kill on %s: %s", d, e)
    stragglers = set(left)
    for d in cgs:
        stragglers |= cgroup_pids(d)
    for p in stragglers:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    still = _wait_gone(stragglers, 10)
    if still:
        log.warning("%s: processes survived SIGKILL: %s", name, sorted(still))
    # 3. Unmount root and anything below the host dir.
    hd = host_dir(prefix, name)
    for mp in sorted(mounts_under(hd), key=len, reverse=True):
        if run(["umount", mp], check=False).returncode != 0:
            run(["umount", "-l", mp], check=False)
    # 4. Network namespace and veth.
    if name in list_netns():
        run(["ip", "netns", "del", name], check=False)
    try:
        idx = host_index(prefix, name)
        links = list_links()
        for ln in (veth_name(prefix, idx), f"{prefix}p{idx}"):
            if ln in links:
                run(["ip", "link", "del", ln], check=False)
    except ValueError:
        pass
    # nspawn's mount-propagation dir for this machine (normally removed by nspawn).
    prop = NSPAWN_PROPAGATE / name
    if prop.is_dir() and not mounts_under(prop):
        shutil.rmtree(prop, ignore_errors=True)
    # 5. cgroups, depth-first.
    for d in cgs:
        remove_cgroup_tree(d)
    # 6. Disk.
    if hd.exists() and not mounts_under(hd):
        shutil.rmtree(hd, ignore_errors=True)


def leftover_host_names(prefix: str) -> set[str]:
    """Hosts of `prefix` that left any trace: netns, cgroup, dir, process."""
    pat = re.compile(re.escape(prefix) + r"-h\d+$")
    names = {n for n in list_netns() if pat.match(n)}
    for d in cgroup_dirs(prefix):
        if d.is_dir():
            names |= {n for n in os.listdir(d) if pat.match(n)}
    pd = prefix_dir(prefix)
    if pd.is_dir():
        names |= {n for n in os.listdir(pd) if pat.match(n)}
    names |= {n for n in find_nspawn_pids(prefix).values() if pat.match(n)}
    return names


def teardown_prefix(prefix: str, known_hosts: list[dict] | None = None) -> None:
    """Remove every host, link, cgroup and directory of `prefix`."""
    from concurrent.futures import ThreadPoolExecutor

    pids = {h["name"]: h.get("nspawn_pid") for h in (known_hosts or [])}
    names = set(pids) | leftover_host_names(prefix)
    if names:
        with ThreadPoolExecutor(max_workers=max(1, len(names))) as ex:
            list(ex.map(lambda n: teardown_host(prefix, n, pids.get(n)), sorted(names)))
    for ln in list_links():
        if re.fullmatch(re.escape(prefix) + r"[vp]\d+", ln):
            run(["ip", "link", "del", ln], check=False)
    delete_bridge(prefix)
    for d in cgroup_dirs(prefix):
        remove_cgroup_tree(d)
    pd = prefix_dir(prefix)
    if pd.exists() and not mounts_under(pd):
        shutil.rmtree(pd, ignore_errors=True)


def owned_prefixes() -> set[str]:
    """Prefixes whose owner marker names this state dir (crash leftovers)."""
    res = set()
    hr = hosts_root()
    if not hr.is_dir():
        return res
    me = str(state_mod.state_dir().resolve())
    for p in os.listdir(hr):
        try:
            if (hr / p / "owner").read_text().strip() == me:
                res.add(p)
        except OSError:
            pass
    return res


def mark_owner(prefix: str) -> None:
    pd = prefix_dir(prefix)
    pd.mkdir(parents=True, exist_ok=True)
    (pd / "owner").write_text(str(state_mod.state_dir().resolve()) + "\n")


def leftovers(prefix: str) -> dict[str, list]:
    """What of `prefix` still exists on this machine (empty lists = clean)."""
    return {
        "netns": [n for n in list_netns() if n.startswith(prefix + "-")],
        "links": [ln for ln in list_links() if ln.startswith(prefix)],
        "mounts": mounts_under(prefix_dir(prefix)),
        "cgroups": [str(d) for d in cgroup_dirs(prefix) if d.exists()],
        "processes": sorted(find_nspawn_pids(prefix)),
        "dirs": ([str(prefix_dir(prefix))] if prefix_dir(prefix).exists() else [])
        + (
            [str(p) for p in NSPAWN_PROPAGATE.glob(prefix + "-*")]
            if NSPAWN_PROPAGATE.is_dir()
            else []
        ),
    }
