"""The sandbox fleet itself: reachable with pyinfra, real systemd inside,
isolated network, and a teardown that leaves nothing behind."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(900)]


def test_pyinfra_connects_to_every_host(sandbox_fleet, pyinfra_sandbox):
    p = pyinfra_sandbox("exec", "--", "echo HOST=$(hostname) STATE=$(systemctl is-system-running)")
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    for h in sandbox_fleet["hosts"]:
        assert f"[{h['name']}] Connected" in out, out
        m = re.search(rf"\[{re.escape(h['name'])}\] HOST=(\S+) STATE=(\S+)", out)
        assert m, out
        assert m.group(1) == h["name"]
        assert m.group(2) in ("running", "degraded"), out
    assert re.search(
        rf"server\.shell.*\s{len(sandbox_fleet['hosts'])}\s+{len(sandbox_fleet['hosts'])}\s", out
    ), out


def test_pyinfra_strict_host_key_checking(sandbox_fleet, pyinfra_sandbox, tmp_path):
    """A wrong known_hosts entry must make pyinfra refuse to connect."""
    import json

    bad = dict(sandbox_fleet)
    alt_dir = tmp_path / "state"
    alt_dir.mkdir()
    kh = alt_dir / "known_hosts"
    # Same addresses, someone else's key.
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(alt_dir / "k")], check=True
    )
    other = (alt_dir / "k.pub").read_text().split()
    kh.write_text("".join(f"{h['address']} {other[0]} {other[1]}\n" for h in bad["hosts"]))
    bad["known_hosts"] = str(kh)
    (alt_dir / "state.json").write_text(json.dumps(bad))
    env = dict(os.environ, SPECDEPLOY_STATE_DIR=str(alt_dir))
    p = subprocess.run(
        ["pyinfra", "-y", "inventories/sandbox.py", "exec", "--", "true"],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert p.returncode != 0, p.stdout + p.stderr


def test_systemd_is_pid1_and_running(sandbox_fleet, sandbox_ssh):
    for h in sandbox_fleet["hosts"]:
        p = sandbox_ssh(
            h,
            "cat /proc/1/comm; systemctl is-system-running; "
            "systemctl is-active ssh dbus systemd-journald; "
            "findmnt -n -o FSTYPE /; hostname",
        )
        lines = p.stdout.split()
        assert lines[0] == "systemd", p.stdout + p.stderr
        assert lines[1] in ("running", "degraded"), p.stdout
        assert lines[2:5] == ["active"] * 3, p.stdout
        assert lines[5] == "overlay", p.stdout
        assert lines[6] == h["name"]


def test_units_of_hosts_have_separate_cgroups(sandbox_fleet):
    for h in sandbox_fleet["hosts"]:
        for hier in ("systemd", "unified"):
            d = Path("/sys/fs/cgroup", hier, sandbox_fleet["prefix"], h["name"])
            if not d.parent.parent.is_dir():
                continue
            assert d.is_dir(), d
            pids = set()
            for dirpath, _d, files in os.walk(d):
                if "cgroup.procs" in files:
                    pids |= set(Path(dirpath, "cgroup.procs").read_text().split())
            assert str(h["nspawn_pid"]) in pids


def test_tmp_usable_and_writable_root(sandbox_fleet, sandbox_ssh):
    h = sandbox_fleet["hosts"][0]
    p = sandbox_ssh(
        h,
        "set -e; f=$(mktemp); dd if=/dev/zero of=$f bs=1M count=64 status=none; "
        "stat -c %s $f; rm $f; touch /opt/specdeploy-write-test && rm /opt/specdeploy-write-test; "
        "df -B1G --output=avail / | tail -1; "
        # a plain host: python3 for pyinfra's facts, no python3-venv (the deploy installs it)
        "python3 -c 'print(42)'",
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert len(p.stdout.split()) == 3, p.stdout + p.stderr
    size, avail_gb, answer = p.stdout.split()
    assert int(size) == 64 * 1024 * 1024
    assert int(avail_gb) >= 10
    assert answer == "42"


def _listen(ip: str):
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((ip, 0))
    srv.listen(8)
    srv.settimeout(30)
    got = []

    def accept():
        try:
            while True:
                c, _ = srv.accept()
                got.append(c.recv(64))
                c.close()
        except OSError:
            pass

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    return srv, got


def test_network_only_bridge(sandbox_fleet, sandbox_ssh):
    """No default route; the bridge IP (where services listen) is reachable."""
    bridge_ip = sandbox_fleet["bridge_ip"]
    srv, got = _listen(bridge_ip)
    port = srv.getsockname()[1]
    try:
        for h in sandbox_fleet["hosts"]:
            p = sandbox_ssh(
                h,
                "ip -4 route show default | wc -l; ip -6 route show default | wc -l; "
                "ip route get 192.0.2.1 >/dev/null 2>&1 && echo routable || echo unreachable; "
                "ip route get 1.1.1.1 >/dev/null 2>&1 && echo routable || echo unreachable; "
                'python3 -c "import socket; '
                f"s=socket.create_connection(('{bridge_ip}', {port}), 5); "
                f"s.sendall(b'{h['name']}'); s.close(); print('bridge-ok')\"",
            )
            assert p.stdout.split() == ["0", "0", "unreachable", "unreachable", "bridge-ok"], (
                p.stdout + p.stderr
            )
        deadline = time.monotonic() + 5
        while len(got) < len(sandbox_fleet["hosts"]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sorted(got) == sorted(h["name"].encode() for h in sandbox_fleet["hosts"])
    finally:
        srv.close()


def test_hosts_reach_each_other(sandbox_fleet, sandbox_ssh):
    if len(sandbox_fleet["hosts"]) < 2:
        pytest.skip("needs 2 hosts")
    a, b = sandbox_fleet["hosts"][:2]
    p = sandbox_ssh(
        a,
        'python3 -c "import socket; '
        f"socket.create_connection(('{b['address']}', 22), 5); print('ok')\"",
    )
    assert p.stdout.strip() == "ok", p.stderr


def test_up_is_idempotent_and_fast(sandbox_fleet):
    import specdeploy_sandbox as sandbox

    t0 = time.monotonic()
    st = sandbox.up(len(sandbox_fleet["hosts"]), services=False)
    assert time.monotonic() - t0 < 15
    assert st["prefix"] == sandbox_fleet["prefix"]
    assert [h["nspawn_pid"] for h in st["hosts"]] == [
        h["nspawn_pid"] for h in sandbox_fleet["hosts"]
    ]
    s = sandbox.status()
    assert s["up"] is True
    assert all(h["running"] in ("running", "degraded") for h in s["hosts"]), s


def _assert_clean(prefix: str):
    from specdeploy_sandbox import hosts as sb_hosts

    left = sb_hosts.leftovers(prefix)
    assert left == {k: [] for k in left}, left
    # No namespace, mount, cgroup or process by any other means either.
    assert not [n for n in sb_hosts.list_netns() if n.startswith(prefix)]
    assert prefix not in Path("/proc/self/mountinfo").read_text()
    assert not any(Path("/sys/fs/cgroup", h, prefix).exists() for h in ("systemd", "unified"))
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert f"--machine={prefix}-" not in ps


@pytest.fixture
def private_state_dir(monkeypatch):
    """A separate state dir/prefix, so these tests never touch the session fleet."""
    d = Path(f"/run/specdeploy/sandbox-test-down-{os.getpid()}")
    monkeypatch.setenv("SPECDEPLOY_STATE_DIR", str(d))
    monkeypatch.delenv("SPECDEPLOY_SANDBOX_PREFIX", raising=False)
    yield d
    import specdeploy_sandbox as sandbox

    sandbox.down()  # belt and braces
    shutil.rmtree(d, ignore_errors=True)


def test_down_leaves_nothing(private_state_dir, sandbox_fleet):
    import specdeploy_sandbox as sandbox

    st = sandbox.up(2, services=False)
    prefix = st["prefix"]
    assert prefix != sandbox_fleet["prefix"]
    pids = [h["nspawn_pid"] for h in st["hosts"]]
    t0 = time.monotonic()
    sandbox.down()
    assert time.monotonic() - t0 < 60
    _assert_clean(prefix)
    for pid in pids:
        assert (
            not Path(f"/proc/{pid}").exists()
            or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
        )
    assert not sandbox.state_path().exists()
    sandbox.down()  # idempotent
    # The session fleet is untouched.
    for h in sandbox_fleet["hosts"]:
        assert Path(f"/proc/{h['nspawn_pid']}").exists()


def test_down_after_crash_without_state_file(private_state_dir):
    """A lost state file (crash) must not leak hosts: down finds them by prefix."""
    import specdeploy_sandbox as sandbox

    st = sandbox.up(1, services=False)
    prefix = st["prefix"]
    sandbox.state_path().unlink()  # simulate a crash that lost the state
    sandbox.down()
    _assert_clean(prefix)


def test_inventory_without_state_explains(tmp_path):
    env = dict(os.environ, SPECDEPLOY_STATE_DIR=str(tmp_path))
    p = subprocess.run(
        ["pyinfra", "-y", "inventories/sandbox.py", "exec", "--", "true"],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert p.returncode != 0
    assert "specdeploy-sandbox up" in p.stdout + p.stderr
