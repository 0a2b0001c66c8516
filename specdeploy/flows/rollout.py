"""Fleet rollouts that cannot take the fleet down.

* `specdeploy rollout INVENTORY deploys/serve.py --canary-group canary --batch-size N` runs pyinfra
  once per batch with `--limit`: the canary group first, then the other hosts N at a time, in
  inventory order. A batch is done only when pyinfra exits 0, i.e. every host in it passed its
  health check; otherwise the rollout stops and the hosts of later batches are never touched.
* Inside a deploy (one pyinfra run, one batch), the hosts are restarted one at a time, or
  `max_unavailable` at a time (serve.py); `steps/rollback.py` restores the previous unit when
  the health check fails, holds back the batch's later hosts (not restarted at all), and leaves a
  note (ROLLOUT_REPORT_ENV) per host that this controller prints; `steps/unit.py` prints the argv
  diff while planning.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from specdeploy.checks.host_data import ConfigError, check_config
from specdeploy.config.inventory import host_data, hosts_with_data
from specdeploy.config.revisions import PINNED_REVISIONS_ENV, RevisionError, pins_for_hosts
from specdeploy.steps.rollback import ROLLOUT_REPORT_ENV

# --------------------------------------------------------------------------------------------------
# The controller: `specdeploy rollout`


def inventory_hosts(inventory_path: str, cwd: str | None = None) -> list[tuple[str, list[str]]]:
    """[(host name, [groups])] in inventory order, read without connecting."""
    return [(name, groups) for name, groups, _ in hosts_with_data(inventory_path, cwd=cwd)]


def plan_batches(
    hosts: list[tuple[str, list[str]]],
    canary_group: str | None,
    batch_size: int,
    limit: list[str] | None = None,
) -> list[list[str]]:
    """Canary group first (one batch), then the rest `batch_size` at a time, inventory order."""
    if batch_size < 1:
        raise ValueError("batch size must be >= 1")
    names = [name for name, _ in hosts if not limit or name in limit]
    canary = [
        name for name, groups in hosts if canary_group and canary_group in groups and name in names
    ]
    if canary_group and not canary:
        raise ValueError(f"no host of the inventory is in the canary group {canary_group!r}")
    rest = [name for name in names if name not in canary]
    batches = [canary] if canary else []
    return batches + [rest[i : i + batch_size] for i in range(0, len(rest), batch_size)]


def fleet_pins(inventory: str, names: list[str]) -> dict[str, str]:
    """Resolve every moving ref of the hosts once, before the first batch (revisions.py); a host
    whose data is invalid or whose ref cannot be resolved stops the rollout before any host."""
    data = host_data(inventory)
    try:
        configs = [check_config(name, data[name]) for name in names]
        return pins_for_hosts(configs)
    except (ConfigError, RevisionError) as error:
        raise ValueError(f"nothing was touched:\n{error}") from None


def roll_out(
    inventory: str,
    deploy: str,
    *,
    canary_group: str | None = "canary",
    batch_size: int = 1,
    dry: bool = False,
    pyinfra_args: list[str] | None = None,
    limit: list[str] | None = None,
    out=sys.stdout,
) -> int:
    """Run pyinfra batch by batch; stop at the first failing batch. Returns the exit code."""
    batches = plan_batches(inventory_hosts(inventory), canary_group, batch_size, limit)
    total = len(batches)

    def say(text: str) -> None:
        print(f"specdeploy rollout: {text}", file=out, flush=True)

    pins = fleet_pins(inventory, [name for batch in batches for name in batch])
    for key, sha in sorted(pins.items()):
        say(f"pinned for every batch: {key.split('|', 1)[1]} -> {sha}")

    say(
        f"{sum(map(len, batches))} host(s) in {total} batch(es): "
        + " | ".join(
            f"{'canary ' if i == 0 and canary_group else ''}[{', '.join(b)}]"
            for i, b in enumerate(batches)
        )
    )
    started = time.monotonic()
    for index, batch in enumerate(batches, 1):
        command = ["pyinfra", "--dry" if dry else "-y", inventory, deploy, *(pyinfra_args or [])]
        for name in batch:
            command += ["--limit", name]
        say(f"batch {index}/{total} [{', '.join(batch)}]: $ {shlex.join(command)}")
        t0 = time.monotonic()
        # The failed hosts' notes. mkdtemp's: 0700 and a fresh name, never a directory another
        # user of a shared bastion made or linked first; removed once read, however the batch ends.
        with tempfile.TemporaryDirectory(
            prefix="specdeploy-rollout-", ignore_cleanup_errors=True
        ) as scratch:
            env = {**os.environ, ROLLOUT_REPORT_ENV: scratch}
            env[PINNED_REVISIONS_ENV] = json.dumps(pins)
            result = subprocess.run(command, env=env)
            notes = [json.loads(p.read_text()) for p in sorted(Path(scratch).glob("*.json"))]
        if result.returncode != 0:
            say(
                f"batch {index}/{total} FAILED after {time.monotonic() - t0:.0f}s "
                f"(pyinfra exit {result.returncode})"
            )
            for entry in (n for n in notes if not n.get("held_back")):
                action = (
                    "rolled back to its previous unit and env file; " + entry.get("after", "")
                    if entry.get("rolled_back")
                    else entry.get("after", "not rolled back")
                )
                say(
                    f"FAILED host {entry['host']}: {action}\n  cause: "
                    + "\n  ".join(entry["cause"].splitlines())
                )
            held = [n["host"] for n in notes if n.get("held_back")]
            if held:
                say(f"held back in this batch (not restarted, still on their old config): "
                    f"{', '.join(held)}")  # fmt: skip
            if not notes:
                say(f"failed host(s) among [{', '.join(batch)}]: see pyinfra's errors above")
            untouched = [h for b in batches[index:] for h in b]
            say(f"rollout STOPPED; not touched: {', '.join(untouched) or 'none'}")
            return result.returncode or 1
        say(
            f"batch {index}/{total} done in {time.monotonic() - t0:.0f}s: "
            f"{'planned (dry run, nothing changed)' if dry else 'healthy'}: {', '.join(batch)}"
        )
    say(
        f"rollout {'dry run ' if dry else ''}complete: {total} batch(es) "
        f"in {time.monotonic() - started:.0f}s"
    )
    return 0
