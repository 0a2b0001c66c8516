"""Detailed reports (generated text of production prompts) are the owner's alone: the reports
root is 0700, made so when it is created and closed where an older run left it open (issue 36
item 9)."""

from __future__ import annotations

import stat

from specdeploy.report import paths


def test_a_new_reports_root_is_private(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEPLOY_REPORTS", str(tmp_path / "reports"))
    assert paths.host_reports_dir("h1") == tmp_path / "reports" / "h1"
    assert stat.S_IMODE((tmp_path / "reports").stat().st_mode) == 0o700


def test_an_open_reports_root_is_closed(tmp_path, monkeypatch):
    root = tmp_path / "reports"
    root.mkdir(mode=0o755)
    root.chmod(0o755)
    monkeypatch.setenv("SPECDEPLOY_REPORTS", str(root))
    monkeypatch.setattr(paths, "_RUN_IDS", {})
    monkeypatch.setenv("SPECDEPLOY_RUN", "compare-test")
    assert paths.run_dir("compare") == root / "compare-test"
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
