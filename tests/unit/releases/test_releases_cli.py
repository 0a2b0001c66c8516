"""`specdeploy releases add` with a local wheel writes a table into the user's directory, and
`specdeploy check` then accepts a pin of that release; `releases list` shows it."""

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from tests.unit import REPO
from tests.unit.releases.release_wheels import FILES_034, wheel


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


def recipe_row() -> str:
    """CONTRIBUTING.md's "a new vLLM release" row: what a contributor is told to do."""
    text = (REPO / "CONTRIBUTING.md").read_text()
    return next(line for line in text.splitlines() if line.startswith("| a new vLLM release |"))


def recipe_spans(prefix: str = "", suffix: str = "") -> list[str]:
    """The row's code spans that start with `prefix` and end with `suffix`."""
    spans = recipe_row().split("`")[1::2]
    return [s for s in spans if s.startswith(prefix) and s.endswith(suffix)]


def checkout_copy(into: Path) -> Path:
    """What the recipe touches and the tests that judge it: the package, its sandbox (the CLI
    reference documents both commands), the manual, CONTRIBUTING.md, the release tests."""
    skip = shutil.ignore_patterns("__pycache__")
    for folder in ("specdeploy", "templates", "sandbox", "docs"):
        shutil.copytree(REPO / folder, into / folder, symlinks=True, ignore=skip)
    tests = ["__init__.py", "unit/__init__.py", "unit/releases/__init__.py",
             "unit/releases/test_release_index.py",
             "unit/releases/test_release_docs.py"]  # fmt: skip
    for name in ["CONTRIBUTING.md", *(f"tests/{t}" for t in tests)]:
        (into / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, into / name)
    return into


def test_a_new_release_by_contributings_recipe_alone(tmp_path):
    """CONTRIBUTING's recipe for a new vLLM release, followed step by step in a copy of the
    checkout with nothing else known: `releases add` into the package's tables (a local wheel of
    a fake 0.35.0 for the download), the release added to the index, the reference regenerated.
    Then the product accepts the release as one of its own (check: valid, no borrowed table) and
    the repository's release tests pass unedited: the index covers it as packaged, the reference
    is the generator's output and has its section and upgrade path."""
    checkout = checkout_copy(tmp_path / "checkout")
    env = {**os.environ, "PYTHONPATH": f"{checkout}{os.pathsep}{checkout / 'sandbox'}",
           "SPECDEPLOY_RELEASES_DIR": str(tmp_path / "user")}  # fmt: skip

    def follow(command: str) -> subprocess.CompletedProcess:
        words = shlex.split(command)
        words[:1] = [sys.executable, "-m", "specdeploy.cli"] if words[0] == "specdeploy" else [
            sys.executable]  # fmt: skip
        done = subprocess.run(words, cwd=checkout, capture_output=True, text=True, env=env)
        assert done.returncode == 0, f"{command}: {done.stdout}{done.stderr}"
        return done

    # 1. read the table from the release's wheels into the package's tables, and review it
    (add,) = recipe_spans("specdeploy releases add X.Y.Z")
    (have_wheel,) = recipe_spans("--wheel ")
    wheel_path = wheel(tmp_path, FILES_034, version="0.35.0")
    added = follow(
        f"{add.replace('X.Y.Z', '0.35.0')} {have_wheel.replace('FILE', str(wheel_path))}"
    )
    assert "0.35.0 vs 0.34.0:" in added.stdout  # the comparison to review
    # 2. add the release to the index the tables must cover
    (index_name,) = recipe_spans(suffix="index.json")
    index_path = checkout / index_name
    index = json.loads(index_path.read_text())
    index["packages"]["vllm"].append("0.35.0")
    index_path.write_text(json.dumps(index, indent=1) + "\n")
    # 3. regenerate the reference
    (regenerate,) = recipe_spans("python -m specdeploy.docs.reference")
    follow(regenerate)

    # the product knows 0.35.0 as its own release
    assert (
        json.loads((checkout / add.split("--out ")[1] / "0.35.0.json").read_text())["release"]
        == "0.35.0"
    )
    assert not (tmp_path / "user").exists()  # nothing into the user's directory
    (checkout / "group_data").mkdir()
    (checkout / "group_data" / "all.py").write_text(
        'vllm_version = "0.35.0"\ntarget_model = "t/t"\ngpu_memory_utilization = 0.9\n'
        'speculative_config = {"method": "draft_model", "model": "d/d", '
        '"num_speculative_tokens": 2}\n'
    )
    (checkout / "inv.py").write_text('hosts = ["h1"]\n')
    assert follow("specdeploy check inv.py").stdout.strip().splitlines() == ["1 host(s) valid."]
    page = (checkout / "docs" / "reference" / "releases.md").read_text()
    assert "\n## 0.35.0\n" in page and "## Upgrading a fleet from 0.34.0 to 0.35.0" in page
    tests = follow("python -m pytest -q -p no:cacheprovider --noconftest "
                   "tests/unit/releases/test_release_index.py "
                   "tests/unit/releases/test_release_docs.py")  # fmt: skip
    assert " passed" in tests.stdout and "failed" not in tests.stdout


def test_the_recipe_names_no_other_way():
    """A new release goes through `releases add` only: no script of the benchmarks."""
    row = recipe_row()
    assert "benchmarks/" not in row and "extract" not in row
    assert recipe_spans("specdeploy releases add X.Y.Z --out specdeploy/")
