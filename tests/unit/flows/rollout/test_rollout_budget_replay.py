"""The failure budget replayed on a live rollout (issue 37): tests/integration/test_rollout.py::
test_a_ramp_goes_on_past_a_failed_host_within_its_failure_budget records its progress file (each
batch's hosts, pyinfra's exit code and every host's note as the deploy wrote it) in
data/replays/rollout_budget/. The real controller runs on those batches: it must make the same
batches and the same decisions (the broken host failed and counted, the rollout goes on to the
third, finished, exit 1); with no budget the same notes must stop it before the third host."""

from __future__ import annotations

import json
from io import StringIO

from specdeploy.flows import rollout
from specdeploy.report import notes
from tests.unit.flows.rollout.fake_pyinfra import limited
from tests.unit.replays import load, recording


def replay(monkeypatch, tmp_path, **kw):
    """roll_out over the recorded batches: ([--limit hosts per batch], exit code, progress)."""
    path = recording("rollout_budget")
    recorded = load(path / "progress.json")
    canary = recorded["canary"]
    hosts = [(h, ["canary"] if h in canary else []) for h in recorded["hosts"]]
    monkeypatch.setattr(rollout, "inventory_hosts", lambda inventory: hosts)
    monkeypatch.setattr(rollout, "fleet_pins", lambda inventory, names: recorded["pins"])
    batches = iter(recorded["log"])
    limits = []

    def run(command, env):
        batch = next(batches)
        limits.append(limited(command, hosts))
        assert limits[-1] == batch["hosts"]
        monkeypatch.setenv(notes.ROLLOUT_REPORT_ENV, env[notes.ROLLOUT_REPORT_ENV])
        for entry in batch["notes"].values():
            notes.note(entry)
        return batch["exit_code"]

    settings = {"batches": recorded["batches"], "max_fail_percent": recorded["max_fail_percent"]}
    code = rollout.roll_out("inventory.py", recorded["deploy"], out=StringIO(), run=run,
                            progress_path=tmp_path / "p.json", **settings | kw)  # fmt: skip
    return recorded, limits, code, json.loads((tmp_path / "p.json").read_text())


def test_the_recorded_rollout_makes_the_same_batches_and_decisions(monkeypatch, tmp_path):
    recorded, limits, code, progress = replay(monkeypatch, tmp_path)
    assert limits == [batch["hosts"] for batch in recorded["log"]]
    assert code == 1 and progress["finished"] is True and progress["stopped"] is None
    assert progress["state"] == recorded["state"]  # each host's outcome, cause and batch
    failed = [h for h, s in progress["state"].items() if s["state"] == "failed"]
    assert len(failed) == 1 and "not healthy" in progress["state"][failed[0]]["cause"]
    assert progress["state"][failed[0]]["after"].startswith("rolled back to its previous unit")


def test_without_the_budget_the_same_notes_stop_the_rollout_before_the_third_host(
    monkeypatch, tmp_path
):
    recorded, limits, code, progress = replay(monkeypatch, tmp_path, max_fail_percent=0)
    third = recorded["hosts"][-1]
    assert code == 1 and progress["stopped"] and not progress["finished"]
    assert third not in [h for batch in limits for h in batch]
    assert progress["state"][third]["state"] == "pending"
