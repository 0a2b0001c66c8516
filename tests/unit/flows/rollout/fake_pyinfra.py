"""pyinfra's side of a `specdeploy rollout` batch, stood in for the controller's tests: which hosts
a batch's command line really runs on, resolved the way pyinfra's own CLI resolves `--limit` (a
group name first, else an fnmatch pattern over the host names: pyinfra_cli/cli.py
`_get_inventory_pattern_matches`, called here on a real pyinfra `Inventory`), so a test sees the
batch pyinfra would run, not the one the controller meant."""

from __future__ import annotations

from functools import lru_cache

from pyinfra.api import Inventory
from pyinfra_cli.cli import _get_inventory_pattern_matches


def inventory_of(hosts: list[tuple[str, list[str]]]) -> Inventory:
    """A real pyinfra inventory of `hosts` [(name, [groups])], in that order (built once per
    fleet: pyinfra looks up its connectors' entry points for every host it makes)."""
    return _inventory(tuple((name, tuple(groups)) for name, groups in hosts))


@lru_cache(maxsize=64)
def _inventory(hosts: tuple[tuple[str, tuple[str, ...]], ...]) -> Inventory:
    groups: dict[str, list[str]] = {}
    for name, in_groups in hosts:
        for group in in_groups:
            groups.setdefault(group, []).append(name)
    return Inventory(([name for name, _ in hosts], {}), **{g: (m, {}) for g, m in groups.items()})


def limit_words(command: list[str]) -> list[str]:
    """The `--limit` arguments of a pyinfra command line, as given."""
    return [command[i + 1] for i, word in enumerate(command) if word == "--limit"]


def limited(command: list[str], hosts: list[tuple[str, list[str]]]) -> list[str]:
    """The hosts pyinfra runs `command` on: each `--limit` word resolved by pyinfra's own matcher,
    in the order of the words (each word's hosts in inventory order), without repeats."""
    inventory = inventory_of(hosts)
    order = [name for name, _ in hosts]
    chosen: list[str] = []
    for word in limit_words(command):
        matched = _get_inventory_pattern_matches(inventory, [word], "--limit")
        for name in sorted((host.name for host in matched), key=order.index):
            if name not in chosen:
                chosen.append(name)
    return chosen


class Batch:
    """pyinfra for one batch per call, its notes written the way the serve deploy writes them
    (report/notes.py): each host pyinfra would run on (its `--limit` resolved as above) is noted
    as `outcome[host]` says (default done); a host after a failed one in the same batch is held
    back, not restarted, as the rolling restart holds it back. `outcome[host] == "kill"`: the
    controller is killed hard when that host's turn comes (KeyboardInterrupt out of the batch, as
    an uncaught kill: nothing after it runs). `limits`: each batch's hosts, as pyinfra ran them."""

    def __init__(self, hosts: list[tuple[str, list[str]]], outcome: dict | None = None):
        self.hosts = hosts
        self.outcome: dict[str, dict | str] = {} if outcome is None else outcome
        self.limits: list[list[str]] = []

    def __call__(self, command: list[str], env: dict) -> int:
        import os

        from specdeploy.report import notes

        batch = limited(command, self.hosts)
        self.limits.append(batch)
        before = os.environ.get(notes.ROLLOUT_REPORT_ENV)
        os.environ[notes.ROLLOUT_REPORT_ENV] = env[notes.ROLLOUT_REPORT_ENV]
        try:
            failed = None
            for name in batch:
                entry = self.outcome.get(name, {"done": True})
                if entry == "kill":
                    raise KeyboardInterrupt  # the controller is killed mid-batch
                if failed and entry.get("done") is not False:
                    entry = {"held_back": True, "cause": f"{failed} failed first"}
                notes.note({"host": name, **entry})
                if "cause" in entry and not entry.get("held_back"):
                    failed = name
            return 1 if failed else 0
        finally:
            if before is None:
                os.environ.pop(notes.ROLLOUT_REPORT_ENV, None)
            else:
                os.environ[notes.ROLLOUT_REPORT_ENV] = before
