"""Read a pyinfra inventory (with its group_data) without connecting to any host: the one loader
`check`, `render`, `rollout`, `status`, `unlock` and the host tests use. What cannot be read as
given (a path that is not there, a file that does not run, a `--limit` that names no host) is an
`InventoryError` naming the path, file and line, or name: every command refuses it the same way."""

from __future__ import annotations

import difflib
import os
import traceback
from fnmatch import fnmatch
from typing import Any

from pyinfra.api import Inventory, State
from pyinfra.context import ctx_state
from pyinfra_cli.inventory import make_inventory

from specdeploy.config.problems import name_list


class InventoryError(ValueError):
    """The inventory cannot be read as given: an inventory file or --group-data path that is not
    there, an inventory or group_data file that does not run (its file and line named), a --limit
    that matches no host. Nothing was touched; the CLI exits 2."""


def load_inventory(
    inventory_path: str,
    group_data_dirs: list[str] | None = None,
    *,
    cwd: str | None = None,
    state: State | None = None,
) -> Inventory:
    """The inventory exactly as `pyinfra INVENTORY ...` builds it. pyinfra executes inventory and
    group_data files inside a State context, as its CLI does (`state`: the one to use)."""
    if not os.path.exists(inventory_path):
        raise InventoryError(
            f"inventory file not found: {inventory_path} — give the path of a pyinfra inventory "
            "file, e.g. inventories/prod.py"
        )
    for directory in group_data_dirs or ():
        if not os.path.exists(directory):  # pyinfra would skip it without a word
            raise InventoryError(
                f"--group-data directory not found: {directory} — give an existing directory of "
                "group_data files (group_data/ beside the inventory and in the working directory "
                "are read without it)"
            )
    try:
        with ctx_state.use(state or State()):
            return make_inventory(
                inventory_path,
                cwd=cwd or os.getcwd(),
                group_data_directories=group_data_dirs or None,
            )
    except Exception as error:  # the user's Python, run by pyinfra: say where it failed
        raise InventoryError(file_failure(error, inventory_path)) from None


def file_failure(error: BaseException, inventory_path: str) -> str:
    """What went wrong in an inventory or group_data file, as `FILE, line N: Error: message` and
    the line itself. pyinfra compiles each file itself (a SyntaxError comes through as it is) and
    wraps what the file raises in its UnexpectedExternalError (`.exception`, `.filename`): the
    line is the last frame of the traceback in that file."""
    original = getattr(error, "exception", None) or error
    path = getattr(error, "filename", None) if original is not error else None
    line = text = None
    if isinstance(original, SyntaxError) and original.filename:
        path, line, text = original.filename, original.lineno, original.text
        what = original.msg
    else:
        what = str(original)
        frames = traceback.extract_tb(original.__traceback__)
        inside = [
            f for f in frames if path and os.path.abspath(f.filename) == os.path.abspath(path)
        ]
        if inside:
            line, text = inside[-1].lineno, inside[-1].line
    where = _shown(path or inventory_path) + (f", line {line}" if line else "")
    kind = type(original).__name__
    source = f"\n    {text.strip()}" if text and text.strip() else ""
    fix = "fix that line" if line else "fix the file"
    return (
        f"{where}: {kind}: {what}{source}\n"
        f"  pyinfra runs inventory and group_data files as Python: {fix}; nothing was touched"
    )


def _shown(path: str) -> str:
    """A path as the operator wrote it: relative to the working directory when under it."""
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def hosts_with_data(
    inventory_path: str, group_data_dirs: list[str] | None = None, cwd: str | None = None
) -> list[tuple[str, list[str], dict[str, Any]]]:
    """[(host name, [groups] in inventory order, merged host data)], in inventory order."""
    inventory = load_inventory(inventory_path, group_data_dirs, cwd=cwd)
    return [(h.name, list(h.groups), h.data.dict()) for h in inventory]


def host_data(
    inventory_path: str, group_data_dirs: list[str] | None = None, cwd: str | None = None
) -> dict[str, dict[str, Any]]:
    """{host name: merged host data}, exactly as `pyinfra INVENTORY ...` would see it."""
    return {name: data for name, _, data in hosts_with_data(inventory_path, group_data_dirs, cwd)}


def limit_hosts(
    hosts: list[tuple[str, list[str]]], limit: list[str] | None, inventory_path: str
) -> list[str]:
    """The host names `--limit` selects, in inventory order (all without one): as pyinfra's own
    `--limit`, each a group name or a host name pattern (fnmatch: `gpu-0*`). A name that matches no
    host or group is refused (InventoryError), with the name it is closest to: a typo would
    otherwise select nothing, or everything else."""
    if not limit:
        return [name for name, _ in hosts]
    groups = sorted({group for _, in_groups in hosts for group in in_groups})
    chosen: set[str] = set()
    for pattern in limit:
        matched = {name for name, in_groups in hosts if pattern in in_groups}
        matched |= {name for name, _ in hosts if fnmatch(name, pattern)}
        if not matched:
            close = difflib.get_close_matches(pattern, [n for n, _ in hosts] + groups, n=1)
            hint = f"did you mean {close[0]!r}?" if close else "give a host or group name of it"
            raise InventoryError(
                f"--limit {pattern!r} matches no host or group of {inventory_path} — {hint} "
                f"(hosts: {name_list([n for n, _ in hosts])}; groups: {name_list(groups)})"
            )
        chosen |= matched
    return [name for name, _ in hosts if name in chosen]


def exact_host_pattern(name: str) -> str:
    """A `--limit` word that makes pyinfra select the host `name` and nothing else. pyinfra reads a
    --limit word as a group name first, else as an fnmatch pattern over host names
    (pyinfra_cli/cli.py `_get_inventory_pattern_matches`): a host named like a group, or named
    `db*`, would widen a batch. In brackets a character matches only itself, so the first
    character is bracketed (the word is then no host name and no identifier, so no group of a
    Python inventory) and so is every `*`, `?` and `[` (no pattern): `web` -> `[w]eb`. `!` stays
    outside brackets (`[!` negates), so a name of `!` alone has no such word (ValueError). A
    caller checks the word against the inventory's own group names (`exact_host_patterns`)."""
    first = next((i for i, char in enumerate(name) if char != "!"), None)
    if first is None:
        raise ValueError(f"{name!r}: no --limit word selects this host name alone")
    return "".join(
        f"[{char}]" if i == first or char in "*?[" else char for i, char in enumerate(name)
    )


def exact_host_patterns(names: list[str], hosts: list[tuple[str, list[str]]]) -> list[str]:
    """`exact_host_pattern` of each of `names`, checked as pyinfra would resolve it against the
    inventory's groups ([(host name, [groups])]): no group of that name, so pyinfra reads it as a
    pattern, and the pattern matches the host. It matches no other: each of its characters is a
    literal or a one-character bracket, so the one string it matches is the name (checked here
    without matching every host against every word, which at 10,000 hosts would be 10^8
    matches). A word that would select anything else is refused (InventoryError): a batch never
    runs beyond its hosts."""
    groups = {group for _, in_groups in hosts for group in in_groups}
    words = []
    for name in names:
        try:
            word = exact_host_pattern(name)
        except ValueError as error:
            raise InventoryError(f"host {error} — rename it in the inventory") from None
        if word in groups or not fnmatch(name, word):
            what = f"the group {word!r}" if word in groups else "no host"
            raise InventoryError(
                f"host {name!r}: its --limit word {word!r} would select {what} in pyinfra, not "
                "that host alone — rename the host or the group; nothing was touched"
            )
        words.append(word)
    return words
