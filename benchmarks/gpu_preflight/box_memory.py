"""What each instance of a whole 8-GPU box gets, by the product's own memory model: the README's
"whole box" numbers. Runs `specdeploy.render.instances.expand` and
`specdeploy.checks.preflight.evaluate` (the deploy's split and preflight) for the example host data
(group_data/all.py + prod.py: Qwen3-8B + Qwen3-0.6B, k = 5, gpu_memory_utilization 0.92,
max_model_len 4096) on the constructed 8 idle H200s
(tests/facts/Accelerators/constructed_8gpu_idle.json), with the two models' facts as the
`ModelSnapshot` fact read them from their checkpoints (tests/facts/ModelSnapshot/).

Usage: python -m benchmarks.gpu_preflight.box_memory     (from the repo root)
"""

from __future__ import annotations

import json
import runpy
from pathlib import Path

from specdeploy.checks.preflight import evaluate
from specdeploy.config.schema import config_from_data
from specdeploy.host.facts.nvidia import parse_accelerators
from specdeploy.render import instances

REPO = Path(__file__).resolve().parents[2]
FACTS = REPO / "tests" / "facts"
GIB = 1 << 30


def example_data(**changes) -> dict:
    data = {}
    for name in ("all.py", "prod.py"):
        names = runpy.run_path(str(REPO / "group_data" / name))
        data |= {k: v for k, v in names.items() if not k.startswith("_") and _is_data(v)}
    return data | changes


def _is_data(value) -> bool:
    return not callable(value) and not hasattr(value, "__file__")  # no function, no module


def main() -> None:
    fixtures = (json.loads(p.read_text()) for p in (FACTS / "ModelSnapshot").glob("*.json"))
    models = {f["fact"]["repo"]: f["fact"] for f in fixtures if f["fact"]}
    target, draft = models["specdeploy/qwen3-8b-arch"], models["specdeploy/qwen3-0.6b-arch"]
    idle = json.loads((FACTS / "Accelerators" / "constructed_8gpu_idle.json").read_text())["output"]
    idle = parse_accelerators(idle)
    ram = {"total": 2048 * GIB, "available": 2000 * GIB}
    header = ("split", "instance", "GPUs", "weights/GPU", "KV budget/GPU", "KV tokens",
              "max_model_len seqs", "problems")  # fmt: skip
    print("  ".join(header))
    for tp, n in ((1, 8), (2, 4)):
        cfg = config_from_data(example_data(instances=n, vllm_extra_args=["-tp", str(tp)]))
        layout = instances.expand(cfg, [g.index for g in idle.gpus])
        for member in layout.instances:
            result = evaluate(member.cfg, target, draft, idle, ram)
            mem = result.memory
            cells = (
                f"TP {tp} x {n}",
                member.name,
                ",".join(map(str, member.devices)),
                f"{mem['weights_per_gpu_bytes'] / GIB:.2f} GiB",
                f"{mem['kv_budget_bytes'] / GIB:.2f} GiB",
                str(mem["kv_tokens"]),
                str(mem["max_sequences"]),
                "; ".join(result.problems) or "-",
            )
            print("  ".join(cells))
        print(
            f"  per GPU: {mem['requested_bytes'] / GIB:.2f} GiB asked by gpu_memory_utilization "
            f"{cfg.gpu_memory_utilization}, ~{mem['overhead_per_gpu_bytes'] / GIB:.2f} GiB "
            f"activations/graphs, target + draft KV {mem['kv_bytes_per_token']} bytes/token per "
            f"GPU; max_num_seqs {cfg.effective_max_num_seqs}"
        )


if __name__ == "__main__":
    main()
