"""Write the constructed 8-GPU `Accelerators` fixtures of tests/facts/Accelerators/ for a
whole box (issue 23), from the one-H200 recordings `device_idle.json` and `device_own_server.json`
(the current command's own output on the device): the same query, `-L`, header and compute-apps
line formats, repeated for GPUs 0-7 with constructed UUIDs (the recorded one with its last digit
replaced by the index). Marked `"kind": "constructed"`, and `constructed` in their names.

- `constructed_8gpu_idle`: eight idle GPUs (memory.used 0, no compute apps).
- `constructed_8gpu_4x_tp2`: `instances = 4`, tensor parallel 2 (instance i on GPUs 2i, 2i+1).
  Instances 0-2 serve: one worker process per GPU holding the recorded server's 79264 MiB (the
  same gpu_memory_utilization 0.55 per GPU), memory.used 9 MiB above its processes as recorded.
  Instance 3 is restarting: its new engine's workers hold 9000 MiB on GPUs 6 and 7 so far.
  Another process (pid 4242, no unit) holds 62 GiB on GPU 5.
The fact was asked about every instance's units (what a host-wide call prints); a per-instance call
prints only its own `@@unit` parts (tests/unit/checks/test_gpu_box.py keeps only those).

Usage: python -m benchmarks.gpu_preflight.box_fixtures     (from the repo root)
"""

from __future__ import annotations

import json

from benchmarks.gpu_preflight.fixtures import DATA, write
from specdeploy.host.facts.nvidia import Accelerators

GPUS = 8
SERVER_MIB = 79264  # device_own_server.json: the rendered server's engine on one GPU
CONTEXT_MIB = 9  # memory.used above the listed processes on that GPU (79273 - 79264)
RESTARTING_MIB = 9000
OTHER = (4242, 5, 62 * 1024)  # pid, GPU, MiB (beside the instance: 142761 of 143771 MiB)


def units(instance: int) -> list[str]:
    name = f"specdeploy-vllm-{instance}"
    return [f"{name}.service", f"{name}-baseline.service", f"{name}-measure.service"]


def recorded(name: str) -> list[str]:
    return json.loads((DATA / f"{name}.json").read_text())["output"]


def construct(apps: dict[int, list[tuple[int, int]]], pids: dict[int, list[int]]) -> list[str]:
    """The command's output for 8 GPUs: `apps` per GPU index (pid, MiB), `pids` per instance."""
    base = recorded("device_idle")
    query = base[base.index("@@query") + 1]
    fields = [f.strip() for f in query.split(",")]
    uuid = fields[-1]
    header = base[base.index("@@header") + 1]
    uuids = [uuid[:-1] + str(i) for i in range(GPUS)]
    out = ["@@query"]
    for i in range(GPUS):
        used = sum(mib for _, mib in apps.get(i, [])) + (CONTEXT_MIB if apps.get(i) else 0)
        out.append(", ".join([str(i), fields[1], fields[2], str(used), *fields[4:7], uuids[i]]))
    out += ["@@rc 0", "@@list"]
    out += [f"GPU {i}: {fields[1]} (UUID: {uuids[i]})" for i in range(GPUS)]
    out += ["@@header", header, "@@apps"]
    out += [f"{pid}, {uuids[i]}, {mib}" for i in range(GPUS) for pid, mib in apps.get(i, [])]
    out.append("@@apps-rc 0")
    for instance in range(GPUS // 2):
        for unit in units(instance):
            out.append(f"@@unit {unit}")
            if unit.endswith(f"-{instance}.service"):
                out += [str(pid) for pid in pids.get(instance, [])]
    return out


def serving() -> list[str]:
    apps: dict[int, list[tuple[int, int]]] = {}
    pids: dict[int, list[int]] = {}
    for instance in range(4):
        main = 1000 + 100 * instance  # vllm serve, its EngineCore, one worker per GPU
        workers = [main + 2, main + 3]
        pids[instance] = [main, main + 1, *workers]
        mib = RESTARTING_MIB if instance == 3 else SERVER_MIB
        for rank, pid in enumerate(workers):
            apps.setdefault(2 * instance + rank, []).append((pid, mib))
    pid, gpu, mib = OTHER
    apps[gpu].append((pid, mib))
    return construct(apps, pids)


def fixture(output: list[str], note: str) -> dict:
    arg = {"units": [u for i in range(GPUS // 2) for u in units(i)]}
    return {
        "kind": "constructed",
        "note": note,
        "arg": arg,
        "command": Accelerators().command(**arg),
        "output": output,
        "fact": Accelerators().process(output).model_dump(),
    }


def main() -> None:
    fixtures = {
        "constructed_8gpu_idle": fixture(
            construct({}, {}), "constructed from device_idle.json: 8 idle H200s"
        ),
        "constructed_8gpu_4x_tp2": fixture(
            serving(),
            "constructed from device_idle.json and device_own_server.json: instances = 4 x TP 2; "
            "0-2 serving (79264 MiB per GPU), 3 restarting (9000 MiB on GPUs 6, 7 so far), "
            "pid 4242 (no unit) holding 62 GiB on GPU 5",
        ),
    }
    write(fixtures)


if __name__ == "__main__":
    main()
