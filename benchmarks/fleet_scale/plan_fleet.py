"""Printed, not asserted: planning and a no-op execution of the serve deploy against N hosts
(default 1000) on a fake connector, to measure the control node (issue 37).

    python benchmarks/fleet_scale/plan_fleet.py [--hosts 1000] [--hosts 100 ...]

The fleet is tests/stand_in.py's (its docstring says what a STAND-IN host answers, and why the
figures are the control node's own cost); tests/unit/flows/test_fleet_scale.py holds its counts on
20 hosts. This prints total and per-host planning time, execution time, peak RSS
(resource.getrusage) and per host, commands per host (planning / execution), and how often the
fleet-wide work ran: the request set's tokenizing and the release tables' parse (once each,
however many hosts).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tests.stand_in import measure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, action="append", help="fleet size (repeatable)")
    parser.add_argument("--settled", type=Path, help="record_settled.py's recording: a no-op run")
    args = parser.parse_args()
    for count in args.hosts or [1000]:
        got = measure(count, args.settled)
        plan_cmds = sum(got["planning_commands"].values()) / count
        exec_cmds = sum(got["execution_commands"].values()) / count
        print(
            f"{count} hosts: planning {got['planning_s']:.2f} s"
            f" ({got['planning_s'] / count * 1000:.1f} ms/host), execution"
            f" {got['execution_s']:.2f} s ({got['failed_hosts']} hosts failed), peak RSS"
            f" {got['peak_rss_mib']:.0f} MiB ({got['peak_rss_mib'] / count * 1024:.0f} KiB/host,"
            f" process total), commands per host {plan_cmds:.1f} planning / {exec_cmds:.1f}"
            f" execution; release table reads {got['release table reads']}, request set"
            f" tokenizings {got['request set tokenizings']} (this process)"
        )
        if args.settled:
            print(f"  no-op check: {got['changed_operations']} operation(s) changed; commands "
                  f"the recording lacks: {len(got['unanswered_commands'])}")  # fmt: skip


if __name__ == "__main__":
    main()
