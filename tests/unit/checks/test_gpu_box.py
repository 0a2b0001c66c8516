"""A whole box's split and per-instance preflight on 8-GPU `nvidia-smi` outputs (issue 23).

The fixtures `constructed_8gpu_*.json` in tests/facts/Accelerators/ are CONSTRUCTED (their README
and benchmarks/gpu_preflight/box_fixtures.py say how): the recorded H200 format and memory figures
repeated for GPUs 0-7. They hold what the `Accelerators` fact prints when asked about every
instance's units; each instance's own call (steps/preflight.run_preflight with `service_units` of
the instance's config) prints only its own `@@unit` parts, which `as_asked` keeps. The host data is
the recorded server's (test_gpu_preflight.running: Qwen3-8B + Qwen3-0.6B architecture, util 0.55).
"""

from __future__ import annotations

import pytest

from specdeploy.checks.preflight import evaluate
from specdeploy.host.facts.nvidia import Accelerators, parse_accelerators
from specdeploy.render import instances
from tests.unit.checks.test_gpu_preflight import DRAFT, RAM, TARGET, fixture, running

MIB = 1 << 20
GIB = 1 << 30


def as_asked(name: str, units: list[str]) -> list[str]:
    """The fixture's output as the fact prints it when asked about `units` only."""
    out, keep = [], True
    for line in fixture(name)["output"]:
        if line.startswith("@@unit "):
            keep = line.split(" ", 1)[1] in units
        elif line.startswith("@@"):
            keep = True
        if keep:
            out.append(line)
    return out


def box(valid_data, n: int, tp: int):
    one = running(valid_data)
    args = [*one.vllm_extra_args, "--tensor-parallel-size", str(tp)]
    return one.model_copy(update={"instances": n, "vllm_extra_args": args})


def verdicts(cfg, name: str, also_own: list[str] = ()) -> dict[str, object]:
    """Each instance's preflight on the fixture, as steps/preflight.preflight_every_server does
    (`also_own`: units the host's turn stops before any new instance starts)."""
    gpus = [g.index for g in parse_accelerators(fixture(name)["output"]).gpus]
    layout = instances.expand(cfg, gpus)
    assert layout.problems == []
    out = {}
    for member in layout.instances:
        units = [*member.cfg.service_units, *also_own]
        assert fixture(name)["command"].startswith(Accelerators().command(units=[]))
        info = parse_accelerators(as_asked(name, units))
        out[member.name] = evaluate(member.cfg, TARGET, DRAFT, info, RAM)
    return out


def test_the_fixtures_are_eight_h200s_marked_constructed():
    for name in ("constructed_8gpu_idle", "constructed_8gpu_4x_tp2"):
        assert fixture(name)["kind"] == "constructed"
        info = parse_accelerators(fixture(name)["output"])
        assert [g.index for g in info.gpus] == list(range(8))
        assert {g.name for g in info.gpus} == {"NVIDIA H200"}
        assert len({g.uuid for g in info.gpus}) == 8
    serving = parse_accelerators(fixture("constructed_8gpu_4x_tp2")["output"])
    assert [p.pid for p in serving.gpus[5].processes] == [1203, 4242]
    assert serving.gpus[5].processes[1].unit is None  # another process, no unit


@pytest.mark.parametrize("tp, n", [(1, 8), (2, 4)])
def test_idle_box_split_and_every_instance_fits(valid_data, tp, n):
    results = verdicts(box(valid_data, n, tp), "constructed_8gpu_idle")
    assert list(results) == [f"specdeploy-vllm-{i}" for i in range(n)]
    for i, result in enumerate(results.values()):
        assert result.problems == [] and result.warnings == []
        assert result.memory["gpus_used"] == [f"GPU {g}" for g in range(i * tp, (i + 1) * tp)]
        assert result.memory["device_memory_other_bytes"] == 0


def test_serving_box_each_instance_frees_only_its_own(valid_data):
    results = verdicts(box(valid_data, 4, 2), "constructed_8gpu_4x_tp2")
    first, second, third, fourth = results.values()
    # a serving instance: its own workers' memory is freed by its restart
    assert first.problems == []
    assert first.memory["device_memory_own_bytes"] == {"specdeploy-vllm-0.service": 79264 * MIB}
    assert first.memory["device_memory_other_bytes"] == 9 * MIB
    assert second.problems == [] and second.memory["gpus_used"] == ["GPU 2", "GPU 3"]
    # the restarting one: what its new engine holds so far is its own too
    assert fourth.problems == []
    assert fourth.memory["device_memory_own_bytes"] == {"specdeploy-vllm-3.service": 9000 * MIB}
    # another process on GPU 5 stays in use: instance 2 would not start beside it
    (problem,) = third.problems
    assert problem.startswith(
        "vLLM would refuse to start: GPU 5 has 62.01 GiB in use by other processes "
        "(77.41 GiB by specdeploy-vllm-2.service, which the restart frees)"
    )


def test_serving_box_resplit_counts_the_neighbours(valid_data):
    """The same box re-split to 8 x TP 1: instance 1 of the new split gets GPU 1, where the old
    instance 0 (a neighbour, still serving) has a worker: in use. Instance 0 keeps GPU 0: its
    own."""
    results = verdicts(box(valid_data, 8, 1), "constructed_8gpu_4x_tp2")
    assert results["specdeploy-vllm-0"].problems == []
    (problem,) = results["specdeploy-vllm-1"].problems
    assert "GPU 1 has 77.42 GiB in use, so only 62.49 GiB" in problem
    assert results["specdeploy-vllm-1"].memory["device_memory_own_bytes"] == {}
    assert results["specdeploy-vllm-2"].memory["device_memory_own_bytes"] == {}
    # the new instance 3 (GPU 3) finds the old instance 1's worker there: in use as well
    assert results["specdeploy-vllm-3"].problems
    # the old instance 3's GPUs (6, 7) hold its 9000 MiB so far: the new 6 and 7 still fit
    assert results["specdeploy-vllm-6"].problems == []
    assert results["specdeploy-vllm-6"].memory["device_memory_other_bytes"] == (9000 + 9) * MIB


def moving(cfg, name: str, surplus: tuple[str, ...] = ()) -> list[str]:
    """steps/servers.gpus_moving on the fixture: the fact asked about every instance's units and
    the `surplus` ones (instances the new layout no longer has)."""
    gpus = [g.index for g in parse_accelerators(fixture(name)["output"]).gpus]
    layout = instances.expand(cfg, gpus)
    every = [u for member in layout.instances for u in member.cfg.service_units] + list(surplus)
    info = parse_accelerators(as_asked(name, every))
    return instances.resplit_units(layout, {g.index: list(g.own_bytes_by_unit) for g in info.gpus})


def test_serving_box_resplit_stops_the_old_instances_and_then_fits(valid_data):
    """4 x TP2 -> 8 x TP1 (issue 36 item 6: refused on main): every old instance holds a GPU the
    new split gives to another, so all four stop at the host's turn and every new instance's
    preflight counts their memory as freed."""
    cfg = box(valid_data, 8, 1)
    old = moving(cfg, "constructed_8gpu_4x_tp2")
    assert old == [f"specdeploy-vllm-{i}.service" for i in range(4)]
    results = verdicts(cfg, "constructed_8gpu_4x_tp2", also_own=old)
    assert {name: result.problems for name, result in results.items() if result.problems} == {}
    # GPU 5's other process stays in use (62 GiB); 0.55 of the GPU still fits beside it
    assert results["specdeploy-vllm-5"].memory["device_memory_other_bytes"] > 60 * GIB
    assert results["specdeploy-vllm-1"].memory["device_memory_own_bytes"] == {
        "specdeploy-vllm-0.service": 79264 * MIB  # the old instance 0's worker on GPU 1
    }
    back = box(valid_data, 2, 4)  # and 4 x TP2 -> 2 x TP4: instance 0 keeps GPUs 0-3
    gone = ("specdeploy-vllm-2.service", "specdeploy-vllm-3.service")
    assert moving(back, "constructed_8gpu_4x_tp2", gone) == [f"specdeploy-vllm-{i}.service"
                                                       for i in (1, 2, 3)]  # fmt: skip


def test_same_split_moves_nothing(valid_data):
    assert moving(box(valid_data, 4, 2), "constructed_8gpu_4x_tp2") == []
    assert moving(box(valid_data, 8, 1), "constructed_8gpu_idle") == []


# Recorded on one H200 (benchmarks/gpu_preflight/box_device/, `device_box_*.json`): a box of one
# instance, `box-0`, started from its own rendered argv and environment, its memory in the cgroup of
# its own unit `box-0.service`.

BOX_UNITS = ["box-0.service", "box-0-baseline.service", "box-0-measure.service"]


def one_gpu_box(valid_data, **more):
    return running(valid_data).model_copy(update={"service_name": "box", "instances": 1, **more})


def test_recorded_box_fixtures_ask_about_the_instances_units():
    for state in ("idle", "own_server", "own_server_plus_other_40g", "after_restart"):
        f = fixture(f"device_box_{state}")
        assert f["kind"] == "recorded" and f["arg"]["units"] == BOX_UNITS


def test_recorded_gpu_list_splits_one_instance_and_refuses_two(valid_data):
    gpus = [g.index for g in parse_accelerators(fixture("device_box_idle")["output"]).gpus]
    assert gpus == [0]
    (member,) = instances.expand(one_gpu_box(valid_data), gpus).instances
    assert (member.name, member.port, member.devices) == ("box-0", 8001, (0,))
    assert member.cfg.vllm_env[instances.GPU_ENV] == "0" and member.cfg.service_units == BOX_UNITS
    two = instances.expand(one_gpu_box(valid_data, instances=2), gpus)
    assert two.problems == [
        "instances = 2 x 1 GPUs each needs 2 GPUs but the host has 1 (0) "
        "(tensor x pipeline parallel = 1 per instance)"
    ]
    assert instances.idle_without_instances(running(valid_data), gpus) == []


def test_recorded_instance_frees_its_own_memory_and_counts_the_rest(valid_data):
    (member,) = instances.expand(one_gpu_box(valid_data), [0]).instances
    serving = parse_accelerators(fixture("device_box_own_server")["output"])
    assert [(p.unit, p.used_bytes // MIB) for p in serving.gpus[0].processes] == [
        ("box-0.service", 79264)
    ]
    result = evaluate(member.cfg, TARGET, DRAFT, serving, RAM)
    assert result.problems == [] and result.memory["memory_in_use"] == (
        "GPU 0: 0.01 GiB in use by other processes, 77.41 GiB by box-0.service, which the restart "
        "frees"
    )
    beside = parse_accelerators(fixture("device_box_own_server_plus_other_40g")["output"])
    assert evaluate(member.cfg, TARGET, DRAFT, beside, RAM).problems == []
    wide = member.cfg.model_copy(update={"gpu_memory_utilization": 0.92})
    (problem,) = evaluate(wide, TARGET, DRAFT, beside, RAM).problems
    assert "GPU 0 has 40.61 GiB in use by other processes (77.41 GiB by box-0.service" in problem
