"""Fleet rollouts that cannot take the fleet down.

* `specdeploy rollout INVENTORY deploys/serve.py --canary-group canary --batch-size N` runs pyinfra
  once per batch with `--limit`: the canary group first, then the other hosts N at a time, in
  inventory order. A batch is done only when pyinfra exits 0, i.e. every host in it passed its
  health check; otherwise the rollout stops and the hosts of later batches are never touched.
* Inside a deploy, `verify_or_rollback` wraps the health check: when it fails on a host whose unit or
  env file this run changed, the previous unit + env file (kept in state_dir/rollback) are restored,
  the service restarted and checked healthy again, and the failure is raised with the journal tail.
* `show_unit_diff` prints, at planning time (so also under `--dry`), the argv diff between the unit
  installed on the host and the one this deploy would install.
"""

from __future__ import annotations

import difflib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .config import ServeConfig

# ---------------------------------------------------------------------------------------------------
# ExecStart parsing (the inverse of render.systemd_quote) and argv diffs


def systemd_split(line: str) -> list[str]:
    """Split an ExecStart= value the way systemd does for the words render.exec_start writes:
    whitespace-separated words, double-quoted words with C escapes, `%%` -> `%`, `$$` -> `$`."""
    words, i, n = [], 0, len(line)
    escapes = {"n": "\n", "t": "\t", "\\": "\\", '"': '"', "'": "'", "r": "\r"}
    while i < n:
        while i < n and line[i] in " \t":
            i += 1
        if i >= n:
            break
        word = []
        if line[i] in "\"'":
            quote = line[i]
            i += 1
            while i < n and line[i] != quote:
                if line[i] == "\\" and i + 1 < n:
                    word.append(escapes.get(line[i + 1], line[i + 1]))
                    i += 2
                else:
                    word.append(line[i])
                    i += 1
            i += 1
        else:
            while i < n and line[i] not in " \t":
                word.append(line[i])
                i += 1
        words.append("".join(word).replace("%%", "%").replace("$$", "$"))
    return words


def unit_exec_argv(unit_text: str | None) -> list[str] | None:
    """The argv of the (last) ExecStart= line of a unit file's text; None without one."""
    if not unit_text:
        return None
    argv = None
    for line in unit_text.splitlines():
        if line.startswith("ExecStart="):
            value = line[len("ExecStart=") :].lstrip("-@:+!")
            argv = systemd_split(value) if value.strip() else None
    return argv


def flag_value(argv: list[str], flag: str) -> str | None:
    for i, word in enumerate(argv):
        if word == flag and i + 1 < len(argv):
            return argv[i + 1]
        if word.startswith(flag + "="):
            return word.split("=", 1)[1]
    return None


def _argv_lines(argv: list[str]) -> list[str]:
    """One line per flag (with its value), the --speculative-config JSON expanded key by key."""
    lines, i = [], 0
    while i < len(argv):
        word = argv[i]
        value = (
            argv[i + 1]
            if i + 1 < len(argv) and word.startswith("-") and not argv[i + 1].startswith("--")
            else None
        )
        if value is not None:
            if word in ("--speculative-config", "-sc"):
                try:
                    spec = json.loads(value)
                    lines += [f"{word} {key}={json.dumps(spec[key])}" for key in sorted(spec)]
                    i += 2
                    continue
                except ValueError:
                    pass
            lines.append(f"{word} {value}")
            i += 2
        else:
            lines.append(word)
            i += 1
    return lines


def argv_diff(
    old: list[str] | None,
    new: list[str],
    *,
    old_name: str = "installed",
    new_name: str = "rendered",
) -> str:
    """A unified diff of two argv lists ('' when equal)."""
    if old == new:
        return ""
    diff = difflib.unified_diff(
        _argv_lines(old or []),
        _argv_lines(new),
        fromfile=f"{old_name} argv",
        tofile=f"{new_name} argv",
        lineterm="",
        n=2,
    )
    return "\n".join(diff)


# ---------------------------------------------------------------------------------------------------
# Inside a deploy (pyinfra context)


def show_unit_diff(cfg: ServeConfig, rendered) -> bool:
    """Planning time: print what the unit change would do on this host (argv diff against the unit
    installed now; the env file only as changed/unchanged, never its secrets). Returns True when the
    unit would change."""
    import hashlib

    from pyinfra import host, logger
    from pyinfra.facts.files import Sha1File

    from .facts import FileText
    from .render import env_file_path, render_env_file
    from .steps.unit import UNIT_DIR

    path = f"{UNIT_DIR}/{rendered.name}"
    installed_sha = host.get_fact(Sha1File, path=path)
    unit_changes = installed_sha != hashlib.sha1(rendered.text.encode()).hexdigest()
    env_sha = host.get_fact(Sha1File, path=env_file_path(cfg))
    env_changes = env_sha != hashlib.sha1(render_env_file(cfg).encode()).hexdigest()
    if unit_changes:
        installed = unit_exec_argv(host.get_fact(FileText, path=path))
        if installed is None:
            logger.warning(
                f"{host.print_prefix}{rendered.name} is not installed yet; it will start with argv:\n  "
                + "\n  ".join(_argv_lines(rendered.argv))
            )
        else:
            diff = argv_diff(installed, rendered.argv)
            logger.warning(
                f"{host.print_prefix}{rendered.name} will change and restart; "
                + (f"argv diff:\n{diff}" if diff else "argv unchanged (other unit lines differ)")
            )
    if env_changes:
        logger.warning(
            f"{host.print_prefix}{env_file_path(cfg)} (secrets) will change"
            f"{' and restart the server' if not unit_changes else ''}; values are not shown"
        )
    return unit_changes or env_changes


class RolledBack(RuntimeError):
    """The new config failed its health check on a host; the previous one is back and healthy."""


def _report(entry: dict) -> None:
    """Leave a machine-readable failure note for `specdeploy rollout` (env SPECDEPLOY_ROLLOUT_REPORT)."""
    directory = os.environ.get("SPECDEPLOY_ROLLOUT_REPORT")
    if directory:
        Path(directory).mkdir(parents=True, exist_ok=True)
        (Path(directory) / f"{entry['host']}.json").write_text(json.dumps(entry, indent=2))


def verify_or_rollback(verify, cfg: ServeConfig, rendered, *, changed, **kwargs):
    """python.call target: run `verify(cfg, rendered, **kwargs)`; when it fails on a host whose unit or
    env file this run changed, put the previous unit + env file back, restart, prove it healthy,
    release the deploy lock and raise RolledBack naming host and cause (journal tail included)."""
    from pyinfra import host, logger

    from .steps import health, lock
    from .steps.unit import restore_previous

    try:
        return verify(cfg, rendered, **kwargs)
    except Exception as error:
        cause = str(error)
        if (
            not changed()
        ):  # nothing of ours to undo (e.g. the server was only down): report, free the lock
            _report(
                {
                    "host": host.name,
                    "cause": cause,
                    "rolled_back": False,
                    "after": "not rolled back: this run changed neither unit nor env file",
                }
            )
            lock.release_now(cfg)
            raise
        logger.warning(
            f"{host.print_prefix}new config failed: {cause.splitlines()[0]}; rolling back"
        )
        previous = restore_previous(cfg, rendered.name)
        entry = {"host": host.name, "cause": cause, "rolled_back": previous is not None}
        if previous is None:
            entry["after"] = "no previous unit: the service is stopped"
            _report(entry)
            lock.release_now(cfg)
            raise RolledBack(
                f"{host.name}: health check failed on the new config and there is no previous "
                f"unit to roll back to; {rendered.name} is stopped.\ncause: {cause}"
            ) from error
        old = _config_for_argv(cfg, previous)
        try:
            checked = health.wait_healthy(
                old, rendered.name, speculative="--speculative-config" in previous
            )
            entry["after"] = f"healthy on the previous unit after {checked['seconds_to_healthy']}s"
        except Exception as again:
            entry["after"] = f"NOT healthy after rollback either: {again}"
        _report(entry)
        lock.release_now(cfg)
        raise RolledBack(
            f"{host.name}: ROLLED BACK: the new config failed its health check; the previous "
            f"unit and env file are restored and {rendered.name} is {entry['after']}.\n"
            f"cause: {cause}"
        ) from error


def _config_for_argv(cfg: ServeConfig, argv: list[str]) -> ServeConfig:
    """The new config with the address and served name the restored unit actually uses."""
    update = {}
    if (address := flag_value(argv, "--host")) is not None:
        update["vllm_host"] = address
    if (port := flag_value(argv, "--port")) is not None:
        update["vllm_port"] = int(port)
    if (name := flag_value(argv, "--served-model-name")) is not None:
        update["served_model_name"] = name
    return cfg.model_copy(update=update)


# ---------------------------------------------------------------------------------------------------
# The controller: `specdeploy rollout`


def inventory_hosts(inventory_path: str, cwd: str | None = None) -> list[tuple[str, list[str]]]:
    """[(host name, [groups])] in inventory order, read without connecting."""
    from pyinfra.api import State
    from pyinfra.context import ctx_state
    from pyinfra_cli.inventory import make_inventory

    with ctx_state.use(State()):
        inventory = make_inventory(inventory_path, cwd=cwd or os.getcwd())
    return [(h.name, list(h.groups)) for h in inventory]


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


def run_rollout(
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

    say(
        f"{sum(map(len, batches))} host(s) in {total} batch(es): "
        + " | ".join(
            f"{'canary ' if i == 0 and canary_group else ''}[{', '.join(b)}]"
            for i, b in enumerate(batches)
        )
    )
    started = time.monotonic()
    for index, batch in enumerate(batches, 1):
        with_report = (
            Path(os.environ.get("TMPDIR", "/tmp")) / f"specdeploy-rollout-{os.getpid()}-{index}"
        )
        command = ["pyinfra", "--dry" if dry else "-y", inventory, deploy, *(pyinfra_args or [])]
        for name in batch:
            command += ["--limit", name]
        say(f"batch {index}/{total} [{', '.join(batch)}]: $ {shlex.join(command)}")
        env = {**os.environ, "SPECDEPLOY_ROLLOUT_REPORT": str(with_report)}
        t0 = time.monotonic()
        result = subprocess.run(command, env=env)
        notes = (
            [json.loads(p.read_text()) for p in sorted(with_report.glob("*.json"))]
            if with_report.is_dir()
            else []
        )
        shutil.rmtree(with_report, ignore_errors=True)
        if result.returncode != 0:
            say(
                f"batch {index}/{total} FAILED after {time.monotonic() - t0:.0f}s (pyinfra exit {result.returncode})"
            )
            for entry in notes:
                action = (
                    "rolled back to its previous unit and env file; " + entry.get("after", "")
                    if entry.get("rolled_back")
                    else entry.get("after", "not rolled back")
                )
                say(
                    f"FAILED host {entry['host']}: {action}\n  cause: "
                    + "\n  ".join(entry["cause"].splitlines())
                )
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
        f"rollout {'dry run ' if dry else ''}complete: {total} batch(es) in {time.monotonic() - started:.0f}s"
    )
    return 0
