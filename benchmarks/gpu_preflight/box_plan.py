"""The whole box's device run on one H200 (issue 23): the plan device_run.py follows, from
specdeploy's own code.

The box is `service_name = "box"` with `instances = 1` on the one GPU: its instance `box-0`, what
`instances.expand` makes of it against the device's GPU list (port vllm_port + 1 = 8001,
`CUDA_VISIBLE_DEVICES=0` in its unit's environment), the instance's rendered `vllm serve` argv and
its own unit names for the `Accelerators` fact — the instance the deploy's per-instance preflight
asks about, restarted. Beside it the layouts `specdeploy check` cannot decide without the host
(`instances = 2`, an instance listing GPU 1, `instances` unset), decided on the device from the
fact's GPU list. The running server's model and settings are those of
benchmarks/gpu_preflight/plan.py (Qwen3-8B + Qwen3-0.6B architecture, dummy weights, k=1,
gpu_memory_utilization 0.55).

The plan of `python -m benchmarks.device prepare gpu_box DIR` (benchmarks/device).
"""

from __future__ import annotations

from benchmarks.gpu_preflight.plan import CONFIGS as SINGLE
from benchmarks.gpu_preflight.plan import plan_for
from specdeploy.checks.host_data import check_config
from specdeploy.render import instances

DEVICE_GPUS = [0]  # what the plan expects; the runner decides the layouts on the fact's own list


def box_data(single: dict, **more) -> dict:
    """The single-server host data as a box: the instances get their GPUs from the split, so the
    hand-set CUDA_VISIBLE_DEVICES (which the checks refuse beside `instances`) goes."""
    env = {k: v for k, v in single["vllm_env"].items() if k != instances.GPU_ENV}
    return {**single, "vllm_env": env, "service_name": "box", "instances": 1, **more}


def member_data(data: dict) -> dict:
    """The instance's own host data, as `instances.expand` makes it on a 1-GPU host."""
    (member,) = instances.expand(check_config("box", data), DEVICE_GPUS).instances
    return member.cfg.model_dump(mode="json")


def build() -> dict:
    boxes = {name: box_data(single) for name, single in SINGLE.items()}
    layout = instances.expand(check_config("box", boxes["redeploy"]), DEVICE_GPUS)
    (member,) = layout.instances
    plan = plan_for(member.cfg, {name: member_data(data) for name, data in boxes.items()})
    plan["layouts"] = {
        "instances_1": boxes["redeploy"],
        "instances_2": box_data(SINGLE["redeploy"], instances=2),
        "listed_gpu_1": box_data(SINGLE["redeploy"], instances=[{"gpus": [1], "port": 8001}]),
        "unset": {**boxes["redeploy"], "instances": None},
    }
    return plan
