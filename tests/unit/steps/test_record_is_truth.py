"""The record's last verified unit is the truth (issue 36 items 2, 4, 5): an installed unit the
record never verified is rolled back when it fails, even when this run swapped nothing in (an
earlier run died between its swap and its health check); a rollback enables the restored unit and
only it; `on_fail: "fail"` raises before the record is written; a rollout's failure note never
follows a link planted at its name. The real rollback and lifecycle code run; only the host's
commands are recorded and answered (host/on_host is the one way they reach a host)."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from types import SimpleNamespace

import pytest

from specdeploy.config.record import UnitRef
from specdeploy.config.schema import config_from_data
from specdeploy.host import server
from specdeploy.render.units import RenderedUnit
from specdeploy.report import notes
from specdeploy.steps import rollback, verify

VERIFIED = "[Service]\nExecStart=/venv/old/bin/python -m vllm.entrypoints.openai.api_server\n"
UNVERIFIED = "[Service]\nExecStart=/venv/new/bin/python -m vllm.entrypoints.openai.api_server\n"


class NothingToSwap:
    """A re-run's UnitChange after an interrupted one: installed == rendered, nothing to apply."""

    def pending(self):
        return False

    def changed(self):
        return False

    def apply(self):
        return False


@pytest.fixture
def on_host(monkeypatch, valid_data):
    """The host as host/server.py sees it: files by path, every command recorded."""
    cfg = config_from_data(valid_data)
    name = cfg.unit_names["baseline"]
    files = {cfg.unit_path(name): UNVERIFIED, cfg.kept_unit_path(name): VERIFIED}
    commands: list[str] = []
    monkeypatch.setattr(server, "read_text", lambda path, missing_ok=False: files.get(path))
    monkeypatch.setattr(server, "sh", lambda command, **kw: commands.append(command) or "")
    monkeypatch.setattr(server, "is_active", lambda unit: "active")
    monkeypatch.setattr(server, "wait_healthy", lambda cfg, unit, speculative: {
        "seconds_to_healthy": 1.0})  # fmt: skip
    monkeypatch.setattr(rollback, "host", SimpleNamespace(name="h1", print_prefix="[h1] ",
                                                       noop=lambda text: None))  # fmt: skip
    monkeypatch.setattr(rollback, "GATE", rollback.RolloutGate())
    monkeypatch.setattr(rollback.lock, "release_now", lambda cfg: commands.append("release"))
    monkeypatch.setattr(rollback.lock, "renew_held", lambda seconds: None)
    rendered = RenderedUnit(name=name, text=UNVERIFIED, argv=[], role="baseline",
                            path=cfg.unit_path(name))  # fmt: skip
    return SimpleNamespace(cfg=cfg, rendered=rendered, commands=commands, files=files)


def unhealthy(cfg, rendered):
    raise RuntimeError("not healthy after 30s")


def rerun_after_interruption(on_host):
    """This run swaps nothing in; the record last verified VERIFIED; the new config fails."""
    verified = UnitRef(name=on_host.rendered.name, sha256=sha256(VERIFIED), argv=[])
    rollback.verify_or_rollback(unhealthy, on_host.cfg, on_host.rendered, change=NothingToSwap(),
                                verified=verified)  # fmt: skip


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_an_unverified_unit_left_by_an_interrupted_run_is_rolled_back(on_host):
    with pytest.raises(rollback.RolledBack, match="ROLLED BACK"):
        rerun_after_interruption(on_host)
    kept = on_host.cfg.kept_unit_path(on_host.rendered.name)
    assert any(kept in c and "systemctl restart" in c for c in on_host.commands)
    assert on_host.commands[-1] == "release"


def test_an_unverified_unit_is_restarted_before_it_is_verified(on_host):
    # the earlier run may have been cut off after its swap and before its restart: the process
    # running is then the old unit's, and its health would prove nothing about the installed one
    seen: list[list[str]] = []
    verified = UnitRef(name=on_host.rendered.name, sha256=sha256(VERIFIED), argv=[])
    rollback.verify_or_rollback(lambda cfg, rendered: seen.append(list(on_host.commands)),
                                on_host.cfg, on_host.rendered, change=NothingToSwap(),
                                verified=verified)  # fmt: skip
    assert any(f"systemctl restart {on_host.rendered.name}" in c for c in seen[0])


def test_a_verified_unit_that_runs_is_not_restarted(on_host):
    on_host.files[on_host.cfg.unit_path(on_host.rendered.name)] = VERIFIED
    verified = UnitRef(name=on_host.rendered.name, sha256=sha256(VERIFIED), argv=[])
    rollback.verify_or_rollback(lambda cfg, rendered: None, on_host.cfg, on_host.rendered,
                                change=NothingToSwap(), verified=verified)  # fmt: skip
    assert not any("systemctl restart" in c for c in on_host.commands)


def test_a_failing_unit_the_record_verified_is_not_replaced(on_host):
    on_host.files[on_host.cfg.unit_path(on_host.rendered.name)] = VERIFIED
    with pytest.raises(RuntimeError, match="not healthy") as raised:
        rerun_after_interruption(on_host)
    assert not isinstance(raised.value, rollback.RolledBack)
    assert not any("systemctl restart" in c for c in on_host.commands)


def test_a_rollback_enables_the_restored_unit_and_disables_the_other(on_host):
    with pytest.raises(rollback.RolledBack):
        rerun_after_interruption(on_host)
    restored, other = on_host.rendered.name, on_host.cfg.unit_names["speculative"]
    restore = next(c for c in on_host.commands if "systemctl enable" in c)
    assert f"systemctl enable -q {restored}" in restore and "systemctl restart" in restore
    assert any(f"systemctl disable {other}" in c for c in on_host.commands)


def test_after_a_gate_fall_back_a_failed_change_goes_back_to_the_recorded_baseline(on_host):
    # the record serves with the baseline (the gate fell back); this run re-gates a changed
    # speculative unit, which fails its health check: the baseline comes back, enabled alone,
    # and the kept copy of the speculative unit (the one the gate rejected) is not restored
    cfg, commands = on_host.cfg, on_host.commands
    speculative, baseline = cfg.unit_names["speculative"], cfg.unit_names["baseline"]
    on_host.files[cfg.unit_path(baseline)] = VERIFIED
    rendered = RenderedUnit(name=speculative, text=UNVERIFIED, argv=[], role="speculative",
                            path=cfg.unit_path(speculative))  # fmt: skip
    recorded = UnitRef(name=baseline, sha256=sha256(VERIFIED), argv=[])
    with pytest.raises(rollback.RolledBack, match=f"{baseline} runs"):
        rollback.verify_or_rollback(unhealthy, cfg, rendered, change=NothingToSwap(),
                                    verified=recorded)  # fmt: skip
    assert not any(f"mv -f {cfg.unit_path(speculative)}" in c for c in commands)
    assert any(f"systemctl disable -q {speculative}" in c for c in commands)
    assert any(f"systemctl enable -q {baseline}" in c for c in commands)
    assert any(f"systemctl restart {baseline}" in c for c in commands)
    # the speculative unit was started to be verified; the rejected copy kept of it never returns
    kept, installed = cfg.kept_unit_path(speculative), cfg.unit_path(speculative)
    assert not any(kept in c and installed in c for c in commands)


def test_on_fail_fail_raises_before_the_record_is_written(monkeypatch, valid_data):
    cfg = config_from_data(valid_data)
    written = []
    decision = SimpleNamespace(passed=False, on_fail="fail", reason="acceptance 0.1 < 0.3")
    monkeypatch.setattr(verify, "host", SimpleNamespace(name="h1", get_fact=lambda *a, **k: None))
    monkeypatch.setattr(verify.smoke, "health_and_smoke", lambda *a: ({}, None, {}))
    ends_on = lambda cfg, rendered, checked, *a, **k: (rendered, checked, decision)  # noqa: E731
    monkeypatch.setattr(verify.gate, "unit_it_ends_on", ends_on)
    monkeypatch.setattr(verify.install, "prune_venvs", lambda cfg: [])
    monkeypatch.setattr(verify.record, "write_record", lambda *a, **k: written.append(k))
    with pytest.raises(verify.gate.GateFailed, match="acceptance 0.1"):
        preflight = SimpleNamespace(
            tokenizer=None, snapshots={}, result=SimpleNamespace(hardware={})
        )
        verify.verify_and_record(cfg, object(), 0.0, preflight=preflight, pinned_release=None)
    assert written == []


def test_a_rollout_note_replaces_a_planted_link_and_is_root_only(tmp_path, monkeypatch):
    monkeypatch.setenv(notes.ROLLOUT_REPORT_ENV, str(tmp_path))
    target = tmp_path / "elsewhere"
    target.write_text("untouched")
    (tmp_path / "h1.json").symlink_to(target)
    rollback._report({"host": "h1", "cause": "boom"})
    assert target.read_text() == "untouched"
    note = tmp_path / "h1.json"
    assert not note.is_symlink() and json.loads(note.read_text())["cause"] == "boom"
    assert stat.S_IMODE(os.stat(note).st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "h1.json"]


def test_a_rollout_note_never_creates_its_directory(tmp_path, monkeypatch):
    missing = tmp_path / "not-made-by-the-rollout"
    monkeypatch.setenv(notes.ROLLOUT_REPORT_ENV, str(missing))
    monkeypatch.setattr(rollback, "host", SimpleNamespace(name="h1", print_prefix="[h1] "))
    rollback._report({"host": "h1", "cause": "boom"})  # logged, never raised over the failure
    assert not missing.exists()


def test_check_warns_of_a_gate_that_can_never_pass(valid_data):
    """A gate of 2 + 2 runs (accepted on 832dc5f without a word) never reaches p = 0.05: it
    always falls back; 3 + 3 can, and a shared gate sizes its own runs."""
    from specdeploy.checks.host_data import check_warnings

    def gate_warnings(**gate):
        data = {**valid_data, "speculation_gate": gate}
        return [w for w in check_warnings("h1", data) if w.field == "speculation_gate.runs"]

    (warning,) = gate_warnings(runs=2, on_fail="baseline")
    assert "smallest p is 0.167" in str(warning) and "'baseline'" in str(warning)
    assert gate_warnings(runs=3) == []
    assert gate_warnings(runs=2, share=True) == []


def test_pip_options_pip_cannot_read_from_its_file_are_refused(valid_data):
    """pip_install_args reach pip as a requirements file (`-r`): --no-deps there stops pip on
    every host (832dc5f accepted it)."""
    from specdeploy.checks.host_data import check_host

    def problems(args):
        found = check_host("h1", {**valid_data, "pip_install_args": args})
        return [str(p) for p in found if p.field == "pip_install_args"]

    (problem,) = problems(["--no-deps", "--index-url", "https://idx/simple"])
    assert problem.startswith("h1: pip_install_args: --no-deps: pip does not take")
    assert problems(["--index-url=https://u:t@idx/simple", "--pre", "-f", "/wheels"]) == []


def test_the_pip_file_options_are_the_installed_pips():
    from pip._internal.req import req_file

    from specdeploy.checks.host_data import PIP_FILE_OPTIONS

    pips = set()
    for make in (*req_file.SUPPORTED_OPTIONS, *req_file.SUPPORTED_OPTIONS_REQ):
        option = make()
        pips |= {*option._long_opts, *option._short_opts}
    assert pips == PIP_FILE_OPTIONS
