"""Write the `Accelerators` fact fixtures of tests/facts/Accelerators/, pyinfra style: per state
the fact's arguments, the command, the output lines and the value the fact returns.

Two sources:
- `2026-12-01/*.txt`, recorded on one H200 before the fact read per-process memory: the committed
  command's output, then `--query-compute-apps` (with process names) and the server's PIDs (its
  `vllm serve` process and the `VLLM::EngineCore` child, one cgroup there). Composed into what the
  current command prints: the old query lines (no uuid: the parser takes it from `nvidia-smi -L`),
  the compute apps without names, and those PIDs as the `specdeploy-vllm.service` unit's. Marked
  `"composed"`. `own_server_plus_other_60g` is `own_server_plus_other_20g` with the other process's
  21090 MiB edited to 61440 MiB (60 GiB) and memory.used raised by the same 40350 MiB: synthesized.
- `summary.json` of the device run (benchmarks/gpu_preflight/device_run.py): the current command's
  own output, as the device printed it. Marked `"recorded"`. PREFIX names them (`device`: the
  single server's run, device/; `device_box`: the whole box's instance `box-0`, box_device/), and
  the fact's units are the ones that run asked about (its `plan_units`).

Usage: python -m benchmarks.gpu_preflight.fixtures [SUMMARY_JSON [PREFIX]]     (from the repo root)
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from specdeploy.host.facts.nvidia import Accelerators

DATA = Path(__file__).resolve().parents[2] / "tests" / "facts" / "Accelerators"
UNITS = [
    "specdeploy-vllm.service",
    "specdeploy-vllm-baseline.service",
    "specdeploy-vllm-measure.service",
]


def _parts(text: str) -> dict[str, list[str]]:
    parts: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("## "):
            current = parts.setdefault(line[3:].strip(), [])
        elif current is not None:
            current.append(line)
    return parts


def composed(name: str, edit=None) -> list[str]:
    """The current command's output for one 2026-12-01 recording."""
    parts = _parts((DATA / "2026-12-01" / f"{name}.txt").read_text())
    out = list(parts["accelerator fact command"])
    apps = [ln for ln in parts["compute apps"] if not ln.startswith("rc=")]
    rc = next(ln for ln in parts["compute apps"] if ln.startswith("rc="))[3:]
    out.append("@@apps")
    for line in apps:
        pid, _name, uuid, used = (f.strip() for f in line.split(","))
        out.append(f"{pid}, {uuid}, {used}")
    out.append(f"@@apps-rc {rc}")
    server = sorted(int(m) for k in parts for m in re.findall(r"^cgroup (\d+)$", k))
    for unit in UNITS:
        out.append(f"@@unit {unit}")
        if unit == UNITS[0]:
            out += [str(pid) for pid in server]
    return edit(out) if edit else out


def _sixty(out: list[str]) -> list[str]:
    edited = []
    for line in out:
        if line.endswith(", 21090") and line.startswith("942,"):
            line = line[: -len("21090")] + "61440"
        elif line.startswith("0, NVIDIA H200, 143771, 100365,"):
            line = line.replace(", 100365,", f", {100365 + 61440 - 21090},")
        edited.append(line)
    return edited


def fixture(
    output: list[str], kind: str, note: str, command: str | None = None, units=UNITS
) -> dict:
    fact = Accelerators()
    current = fact.command(units=units)
    return {
        "kind": kind,
        "note": note,
        "arg": {"units": units},
        "command": command or current,
        "output": output,
        "fact": fact.process(output).model_dump(mode="json"),
    }


def write(fixtures: dict[str, dict]) -> None:
    """Each fixture as tests/facts/Accelerators/<name>.json (also box_fixtures.py's)."""
    for name, value in fixtures.items():
        path = DATA / f"{name}.json"
        path.write_text(json.dumps(value, indent=1) + "\n")
        print(f"{path.relative_to(DATA.parents[2])}: {value['kind']}")


def main() -> None:
    fixtures = {
        "idle": fixture(composed("idle"), "composed", "nothing running (2026-12-01)"),
        "own_server_running": fixture(
            composed("own_server_running"),
            "composed",
            "specdeploy's rendered server (util 0.55) running, PIDs 552 + 711 (2026-12-01)",
        ),
        "own_server_plus_other_20g": fixture(
            composed("own_server_plus_other_20g"),
            "composed",
            "the same, plus another process (pid 942) holding 20 GiB (2026-12-01)",
        ),
        "own_server_plus_other_60g": fixture(
            composed("own_server_plus_other_20g", _sixty),
            "synthesized",
            "own_server_plus_other_20g with pid 942's 21090 MiB edited to 61440 MiB and "
            "memory.used raised by the same 40350 MiB",
        ),
        "after_stop": fixture(composed("after_stop"), "composed", "both stopped (2026-12-01)"),
    }
    if len(sys.argv) > 1:
        summary = json.loads(Path(sys.argv[1]).read_text())
        prefix = sys.argv[2] if len(sys.argv) > 2 else "device"
        units = summary.get("plan_units", UNITS)
        if prefix != "device":
            fixtures = {}  # the composed ones are written by the plain call
        for state in summary["states"]:
            note = f"recorded on the H200 by device_run.py, mode {state['mode']}"
            fixtures[f"{prefix}_{state['state']}"] = fixture(
                state["output"], "recorded", note, command=state["command"], units=units
            )
    write(fixtures)


if __name__ == "__main__":
    main()
