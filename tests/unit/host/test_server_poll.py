"""The health poll: one host command waits until the server answers, fails or restarts
(server.poll_command), its output read back (parse_poll)."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from specdeploy.config.schema import config_from_data
from specdeploy.host import server


def run_poll(tmp_path, valid_data, *, curl: str, state: str, restarts: int, at_start: int = 0):
    """poll_command in a shell with curl and systemctl stand-ins on PATH; (parsed, log, seconds)."""
    (tmp_path / "curl").write_text(f"#!/bin/sh\n{curl}\n")
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
    started = time.monotonic()
    command = server.poll_command(cfg, "specdeploy-vllm.service", restarts_at_start=at_start)
    done = subprocess.run(
        ["sh", "-c", command],
        capture_output=True,
        text=True,
        env=env,
        timeout=server.POLL_SLICE_S + 10,
    )
    asked = log.read_text().splitlines() if log.exists() else []
    return server.parse_poll(done.stdout), asked, time.monotonic() - started


def test_a_server_already_up_is_healthy_without_asking_systemd(tmp_path, valid_data):
    parsed, asked, _ = run_poll(tmp_path, valid_data, curl="exit 0", state="active", restarts=0)
    assert parsed == (True, "active", 0) and asked == []


def test_the_host_keeps_looking_until_health_answers(tmp_path, valid_data):
    """/health answers on the third look: one command, a fraction of a second per look."""
    count = tmp_path / "count"
    curl = f'n=$(cat {count} 2>/dev/null || echo 0); echo $((n + 1)) > {count}; [ "$n" -ge 2 ]'
    parsed, asked, seconds = run_poll(tmp_path, valid_data, curl=curl, state="activating",
                                      restarts=0)  # fmt: skip
    assert parsed == (True, "active", 0)
    assert count.read_text().strip() == "3" and len(asked) == 4  # two looks at the unit
    assert seconds < 3


@pytest.mark.parametrize(
    "state, restarts, at_start, expected",
    [
        ("failed", 0, 0, (False, "failed", 0)),
        ("activating", 2, 1, (False, "activating", 2)),  # systemd restarted it: a crash loop
    ],
)
def test_a_failed_or_restarted_unit_ends_the_wait_at_once(
    tmp_path, valid_data, state, restarts, at_start, expected
):
    parsed, asked, seconds = run_poll(tmp_path, valid_data, curl="exit 7", state=state,
                                      restarts=restarts, at_start=at_start)  # fmt: skip
    assert parsed == expected and seconds < 3
    assert asked[-2:] == [
        "is-active specdeploy-vllm.service",
        "show -p NRestarts --value specdeploy-vllm.service",
    ]


def test_a_server_still_starting_is_reported_after_one_slice(tmp_path, valid_data, monkeypatch):
    monkeypatch.setattr(server, "POLL_SLICE_S", 1)
    parsed, _, seconds = run_poll(tmp_path, valid_data, curl="exit 7", state="activating",
                                  restarts=0)  # fmt: skip
    assert parsed == (False, "activating", 0) and 0.9 < seconds < 3


def test_no_output_is_an_unknown_state():
    assert server.parse_poll("") == (False, "unknown", 0)
