"""`specdeploy releases add` with a local wheel writes a table into the user's directory, and
`specdeploy check` then accepts a pin of that release; `releases list` shows it."""

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.unit.release_wheels import FILES_034, wheel

REPO = Path(__file__).resolve().parents[2]


def run(*args, cwd, releases):
    env = {**os.environ, "SPECDEPLOY_RELEASES_DIR": str(releases)}
    return subprocess.run(
        [sys.executable, "-m", "specdeploy.cli", *args],
        cwd=cwd, capture_output=True, text=True, env=env,
    )  # fmt: skip


def test_add_a_local_wheel_then_check_uses_its_table(tmp_path):
    releases = tmp_path / "user-releases"
    (tmp_path / "group_data").mkdir()
    (tmp_path / "group_data" / "all.py").write_text(
        'vllm_version = "0.35.0"\ntarget_model = "t/t"\ngpu_memory_utilization = 0.9\n'
        'speculative_config = {"method": "draft_model", "model": "d/d", '
        '"num_speculative_tokens": 3}\n'
    )
    (tmp_path / "inv.py").write_text('hosts = ["h1"]\n')
    before = run("check", "inv.py", cwd=tmp_path, releases=releases)
    assert before.returncode == 1
    assert "h1: vllm_version: vLLM 0.35.0 has no release table" in before.stdout
    assert "specdeploy releases add 0.35.0" in before.stdout

    path = wheel(tmp_path, FILES_034, version="0.35.0")
    wrong = run("releases", "add", "0.36.0", "--wheel", str(path), cwd=tmp_path, releases=releases)
    assert wrong.returncode == 1 and "is vllm 0.35.0, not 0.36.0" in wrong.stderr
    added = run("releases", "add", "0.35.0", "--wheel", str(path), cwd=tmp_path, releases=releases)
    assert added.returncode == 0, added.stderr
    assert "0.35.0 vs 0.34.0:" in added.stdout  # reviewed against the newest packaged table
    table = json.loads((releases / "0.35.0.json").read_text())
    assert table["model_runners"]["v1"] is False and set(table["builds"]) == {"vllm"}

    after = run("check", "inv.py", cwd=tmp_path, releases=releases)
    assert after.returncode == 0, after.stdout + after.stderr
    assert "1 host(s) valid." in after.stdout
    (tmp_path / "group_data" / "all.py").write_text(
        (tmp_path / "group_data" / "all.py").read_text().replace('"d/d",', '"d/d", "seed": 1,')
    )  # the fake wheel's SpeculativeConfig has no such key: checked against the added table
    unknown = run("check", "inv.py", cwd=tmp_path, releases=releases)
    assert "h1: speculative_config.seed: unknown key for vLLM 0.35.0" in unknown.stdout

    listed = run("releases", "list", cwd=tmp_path, releases=releases)
    assert f"0.35.0 ({releases / '0.35.0.json'})" in listed.stdout
    assert "0.34.0 (packaged)" in listed.stdout


def test_check_passes_each_release_the_issue_names(tmp_path):
    (tmp_path / "group_data").mkdir()
    (tmp_path / "group_data" / "all.py").write_text(
        'target_model = "t/t"\ngpu_memory_utilization = 0.9\n'
        'speculative_config = {"method": "draft_model", "model": "d/d", '
        '"num_speculative_tokens": 2}\n'
    )
    versions = ["0.27.1", "0.29.0", "0.30.0", "0.34.0"]
    hosts = ", ".join(f'("h{v}", {{"vllm_version": "{v}"}})' for v in versions)
    (tmp_path / "inv.py").write_text(f"hosts = [{hosts}]\n")
    result = run("check", "inv.py", cwd=tmp_path, releases=tmp_path / "none")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().splitlines() == ["4 host(s) valid."]  # no warning either


def test_add_into_a_folder_check_does_not_read_says_so(tmp_path):
    """`--out` elsewhere than the package's tables or the user's directory: the table is written
    and the command says check will not read it there (it raised KeyError after writing)."""
    path = wheel(tmp_path, FILES_034, version="0.35.0")
    out = tmp_path / "elsewhere"
    added = run("releases", "add", "0.35.0", "--wheel", str(path), "--out", str(out),
                cwd=tmp_path, releases=tmp_path / "user")  # fmt: skip
    assert added.returncode == 0, added.stderr
    assert (out / "0.35.0.json").exists() and "not that folder" in added.stdout


def recipe() -> str:
    """The command CONTRIBUTING.md's "a new vLLM release" row gives a contributor."""
    text = (REPO / "CONTRIBUTING.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| a new vLLM release |"))
    return next(span for span in row.split("`")[1::2] if span.startswith("specdeploy releases add"))


def test_contributing_sends_a_new_release_to_releases_add_into_the_package(tmp_path):
    """CONTRIBUTING's recipe is the product's `specdeploy releases add` writing into the package's
    own tables (not a benchmark script, not the user's directory): followed in a copy of the
    checkout's tables, with a local wheel instead of a download, it writes the table there and
    prints its comparison with the previous release."""
    import shlex
    import shutil

    from specdeploy.cli import commands as cli
    from specdeploy.releases import capabilities

    words = shlex.split(recipe().replace("X.Y.Z", "0.35.0"))
    args = cli.build_parser().parse_args(words[1:])
    assert (args.func, args.version) == (cli.cmd_releases_add, "0.35.0")
    assert args.out and (REPO / args.out).resolve() == capabilities.packaged_dir().resolve()

    checkout = tmp_path / "checkout"
    shutil.copytree(capabilities.packaged_dir(), checkout / args.out)
    path = wheel(tmp_path, FILES_034, version="0.35.0")
    added = run(*words[1:], "--wheel", str(path), cwd=checkout, releases=tmp_path / "user")
    assert added.returncode == 0, added.stderr
    assert "0.35.0 vs 0.34.0:" in added.stdout
    assert json.loads((checkout / args.out / "0.35.0.json").read_text())["release"] == "0.35.0"
    assert not (tmp_path / "user").exists()  # nothing into the user's directory
