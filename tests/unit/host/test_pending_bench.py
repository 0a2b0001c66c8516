"""bench.PendingBench's own shell commands, run in a local shell (not over SSH) against a stand-in
for vLLM's CLI package (a fake `vllm` on PYTHONPATH: the real one needs a server): the launcher
imports before the go, runs only after it, a failure comes back with its output, an unrun one is
ended with its process group, and one an earlier (dead) control node left waiting is ended by the
next start and can never run in its place."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from specdeploy.config.schema import config_from_data
from specdeploy.host import bench
from specdeploy.host.on_host import HostCommandError

MAIN = """
import json, os, sys, time
def main():
    args = sys.argv[1:]
    assert args[:2] == ["bench", "serve"], args
    value = lambda flag: args[args.index(flag) + 1]
    if os.environ.get("FAKE_BENCH_FAIL"):
        print("Traceback: the stand-in was told to fail"); sys.exit(3)
    with open(os.path.join(value("--result-dir"), value("--result-filename")), "w") as f:
        json.dump({"completed": int(value("--num-prompts")), "failed": 0, "median_tpot_ms": 1.5,
                   "ran_at": time.time(), "key": os.environ.get("OPENAI_API_KEY")}, f)
"""


@pytest.fixture
def local_host(monkeypatch, tmp_path, valid_data):
    """cfg with its state_dir under tmp_path; `sh`, `read_text` and /metrics run locally."""
    fake = tmp_path / "fake"
    for module in bench_launcher_modules():
        path = fake.joinpath(*module.split(".")).with_suffix(".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        for parent in [path.parent, *path.parent.parents]:
            if parent == fake:
                break
            (parent / "__init__.py").touch()
        path.write_text(f"open({str(tmp_path / 'imported')!r}, 'a').write('{module}\\n')\n")
    (fake / "vllm/entrypoints/cli/main.py").write_text(MAIN)
    cfg = config_from_data({**valid_data, "state_dir": str(tmp_path / "state")})
    Path(cfg.bench_dir).mkdir(parents=True)
    warnings = []
    monkeypatch.setattr(bench, "host", types.SimpleNamespace(name="h1", print_prefix="[h1] "))
    monkeypatch.setattr(bench, "logger", types.SimpleNamespace(warning=warnings.append))
    monkeypatch.setattr(bench.server, "request", lambda cfg, path: "")
    monkeypatch.setenv("PYTHONPATH", str(fake))

    def sh(command, *, check=True, stdin=None, timeout=None):
        done = subprocess.run(["sh", "-c", command], input=stdin, capture_output=True, text=True,
                              timeout=timeout)  # fmt: skip
        if check and done.returncode:
            raise HostCommandError(f"h1: `{command[:300]}` failed:\n{done.stderr}")
        return done.stdout

    monkeypatch.setattr(bench, "sh", sh)
    monkeypatch.setattr(bench, "read_text", lambda path: Path(path).read_text())
    yield cfg, warnings

    def cmdline(proc: Path) -> str:
        try:
            return (proc / "cmdline").read_bytes().decode(errors="replace")
        except OSError:  # it ended between the listing and the read
            return ""

    def launchers_left():
        return [p for p in Path("/proc").glob("[0-9]*") if alive(p.name) and str(tmp_path) in
                cmdline(p)]  # fmt: skip

    # ended means signalled: on a loaded machine the last one may take a moment to go (this
    # teardown failed under the live tier's load with 0.0 s of grace)
    deadline = time.monotonic() + 10
    while launchers_left() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert launchers_left() == [], "a launcher outlived its test"


def bench_launcher_modules() -> list[str]:
    source = bench.source("bench_launcher")
    return [line.strip().strip('",') for line in source.splitlines() if '"vllm.' in line]


def pending(cfg, name="00-baseline"):
    p = bench.PendingBench(cfg, tokenizer="/t", name=name)
    p.argv = [sys.executable, *p.argv[1:]]  # this test's python, the fake vllm on its path
    return p


def alive(pid: str) -> bool:
    """Running (a zombie is not: this machine's PID 1 may never reap the orphans)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_for(predicate, seconds=10.0):
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_imports_first_runs_after_the_go_and_cleans_up(local_host, tmp_path):
    cfg, _ = local_host
    cfg = cfg.model_copy(update={"vllm_api_key": "sk-test-key"})
    with pending(cfg) as started:
        wait_for(lambda: (tmp_path / "imported").exists())  # imported while "the server starts"
        time.sleep(0.3)
        assert not list(Path(cfg.bench_dir).glob("*.json"))  # no go yet: nothing ran
        go = time.time()
        result = started.run(local=tmp_path / "r.json")
    assert result.completed == cfg.workload.num_prompts and result.failed == 0
    raw = json.loads((tmp_path / "r.json").read_text())
    assert raw["ran_at"] >= go and raw["key"] == "sk-test-key"  # the key: stdin, then env
    assert raw["specdeploy"]["command"][3:5] == ["bench", "serve"]
    assert set(bench_launcher_modules()) <= set((tmp_path / "imported").read_text().split())
    assert list(Path(cfg.bench_dir).iterdir()) == []  # run dir and result file gone
    assert not alive(started.pid)


def test_a_failure_comes_back_with_its_output(local_host, monkeypatch, tmp_path):
    cfg, _ = local_host
    monkeypatch.setenv("FAKE_BENCH_FAIL", "1")
    with pytest.raises(HostCommandError) as failed, pending(cfg, "smoke-x") as started:
        started.run(local=tmp_path / "r.json")
    assert "benchmark smoke-x: `vllm bench serve` failed (exit 3)" in str(failed.value)
    assert "the stand-in was told to fail" in str(failed.value)
    assert list(Path(cfg.bench_dir).iterdir()) == []


def test_an_unrun_benchmark_is_ended_with_its_process_group(local_host, tmp_path):
    cfg, _ = local_host
    with pending(cfg) as started:
        pid = started.pid
        wait_for(lambda: (tmp_path / "imported").exists())
        assert alive(pid)
    wait_for(lambda: not alive(pid))
    assert list(Path(cfg.bench_dir).iterdir()) == []


def test_one_left_waiting_by_a_dead_control_node_is_ended_and_never_runs(local_host, tmp_path):
    cfg, warnings = local_host
    stale = pending(cfg).start()  # its control node "dies": neither run nor cancelled
    wait_for(lambda: (tmp_path / "imported").exists())
    with pending(cfg) as fresh:  # the same sample name: the next run's first sample
        wait_for(lambda: not alive(stale.pid))
        assert not Path(stale.dir).exists() and fresh.dir != stale.dir
        result = fresh.run(local=tmp_path / "r.json")
    assert result.completed == cfg.workload.num_prompts
    assert warnings == [f"[h1] ended a benchmark an earlier run left waiting: {stale.dir}"]
    # a directory whose PID runs something else now is removed, the process left alone
    other = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        left = Path(cfg.bench_dir) / "01-speculative.deadbeef.run"
        left.mkdir()
        (left / "pid").write_text(f"{other.pid}\n")
        with pending(cfg):
            assert not left.exists() and other.poll() is None
    finally:
        other.kill()
        other.wait()
