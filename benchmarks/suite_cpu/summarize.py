"""cpu_account.py's TSV -> wall and busy core-seconds per module, the session's totals and the
lower bound they set on 2 cores, and the 30 longest phases.

    python benchmarks/suite_cpu/summarize.py suite.tsv [--cores 2]"""

from __future__ import annotations

import argparse
import collections


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("tsv")
    parser.add_argument("--cores", type=int, default=2)
    args = parser.parse_args()
    modules: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0])
    phases = []
    session = None
    for line in open(args.tsv):
        if not line.strip():
            continue
        nodeid, phase, _t0, wall, busy, steal = line.rstrip("\n").split("\t")
        wall, busy, steal = float(wall), float(busy), float(steal)
        if nodeid == "SESSION":
            session = (wall, busy, steal)
            continue
        module = nodeid.split("::")[0]
        module = "tests/unit/*" if module.startswith("tests/unit") else module
        entry = modules[module]
        entry[0] += wall
        entry[1] += busy
        entry[2] += phase == "call"
        phases.append((wall, busy, phase, nodeid))
    print(f"{'module':56s} {'tests':>5s} {'wall s':>7s} {'core-s':>7s} {'cores':>5s}")
    for module, (wall, busy, tests) in sorted(modules.items(), key=lambda kv: -kv[1][0]):
        print(f"{module:56s} {tests:5d} {wall:7.0f} {busy:7.0f} {busy / max(wall, 1e-9):5.2f}")
    if session:
        wall, busy, steal = session
        print(
            f"session: {wall:.0f} s wall, {busy:.0f} busy core-s ({busy / wall:.2f} cores), "
            f"steal {steal:.0f} s; on {args.cores} cores this work needs >= "
            f"{busy / args.cores:.0f} s ({busy / args.cores / 60:.1f} min)"
        )
    print("\nthe 30 longest phases (wall s, core-s):")
    for wall, busy, phase, nodeid in sorted(phases, reverse=True)[:30]:
        print(f"{wall:6.0f} {busy:6.0f}  {phase:8s} {nodeid}")


if __name__ == "__main__":
    main()
