"""Every deploy step tested the way pyinfra tests its operations: one driver over
tests/operations/<step>/<case>.json (facts and the host's answers in; the operations the step
schedules, their commands or noop, and what it runs on the host, out). The fixture format is in
harness.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.operations import harness

CASES = harness.cases()
STEPS = Path(harness.FIXTURES.parents[1] / "specdeploy" / "steps")


@pytest.mark.parametrize(
    "path", CASES, ids=[p.relative_to(harness.FIXTURES).with_suffix("").as_posix() for p in CASES]
)
def test_step(path, monkeypatch, tmp_path):
    data = json.loads(path.read_text())
    data.setdefault("call", None)
    module, _, function = (data["call"] or "").partition(":")
    assert module == path.parent.name and function, (
        f"{path.name}: call must be '{path.parent.name}:<function>' (the step of its folder)"
    )
    got = harness.run_case(data, monkeypatch, tmp_path)
    if harness.WRITE:
        harness.write_back(path, data, got)
        return
    assert got["unread_facts"] == [], f"{path.name}: facts the step never reads"
    have, want = harness.compared(got, data)
    for key in harness.OUTPUTS:  # one output at a time, so the diff is readable
        assert have[key] == want[key], f"{path.name}: {key} differs"
    for op in have["operations"]:
        # pyinfra's convention, for specdeploy's own operations: no command, a noop saying why
        if op["op"].split(".")[0] in steps() and not op.get("commands") and not op.get("raised"):
            assert op.get("noop"), f"{op['name']}: scheduled no command and said no noop"


def steps() -> list[str]:
    """The modules of specdeploy/steps/ (the step folders here)."""
    return sorted(p.stem for p in STEPS.glob("*.py") if p.stem != "__init__")


def test_every_step_has_fixtures():
    assert steps(), STEPS
    missing = [s for s in steps() if not list((harness.FIXTURES / s).glob("*.json"))]
    assert missing == [], f"steps without tests/operations/<step>/*.json: {missing}"


def test_a_started_process_answers_its_pid():
    """A host command that starts a process in the background answers with its PID (`echo $!`),
    which later commands kill by: a fixture that answers anything else asserts commands no host
    would run (two once asserted `kill -TERM -{"choices": ...}`)."""
    wrong = [
        f"{path.relative_to(harness.FIXTURES)}: {call.get('out')!r}"
        for path in CASES
        for call in json.loads(path.read_text()).get("host", [])
        if call.get("sh", "").rstrip().endswith("echo $!; }")
        and not call.get("out", "").strip().isdigit()
    ]
    assert wrong == [], wrong
