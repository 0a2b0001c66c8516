"""The balancer's `show stat` beyond its fact fixtures (tests/facts/BalancerServers/: HAProxy
2.6's own answers, tests/unit/data/haproxy-2.6/README.md): which instances are out, the backend
asked for, and the fact's command run locally against a socket that answers with a recorded one
(the quoting, socat's exit code)."""

from __future__ import annotations

import socket
import subprocess
import threading

import pytest

from specdeploy.host.facts.haproxy import BalancerServers, servers_down, show_stat_servers
from tests.facts import fixture


def answer(case: str) -> list[str]:
    """The socket's recorded answer in the fixture: its output without the command's @@rc line."""
    output = fixture("BalancerServers", case)["output"]
    assert output[-1] == "@@rc 0"
    return output[:-1]


@pytest.mark.parametrize("case", ["drained", "drained_and_down", "maint"])
def test_servers_down_are_the_instances_not_up(case):
    assert servers_down(fixture("BalancerServers", "both_up")["fact"]["servers"]) == []
    assert servers_down(fixture("BalancerServers", case)["fact"]["servers"]) == [
        "specdeploy-vllm-0"
    ]


def test_only_the_backend_asked_for():
    assert show_stat_servers(answer("both_up"), backend="other") == {}
    assert show_stat_servers(["socat: Connection refused"]) is None  # not show stat's CSV
    assert show_stat_servers([]) is None


@pytest.mark.needs_tool("socat")
def test_command_against_a_socket(tmp_path):
    path = tmp_path / "admin.sock"
    recorded = ("\n".join(answer("drained")) + "\n").encode()
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen(1)
    asked = []

    def serve():
        conn, _ = server.accept()
        asked.append(conn.recv(100))
        conn.sendall(recorded)
        conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    command = BalancerServers().command(socket=str(path))
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=20)
    thread.join(5)
    server.close()
    assert asked == [b"show stat\n"]
    assert out.stdout.splitlines() == fixture("BalancerServers", "drained")["output"]
    missing = BalancerServers().command(socket=str(tmp_path / "none.sock"))
    out = subprocess.run(["sh", "-c", missing], capture_output=True, text=True, timeout=20)
    assert BalancerServers().process(out.stdout.splitlines())["status"] == "missing"
