"""The balancer fact from HAProxy 2.6's own answers (data/haproxy-2.6/README.md), and its command
run locally against a socket that answers with a recorded one (the quoting, socat's exit code)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
from pathlib import Path

import pytest

from specdeploy.host.facts.haproxy import BalancerServers, parse_balancer_stat, servers_down

DATA = Path(__file__).parent / "data" / "haproxy-2.6"


def recorded(name: str) -> list[str]:
    """The fact command's output when the socket answered with the recorded `show stat`."""
    return (DATA / name).read_text().splitlines() + ["@@rc 0"]


def test_both_up():
    got = parse_balancer_stat(recorded("both_up.csv"))
    assert got["status"] == "ok"
    servers = got["servers"]
    assert list(servers) == ["specdeploy-vllm-0", "specdeploy-vllm-1"]  # no FRONTEND/BACKEND
    assert servers["specdeploy-vllm-0"]["status"] == "UP"
    assert servers["specdeploy-vllm-0"]["check_status"] == "L7OK"
    assert servers["specdeploy-vllm-1"]["addr"] == "127.0.0.1:8393"
    assert servers_down(servers) == []


@pytest.mark.parametrize(
    "name, status, check",
    [
        ("drained.csv", "DRAIN", "L7OK"),
        ("drained_and_down.csv", "DOWN", "L4CON"),
        ("maint.csv", "MAINT", None),
    ],
)
def test_one_out(name, status, check):
    servers = parse_balancer_stat(recorded(name))["servers"]
    first = servers["specdeploy-vllm-0"]
    assert first["status"] == status and first.get("check_status") == check
    assert servers["specdeploy-vllm-1"]["status"] == "UP"
    assert servers_down(servers) == ["specdeploy-vllm-0"]


def test_other_backend_and_failures():
    assert parse_balancer_stat(recorded("both_up.csv"), backend="other")["servers"] == {}
    assert parse_balancer_stat(["@@missing"]) == {"status": "missing", "servers": {}}
    refused = ["2026/12/01 13:40:00 socat[1] E connect(5, AF=1 ...): Connection refused", "@@rc 1"]
    got = parse_balancer_stat(refused)
    assert got["status"] == "failed" and "Connection refused" in got["error"]
    assert parse_balancer_stat(["@@rc 1"])["error"] == "socat exited 1"


@pytest.mark.skipif(not shutil.which("socat"), reason="socat is not installed here")
def test_command_against_a_socket(tmp_path):
    path = tmp_path / "admin.sock"
    answer = (DATA / "drained.csv").read_bytes()
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen(1)
    asked = []

    def serve():
        conn, _ = server.accept()
        asked.append(conn.recv(100))
        conn.sendall(answer)
        conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    command = BalancerServers().command(socket=str(path))
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=20)
    thread.join(5)
    server.close()
    assert asked == [b"show stat\n"]
    got = BalancerServers().process(out.stdout.splitlines())
    assert got["servers"]["specdeploy-vllm-0"]["status"] == "DRAIN"
    missing = BalancerServers().command(socket=str(tmp_path / "none.sock"))
    out = subprocess.run(["sh", "-c", missing], capture_output=True, text=True, timeout=20)
    assert BalancerServers().process(out.stdout.splitlines())["status"] == "missing"
