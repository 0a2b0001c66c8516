"""The health poll: one command per poll, its output read back (server.poll_command, parse_poll)."""

from __future__ import annotations

import os
import subprocess

import pytest

from specdeploy import server
from specdeploy.config import config_from_data


@pytest.mark.parametrize(
    "curl_status, output, expected",
    [
        (0, "healthy\n", (True, "active", 0)),
        (7, "activating\n2\n", (False, "activating", 2)),
        (7, "failed\n0\n", (False, "failed", 0)),
    ],
)
def test_one_command_says_healthy_or_the_units_state_and_restarts(
    tmp_path, valid_data, curl_status, output, expected
):
    """The command runs in a shell with curl and systemctl stand-ins on PATH: when /health
    answers, systemctl is not asked at all."""
    state, restarts = (output.split() + ["", ""])[:2] if curl_status else ("", "")
    (tmp_path / "curl").write_text(f"#!/bin/sh\nexit {curl_status}\n")
    (tmp_path / "systemctl").write_text(
        "#!/bin/sh\n"
        'echo "$@" >> "$LOG"\n'
        f'case "$1" in is-active) echo {state}; exit 3;; show) echo {restarts};; esac\n'
    )
    for name in ("curl", "systemctl"):
        (tmp_path / name).chmod(0o755)
    cfg = config_from_data(valid_data)
    log = tmp_path / "log"
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "LOG": str(log)}
    done = subprocess.run(
        ["sh", "-c", server.poll_command(cfg, "specdeploy-vllm.service")],
        capture_output=True,
        text=True,
        env=env,
    )
    assert server.parse_poll(done.stdout) == expected
    asked = log.read_text().splitlines() if log.exists() else []
    if curl_status == 0:
        assert asked == []
    else:
        assert asked == [
            "is-active specdeploy-vllm.service",
            "show -p NRestarts --value specdeploy-vllm.service",
        ]


def test_no_output_is_an_unknown_state():
    assert server.parse_poll("") == (False, "unknown", 0)
