"""A GPU host running its own server does not refuse its own re-deploy (issue 20 item 1).

The fixtures in tests/facts/Accelerators/ are the `Accelerators` fact's command, output lines and
value, pyinfra style, from nvidia-smi on one H200 (driver 580.159.04, 143771 MiB): "composed" ones
from the 2026-12-01 recordings in tests/facts/Accelerators/2026-12-01/ (the parts the current
command prints, recorded then with the committed command and separate nvidia-smi calls),
"recorded" ones the current command's own output on the device (benchmarks/gpu_preflight/
REPORT.md), and one "synthesized": `own_server_plus_other_60g` is the recorded 20 GiB case with the
other process's compute-apps line edited from 21090 to 61440 MiB (memory.used raised by the same
amount). `benchmarks.gpu_preflight.fixtures` writes them. The host data is the running server's
(its rendered argv is 2026-12-01/server_argv.txt), and the model facts are what the
`ModelSnapshot` fact read from its checkpoints on the H200 (tests/facts/ModelSnapshot/).
"""

from __future__ import annotations

import subprocess

from specdeploy.checks.preflight import evaluate
from specdeploy.config.schema import config_from_data
from specdeploy.host.facts import nvidia
from specdeploy.host.facts.nvidia import Accelerators, parse_accelerators
from tests.facts import cases, snapshots
from tests.facts import fixture as facts_fixture
from tests.unit.checks.test_accelerator import FAILING, H100_MIG, gpu_line, recording

FIXTURES = cases("Accelerators")
MODELS = snapshots()  # the ModelSnapshot fixtures
TARGET, DRAFT = MODELS["specdeploy/qwen3-8b-arch"], MODELS["specdeploy/qwen3-0.6b-arch"]
RAM = {"total": 128 << 30, "available": 120 << 30}
UNIT = "specdeploy-vllm.service"
UNITS = [UNIT, "specdeploy-vllm-baseline.service", "specdeploy-vllm-measure.service"]
MIB = 1 << 20
UUID = "GPU-8bd7d9f1-f7cf-9957-259f-4973b3e8c19c"


def fixture(name: str) -> dict:
    return facts_fixture("Accelerators", name)


def fact(name: str):
    return parse_accelerators(fixture(name)["output"])


def running(valid_data, k: int = 1, util: float = 0.55):
    """The running server's host data (2026-12-01/server_argv.txt), or a re-deploy of it."""
    target = TARGET["path"]
    return config_from_data(
        {
            **valid_data,
            "vllm_version": "0.26.0",
            "target_model": target,
            "served_model_name": "m",
            "speculative_config": {
                "method": "draft_model",
                "model": DRAFT["path"],
                "num_speculative_tokens": k,
                "rejection_sample_method": "synthetic",
                "synthetic_acceptance_length": 2.0,
            },
            "gpu_memory_utilization": util,
            "max_model_len": 1024,
            "max_num_seqs": 8,
            "enable_prefix_caching": False,
            "vllm_extra_args": ["--load-format", "dummy", "--enforce-eager", "--async-scheduling"],
        }
    )


# The fixtures (tests/facts/test_facts.py checks each one's command and value)


def test_fixtures_hold_each_state():
    assert {"idle", "own_server_running", "own_server_plus_other_20g", "after_stop"} <= set(
        FIXTURES
    )
    assert fixture("own_server_plus_other_60g")["kind"] == "synthesized"


def test_own_server_memory_is_the_units():
    info = fact("own_server_running")
    (gpu,) = info.gpus
    assert gpu.uuid == UUID and gpu.memory_used_bytes == 79269 * MIB
    assert info.own_pids == {UNIT: [552, 711], UNITS[1]: [], UNITS[2]: []}
    assert [(p.pid, p.used_bytes, p.unit) for p in gpu.processes] == [(711, 79260 * MIB, UNIT)]
    assert gpu.own_bytes_by_unit == {UNIT: 79260 * MIB}
    other = fact("own_server_plus_other_20g").gpus[0]
    assert [(p.pid, p.unit) for p in other.processes] == [(711, UNIT), (942, None)]
    assert other.own_bytes_by_unit == {UNIT: 79260 * MIB}


# The preflight on them


def test_redeploy_of_the_running_config_fits(valid_data):
    result = evaluate(running(valid_data), TARGET, DRAFT, fact("own_server_running"), RAM)
    assert result.problems == [] and result.warnings == []
    m = result.memory
    assert m["device_memory_used_bytes"] == 79269 * MIB
    assert m["device_memory_own_bytes"] == {UNIT: 79260 * MIB}
    assert m["device_memory_other_bytes"] == 9 * MIB
    assert m["memory_in_use"] == (
        "GPU 0: 0.01 GiB in use by other processes, 77.40 GiB by specdeploy-vllm.service, "
        "which the restart frees"
    )
    # what the committed fact (no unit PIDs) made of the same GPU: the refusal issue 20 quotes
    unknown = [ln for ln in fixture("own_server_running")["output"] if not ln.startswith("@@unit")]
    (problem,) = evaluate(
        running(valid_data), TARGET, DRAFT, parse_accelerators(unknown), RAM
    ).problems
    assert "GPU 0 has 77.41 GiB in use, so only 62.49 GiB of 140.40 GiB is free" in problem


def test_k_change_fits(valid_data):
    for k in (2, 4):
        c = running(valid_data, k=k)
        result = evaluate(c, TARGET, DRAFT, fact("own_server_running"), RAM)
        assert result.problems == [], k


def test_another_process_still_counts(valid_data):
    twenty = fact("own_server_plus_other_20g")
    fits = evaluate(running(valid_data), TARGET, DRAFT, twenty, RAM)
    assert fits.problems == []
    assert fits.memory["device_memory_other_bytes"] == (100365 - 79260) * MIB
    (problem,) = evaluate(running(valid_data, util=0.92), TARGET, DRAFT, twenty, RAM).problems
    assert problem.startswith(
        "vLLM would refuse to start: GPU 0 has 20.61 GiB in use by other processes (77.40 GiB by "
        "specdeploy-vllm.service, which the restart frees), so only 119.29 GiB of 140.40 GiB is "
        "free, less than the 129.17 GiB asked for by gpu_memory_utilization 0.92"
    )


def test_another_processs_60_gib_still_refuses(valid_data):
    # synthesized: the recorded 20 GiB process's compute-apps line edited to 61440 MiB
    sixty = fact("own_server_plus_other_60g")
    for k, util in ((1, 0.6), (2, 0.6), (1, 0.92)):
        (problem,) = evaluate(
            running(valid_data, k=k, util=util), TARGET, DRAFT, sixty, RAM
        ).problems
        assert (
            "GPU 0 has 60.01 GiB in use by other processes (77.40 GiB by specdeploy-vllm" in problem
        )
        assert "so only 79.89 GiB of 140.40 GiB is free" in problem
    # 0.55 x 140.40 = 77.22 GiB does fit beside 60 GiB: vLLM's own check passes there too
    assert evaluate(running(valid_data), TARGET, DRAFT, sixty, RAM).problems == []


def test_idle_and_after_stop(valid_data):
    for name in ("idle", "after_stop"):
        info = fact(name)
        assert info.gpus[0].processes == [] and info.own_pids[UNIT] == []
        result = evaluate(running(valid_data, util=0.92), TARGET, DRAFT, info, RAM)
        assert result.problems == [] and result.memory["memory_in_use"] == "GPU 0: 0.00 GiB in use"


# The current command's own output on the H200 (benchmarks/gpu_preflight/REPORT.md): the server
# in the unit's cgroup (PIDs 645 `vllm serve`, 769, 770 `VLLM::EngineCore`), another process (1016)
# holding 40 GiB beside it, the server restarted with that process still there.


def test_device_redeploy_and_k_change_fit_beside_the_running_server(valid_data):
    info = fact("device_own_server")
    assert info.own_pids[UNIT] == [645, 769, 770]
    assert [(p.pid, p.unit) for p in info.gpus[0].processes] == [(770, UNIT)]
    for k in (1, 2):
        result = evaluate(running(valid_data, k=k), TARGET, DRAFT, info, RAM)
        assert result.problems == [] and result.memory["memory_in_use"] == (
            "GPU 0: 0.01 GiB in use by other processes, 77.41 GiB by specdeploy-vllm.service, "
            "which the restart frees"
        )


def test_device_other_process_still_refuses(valid_data):
    info = fact("device_own_server_plus_other_40g")
    assert [(p.pid, p.used_bytes // MIB, p.unit) for p in info.gpus[0].processes] == [
        (770, 79264, UNIT),
        (1016, 41570, None),
    ]
    assert evaluate(running(valid_data), TARGET, DRAFT, info, RAM).problems == []
    (problem,) = evaluate(running(valid_data, util=0.92), TARGET, DRAFT, info, RAM).problems
    assert "GPU 0 has 40.61 GiB in use by other processes (77.41 GiB by specdeploy-vllm" in problem
    assert "so only 99.29 GiB of 140.40 GiB is free, less than the 129.17 GiB" in problem


def test_post_restart_check_does_not_count_the_new_server(valid_data):
    # after the restart the unit's cgroup holds the new server (PIDs 1090, 1157, 1158): its memory
    # is the unit's, so verify_and_record's preflight passes where the new server itself runs
    info = fact("device_after_restart")
    assert info.own_pids[UNIT] == [1090, 1157, 1158]
    result = evaluate(running(valid_data), TARGET, DRAFT, info, RAM)
    assert result.problems == []
    assert result.memory["device_memory_own_bytes"] == {UNIT: 79264 * MIB}
    assert result.memory["device_memory_other_bytes"] == (120849 - 79264) * MIB
    # the same GPU with the new server counted, as the committed fact had it: a refusal
    unknown = [
        ln for ln in fixture("device_after_restart")["output"] if not ln.startswith("@@unit")
    ]
    assert evaluate(running(valid_data), TARGET, DRAFT, parse_accelerators(unknown), RAM).problems


# Edge cases: MIG, [N/A], a failing nvidia-smi or compute-apps query, several GPUs


def apps(*lines, rc=0):
    return ["@@apps", *lines, f"@@apps-rc {rc}"]


def units(pids):
    return [f"@@unit {UNIT}", *map(str, pids), f"@@unit {UNITS[1]}", f"@@unit {UNITS[2]}"]


def test_mig_is_handled_as_before(valid_data):
    out = H100_MIG + apps("4242, GPU-5d2e0a11-0c3b-4a8e-9f5e-1b2c3d4e5f60, [N/A]") + units([4242])
    result = evaluate(running(valid_data), TARGET, DRAFT, parse_accelerators(out), RAM)
    assert result.memory["gpus_used"] == ["GPU 0 MIG 3g.40gb"]
    assert any("MIG" in w for w in result.warnings) and result.problems == []


def test_own_process_of_unknown_size_counts_as_in_use(valid_data):
    line = gpu_line(0, used=79269) + f", {UUID}"
    out = recording([line], []) + apps(f"711, {UUID}, [N/A]") + units([711])
    info = parse_accelerators(out)
    assert info.gpus[0].processes[0].used_bytes is None
    result = evaluate(running(valid_data), TARGET, DRAFT, info, RAM)
    assert any("[N/A]): counted as in use" in w for w in result.warnings)
    assert "GPU 0 has 77.41 GiB in use" in result.problems[0]


def test_failing_nvidia_smi_is_still_refused(valid_data):
    out = FAILING + apps("Failed to initialize NVML", rc=18) + units([711])
    info = parse_accelerators(out)
    assert info.status == "failed" and "Driver/library version mismatch" in info.error
    (problem,) = evaluate(running(valid_data), TARGET, DRAFT, info, RAM).problems
    assert "reboot" in problem


def test_failing_compute_apps_query_counts_everything(valid_data):
    line = gpu_line(0, used=79269) + f", {UUID}"
    out = recording([line], []) + apps('Field "gpu_uuid" is not a valid field', rc=2) + units([711])
    info = parse_accelerators(out)
    assert info.processes_error.startswith("nvidia-smi --query-compute-apps exited 2")
    result = evaluate(running(valid_data), TARGET, DRAFT, info, RAM)
    assert any("counted as in use" in w for w in result.warnings)
    assert "GPU 0 has 77.41 GiB in use" in result.problems[0]


def test_busiest_gpu_by_other_processes_decides(valid_data):
    uuids = [f"GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd" for i in range(2)]
    out = (
        recording(
            [gpu_line(0, used=79269) + f", {uuids[0]}", gpu_line(1, used=30000) + f", {uuids[1]}"],
            [],
        )
        + apps(f"711, {uuids[0]}, 40000", f"712, {uuids[1]}, 29990", f"900, {uuids[0]}, 39260")
        + units([711, 712])
    )
    c = running(valid_data, util=0.8)
    c = c.model_copy(update={"vllm_extra_args": [*c.vllm_extra_args, "-tp", "2"]})
    result = evaluate(c, TARGET, DRAFT, parse_accelerators(out), RAM)
    m = result.memory
    assert m["device_memory_other_bytes"] == (79269 - 40000) * MIB  # GPU 0: pid 900's and the rest
    assert m["memory_in_use"].startswith("GPU 0: 38.35 GiB in use by other processes, 39.06 GiB")
    assert result.problems and "GPU 0 has 38.35 GiB in use by other processes" in result.problems[0]


# The command itself, run by a shell against stand-ins for nvidia-smi, systemctl and cgroupfs


def test_command_reads_the_units_cgroups(tmp_path, monkeypatch):
    cg = tmp_path / "cgroup"
    (cg / "system.slice" / UNIT / "nested").mkdir(parents=True)
    (cg / "system.slice" / UNIT / "cgroup.procs").write_text("552\n")
    (cg / "system.slice" / UNIT / "nested" / "cgroup.procs").write_text("711\n")
    monkeypatch.setattr(nvidia, "CGROUP_ROOTS", (str(tmp_path / "absent"), str(cg)))
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    recorded = fixture("own_server_running")["output"]
    query = recorded[1].replace(", Disabled", f", Disabled, {UUID}")
    (bin_ / "nvidia-smi").write_text(
        '#!/bin/sh\ncase "$1" in\n'
        f"  --query-gpu=*) echo '{query}';;\n"
        f"  -L) echo '{recorded[4]}';;\n"
        f"  --query-compute-apps=*) echo '711, {UUID}, 79260';;\n"
        f"  *) echo '{recorded[6]}';;\nesac\n"
    )
    (bin_ / "systemctl").write_text(
        '#!/bin/sh\nfor u; do :; done\ncase "$u" in\n'
        f"  {UNIT}) echo /system.slice/$u;;\n  {UNITS[1]}) echo /;;\nesac\n"
    )
    for tool in bin_.iterdir():
        tool.chmod(0o755)
    command = Accelerators().command(units=UNITS)
    env = {"PATH": f"{bin_}:/usr/bin:/bin"}
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, env=env)
    assert done.returncode == 0
    info = Accelerators().process(done.stdout.splitlines())
    # "/" (never a unit's cgroup) is not read: that would make every process the service's own
    assert info.own_pids == {UNIT: [552, 711], UNITS[1]: [], UNITS[2]: []}
    assert info.gpus[0].own_bytes_by_unit == {UNIT: 79260 * MIB}
    assert info.gpus[0].uuid == UUID and info.processes_error is None
    # no systemctl at all (the device, a container): no unit PIDs, nothing fails
    (bin_ / "systemctl").unlink()
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, env=env)
    assert Accelerators().process(done.stdout.splitlines()).own_pids[UNIT] == []


def test_command_without_units_is_the_plain_one():
    assert Accelerators().command() == nvidia.ACCELERATOR_COMMAND
    assert "--query-compute-apps=pid,gpu_uuid,used_memory" in nvidia.ACCELERATOR_COMMAND
    assert "uuid --format" in nvidia.ACCELERATOR_COMMAND
