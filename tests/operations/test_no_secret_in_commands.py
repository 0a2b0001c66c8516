"""Index and mirror URLs (which may carry a token) reach the host only on stdin, into root 0600
files: no scheduled command of any operation fixture may contain them (issue 36 item 9)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.operations import harness

FIXTURES = harness.cases()
# host data whose values may hold credentials
SECRET_KEYS = ("pip_install_args", "hf_endpoint", "hf_token")


def secret_values(host_data: dict) -> list[str]:
    values: list[str] = []
    for key in SECRET_KEYS:
        value = host_data.get(key)
        values += value if isinstance(value, list) else [value] if value else []
    return [v for v in values if not v.startswith("-")]  # option names are no secret


def test_the_planted_tokens_are_in_fixtures():
    """The check below must look at fixtures that plant a token, or it proves nothing."""
    planted = [f for f in FIXTURES if "plantedTOKEN" in f.read_text()]
    calls = {json.loads(f.read_text())["call"] for f in planted}
    assert {"install:prepare_host", "install:install_vllm"} <= calls
    assert {"weights:download_token", "weights:fetch_weights"} <= calls


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_no_secret_in_any_command(fixture: Path):
    case = json.loads(fixture.read_text())
    scheduled = json.dumps(case.get("operations", []))
    for value in secret_values(case.get("host_data", {})):
        assert value not in scheduled, f"{fixture.name}: {value!r} is in a command"
