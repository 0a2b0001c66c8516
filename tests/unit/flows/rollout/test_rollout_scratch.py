"""`specdeploy rollout`'s scratch directory (issue 36, item 9): each batch's pyinfra run leaves its
failed hosts' notes there. On a shared bastion another user can pre-create a predictable
/tmp/specdeploy-rollout-<pid>-<n> or plant a link there, so it comes from `tempfile.mkdtemp`
(0700, a fresh name, never reused) and is removed after its batch however the batch ended."""

from __future__ import annotations

import os
import stat
import tempfile
from io import StringIO
from pathlib import Path

import pytest

from specdeploy.flows import rollout
from specdeploy.report import notes
from specdeploy.steps import rollback
from tests.unit.flows.rollout.fake_pyinfra import limited


@pytest.fixture
def two_hosts(tmp_path, monkeypatch):
    """A rollout of h1 then h2 with $TMPDIR in tmp_path, and the old predictable paths of both
    batches already planted there as links to another user's directory (returned)."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # so tempfile reads $TMPDIR again
    monkeypatch.setattr(rollout, "inventory_hosts", lambda inventory: [("h1", []), ("h2", [])])
    monkeypatch.setattr(rollout, "fleet_pins", lambda inventory, names: {})
    planted = tmp_path / "another-users-dir"
    planted.mkdir()
    for batch in (1, 2):
        (tmp_path / f"specdeploy-rollout-{os.getpid()}-{batch}").symlink_to(planted)
    return planted


def fake_pyinfra(monkeypatch, seen: list[Path], fail: set[str], raise_on: str | None = None):
    """pyinfra for one batch: checks the scratch directory it is handed, and for a failing host
    leaves its note there the way steps/rollback.py does (through `_report`)."""

    def run(command, env):
        scratch = Path(env[notes.ROLLOUT_REPORT_ENV])
        seen.append(scratch)
        assert scratch.is_dir() and not scratch.is_symlink()
        assert stat.S_IMODE(scratch.lstat().st_mode) == 0o700
        assert scratch.stat().st_uid == os.getuid()
        (host,) = limited(command, [("h1", []), ("h2", [])])
        if host == raise_on:
            raise KeyboardInterrupt
        if host in fail:
            monkeypatch.setenv(notes.ROLLOUT_REPORT_ENV, str(scratch))
            rollback._report({"host": host, "cause": "health check failed", "rolled_back": True})
        return 1 if host in fail else 0

    return run


def test_each_batch_gets_a_private_fresh_scratch_dir_never_a_planted_one(two_hosts, monkeypatch):
    seen: list[Path] = []
    run = fake_pyinfra(monkeypatch, seen, fail={"h2"})
    out = StringIO()
    code = rollout.roll_out("inv.py", "deploys/serve.py", canary_group=None, out=out, run=run)
    assert code == 1
    assert "FAILED host h2: rolled back" in out.getvalue()  # the note was read back
    assert len(seen) == 2 and seen[0] != seen[1]
    assert all(p.name.startswith("specdeploy-rollout-") for p in seen)
    assert not any(p.exists() for p in seen)  # removed after each batch, passed or failed
    assert list(two_hosts.iterdir()) == []  # nothing written through the planted links


def test_the_scratch_dir_is_removed_when_the_batch_is_interrupted(two_hosts, monkeypatch):
    seen: list[Path] = []
    run = fake_pyinfra(monkeypatch, seen, fail=set(), raise_on="h1")
    with pytest.raises(KeyboardInterrupt):
        rollout.roll_out("inv.py", "deploys/serve.py", canary_group=None, out=StringIO(), run=run)
    assert len(seen) == 1 and not seen[0].exists()
