"""`specdeploy check` and `render` on real pyinfra inventory files (no host is contacted)."""

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run(*args, cwd=REPO):
    return subprocess.run(
        [sys.executable, "-m", "specdeploy.cli", *args], cwd=cwd, capture_output=True, text=True
    )


def test_example_inventory_is_valid():
    result = run("check", "inventories/prod.py")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 host(s) valid." in result.stdout


def test_invalid_inventory_lists_every_problem_and_exits_1(tmp_path):
    (tmp_path / "group_data").mkdir()
    (tmp_path / "group_data" / "all.py").write_text(
        'vllm_version = "0.32.0"\ntarget_model = "t/t"\n'
        'speculative_config = {"method": "draft_model", "model": "d/d", '
        '"num_speculative_tokens": 2}\n'  # k <= 2: no graph-less draft warning on 0.32.0
    )
    (tmp_path / "inv.py").write_text(
        'good = ["h-good"]\n'
        'bad = [("h-bad", {"gpu_memory_utilization": 0.9, "kv_cache_memory_bytes": 10,'
        ' "vllm_extra_args": ["--num-speculative-tokens", "4"]})]\n'
    )
    result = run("check", "inv.py", cwd=tmp_path)
    assert result.returncode == 1
    lines = result.stdout.strip().splitlines()
    assert lines == [
        "h-bad: vllm_extra_args[0]: --num-speculative-tokens was removed from vLLM — "
        "put it in speculative_config "
        'instead: {"num_speculative_tokens": 4} '
        "(`specdeploy migrate -- vllm serve ...` converts a whole command line) "
        "(see docs/reference/host-data.md#vllm_extra_args)",
        lines[1],
    ]
    assert lines[1].startswith(
        "h-bad: gpu_memory_utilization/kv_cache_memory_bytes: both memory mechanisms are set"
    )
    assert lines[1].endswith("(see docs/reference/host-data.md#gpu_memory_utilization)")
    assert "2 problem(s) on 1 of 2 host(s)" in result.stderr


def test_typos_refused_and_strict_lists_unknown_keys(tmp_path):
    (tmp_path / "group_data").mkdir()
    (tmp_path / "group_data" / "all.py").write_text(
        'vllm_version = "0.32.0"\ntarget_model = "t/t"\n'
        'speculative_config = {"method": "draft_model", "model": "d/d", '
        '"num_speculative_tokens": 2}\nteam = "infra"\n_sudo = True\n'
    )
    (tmp_path / "inv.py").write_text(
        'hosts = [("h1", {"ssh_user": "deploy"}), '
        '("h2", {"gpu_memory_utilisation": 0.5, "max_num_seq": 4})]\n'
    )
    result = run("check", "inv.py", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        "h2: gpu_memory_utilisation: not a specdeploy key (the deploy would ignore it) — "
        "did you mean 'gpu_memory_utilization'? (see docs/reference/host-data.md)",
        "h2: max_num_seq: not a specdeploy key (the deploy would ignore it) — "
        "did you mean 'max_num_seqs'? (see docs/reference/host-data.md)",
    ]
    (tmp_path / "inv.py").write_text('hosts = [("h1", {"ssh_user": "deploy"})]\n')
    assert run("check", "inv.py", cwd=tmp_path).returncode == 0  # "team" is the user's own
    strict = run("check", "--strict", "inv.py", cwd=tmp_path)
    assert strict.returncode == 1
    assert strict.stdout.splitlines() == [
        "h1: team: not a specdeploy or pyinfra key: the deploy ignores it — remove it, or keep it "
        "if it is your own data (see docs/reference/host-data.md)"
    ]


def test_render_writes_both_units_per_host(tmp_path):
    result = run("render", "inventories/prod.py", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    host = tmp_path / "gpu-01.example.internal"
    argv = json.loads((host / "argv.json").read_text())
    assert (
        "--speculative-config" in argv["speculative"]
        and "--speculative-config" not in argv["baseline"]
    )
    assert (host / "specdeploy-vllm.service").exists() and (
        host / "specdeploy-vllm-baseline.service"
    ).exists()
    assert stat.S_IMODE(os.stat(host / "specdeploy-vllm.env").st_mode) == 0o600
