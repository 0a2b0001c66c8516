"""Record what a settled sandbox host answers to a no-op re-run of the serve deploy, for
plan_fleet.py's `--settled` stand-in (tests/stand_in.py; issue 37: a 1,000-host no-op run on the
control node).

    python benchmarks/fleet_scale/record_settled.py HOST [--inventory inventories/sandbox.py]
        [--out benchmarks/fleet_scale/settled.json]

Runs `pyinfra -y INVENTORY deploys/serve.py --limit HOST` (the host must already be deployed, so the
run is a no-op) with pyinfra's SSH connector wrapped: every command it runs and its output, and the
host's data as the inventory gives it, go to OUT. Commands are stored with the host's name as
`{host}` and every run of digits as `#` (pids, times, expiries), so a stand-in of another name finds
them (tests/stand_in.normal); output with the host's name as `{host}`. Prints how many commands
the no-op run sent and whether it changed anything (it must not).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tests.stand_in import normal


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("host")
    parser.add_argument("--inventory", default="inventories/sandbox.py")
    parser.add_argument("--out", default=str(Path(__file__).with_name("settled.json")))
    args = parser.parse_args()

    from pyinfra.api.command import StringCommand
    from pyinfra.connectors.ssh import SSHConnector

    from specdeploy.config.inventory import host_data

    answers: dict[str, dict] = {}
    original = SSHConnector.run_shell_command

    def recording(self, command, *a, **kw):
        ok, output = original(self, command, *a, **kw)
        raw = command.get_raw_value() if isinstance(command, StringCommand) else str(command)
        answers.setdefault(normal(raw, self.host.name), {
            "ok": ok,
            # raw but for the name: a record's JSON, a hash, a version are parsed as they are
            "stdout": [line.replace(self.host.name, "{host}") for line in output.stdout_lines],
        })  # fmt: skip
        return ok, output

    SSHConnector.run_shell_command = recording
    from pyinfra_cli.main import cli

    argv = ["-y", args.inventory, "deploys/serve.py", "--limit", args.host]
    try:
        cli.main(args=argv, prog_name="pyinfra", standalone_mode=False)
        code = 0
    except SystemExit as exit_:
        code = exit_.code or 0
    data = host_data(args.inventory)[args.host]
    Path(args.out).write_text(json.dumps({
        "recorded_from": args.host, "pyinfra_exit": code,
        "data": json.loads(json.dumps(data, default=str)), "answers": answers,
    }, indent=1, sort_keys=True))  # fmt: skip
    print(f"{len(answers)} distinct commands recorded from {args.host} (pyinfra exit {code}) "
          f"-> {args.out}")  # fmt: skip


if __name__ == "__main__":
    main()
