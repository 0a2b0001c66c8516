"""`specdeploy`: a thin CLI over the library and pyinfra (the deploys themselves run via
`pyinfra`)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from specdeploy.checks import host_data as checks
from specdeploy.checks.live import check_classes
from specdeploy.config.inventory import InventoryError, host_data, hosts_with_data, limit_hosts
from specdeploy.config.problems import ConfigError, grouped, shared_line
from specdeploy.config.schema import config_from_data
from specdeploy.releases import capabilities, matrix, probe
from specdeploy.render import units as render
from specdeploy.report.paths import reports_root


def cmd_check(args) -> int:
    hosts = host_data(args.inventory, args.group_data)
    if not hosts:
        print(
            f"{args.inventory}: no hosts in this inventory — add hosts to it: a list of names, or "
            '(name, data) pairs, per group (e.g. gpu = ["gpu-01.example.internal"]; see '
            "inventories/prod.py)",
            file=sys.stderr,
        )
        return 1
    reports = [checks.check_report(name, data) for name, data in hosts.items()]  # one per host
    problems = [p for report in reports for p in report.problems]
    # across hosts: the control classes of plain hosts, over the hosts whose own data is valid
    valid = [name for name, report in zip(hosts, reports, strict=True) if not report.problems]
    problems += check_classes({name: config_from_data(hosts[name]) for name in valid})
    if args.strict:  # keys neither specdeploy's nor pyinfra's count as problems too
        problems += [p for name, data in hosts.items() for p in checks.unknown_keys(name, data)]
    warnings = [w for report in reports for w in report.warnings]
    notes = [n for report in reports for n in report.notes]
    # the same said of many hosts (a group_data setting) once, with the hosts counted; each with
    # its key's section of the reference: what it means
    for names, problem in grouped(problems):
        print(f"{shared_line('', names, problem)} (see {problem.reference})")
    for names, warning in grouped(warnings):
        print(f"{shared_line('warning', names, warning)} (see {warning.reference})")
    for names, note in grouped(notes):
        print(shared_line("note", names, note), file=sys.stderr)
    if problems:
        bad = len({p.host for p in problems})
        print(
            f"{len(problems)} problem(s) on {bad} of {len(hosts)} host(s); nothing was touched.",
            file=sys.stderr,
        )
        return 1
    print(f"{len(hosts)} host(s) valid.")
    return 0


def cmd_render(args) -> int:
    hosts = host_data(args.inventory, args.group_data)
    out = Path(args.out)
    failed = False
    configs = {}
    for name, data in hosts.items():
        try:
            cfg = checks.check_config(name, data)
        except checks.ConfigError as error:
            print(error, file=sys.stderr)
            failed = True
            continue
        host_dir = out / name
        host_dir.mkdir(parents=True, exist_ok=True)
        argvs = {}
        for role in render.ROLES:
            unit = render.render_unit(cfg, role)
            (host_dir / unit.name).write_text(unit.text)
            argvs[role] = unit.argv
        (host_dir / "argv.json").write_text(json.dumps(argvs, indent=2) + "\n")
        env_path = host_dir / Path(cfg.env_file).name
        env_path.touch(mode=0o600)
        os.chmod(env_path, 0o600)
        env_path.write_text(render.render_env_file(cfg))
        print(f"{name}: wrote {host_dir}")
        configs[name] = cfg
    write_monitoring(args, out, configs)
    return 1 if failed else 0


def write_monitoring(args, out: Path, configs: dict) -> None:
    """Prometheus file_sd targets, scrape config, rules, Grafana dashboard (monitoring.py)."""
    from specdeploy.observe.monitoring import BALANCER_JOB, write_prometheus

    hosts = [
        (name, sorted(groups), data, configs[name])
        for name, groups, data in hosts_with_data(args.inventory, args.group_data)
        if name in configs
    ]
    summary = write_prometheus(
        out / "prometheus",
        hosts,
        reports=Path(args.reports),
        warn=lambda line: print(line, file=sys.stderr),
    )
    print(
        f"prometheus: wrote {out / 'prometheus'}: {summary.targets} target(s) in job(s) "
        f"{', '.join(summary.jobs) or '-'}"
        + (f", {summary.balancers} balancer(s) in job {BALANCER_JOB}" if summary.balancers else "")
        + "; TPOT/acceptance baselines for "
        f"{', '.join(summary.baselines) or 'no host'} (from {args.reports})"
    )


def cmd_migrate(args) -> int:
    from specdeploy.cli.migrate import MigrationError, format_migration, migrate

    argv = args.command
    if argv and argv[0] == "--":
        argv = argv[1:]
    try:
        print(format_migration(migrate(argv)))
    except MigrationError as error:
        print(f"specdeploy migrate: {error}", file=sys.stderr)
        return 2
    return 0


def cmd_rollout(args) -> int:
    import shlex

    from specdeploy.flows.rollout import roll_out

    extra = shlex.split(args.pyinfra_args)
    try:
        return roll_out(
            args.inventory,
            args.deploy,
            canary_group=args.canary_group or None,
            batch_size=args.batch_size,
            batches=args.batches,
            max_fail_percent=args.max_fail_percent,
            progress_path=args.progress,
            resume=args.resume,
            retry_failed=args.retry_failed,
            dry=args.dry,
            pyinfra_args=extra,
            limit=args.limit,
        )
    except ValueError as error:
        print(f"specdeploy rollout: {error}", file=sys.stderr)
        return 2


def cmd_status(args) -> int:
    from specdeploy.observe.status import run_status

    try:
        return run_status(
            args.inventory,
            limit=args.limit,
            group_data=args.group_data,
            as_json=args.json,
            watch=args.watch,
            timeout=args.timeout,
            interval=args.interval,
        )
    except (FileNotFoundError, ValueError) as error:
        print(f"specdeploy status: {error}", file=sys.stderr)
        return 2


def cmd_live(args) -> int:
    from specdeploy.observe.live_verdict import run_live

    try:
        return run_live(
            args.inventory,
            limit=args.limit,
            group_data=args.group_data,
            metrics_port=args.metrics_port,
            once=args.once,
        )
    except (FileNotFoundError, ValueError, ConfigError) as error:
        print(f"specdeploy live: {error}", file=sys.stderr)
        return 2


def cmd_unlock(args) -> int:
    """Remove a deploy lock left behind by a deploy that died (check that it really is gone
    first)."""
    import shlex
    import subprocess

    hosts = hosts_with_data(args.inventory, args.group_data)
    chosen = limit_hosts([(name, groups) for name, groups, _ in hosts], args.limit, args.inventory)
    failed = 0
    for name, _, data in hosts:
        if name not in chosen:
            continue
        path = shlex.quote(config_from_data(data).lock_path)
        command = [
            "pyinfra",
            "-y",
            args.inventory,
            "--limit",
            name,
            "exec",
            "--",
            f"if [ -f {path} ]; then echo removing: $(cat {path}); rm -f {path}; "
            "else echo no lock; fi",
        ]
        failed += subprocess.run(command).returncode != 0
    return 1 if failed else 0


NOT_BENCH_JSON = {"conditions.json", "prediction.json", "summary.json"}  # in report folders


def cmd_predict_k(args) -> int:
    """TPOT for every k from saved `vllm bench serve` JSONs (files, or folders of them); offline."""
    from specdeploy.decide.predict import (
        NotABenchRun,
        format_table,
        json_rows,
        predict,
        run_from_bench,
    )

    files = []
    for name in args.bench_json:
        path = Path(name)
        files += (
            sorted(f for f in path.glob("*.json") if f.name not in NOT_BENCH_JSON)
            if path.is_dir()
            else [path]
        )
    runs = []
    for f in files:
        try:
            run = run_from_bench(json.loads(f.read_text()), source=str(f))
        except (OSError, ValueError, NotABenchRun) as error:
            print(f"specdeploy predict-k: {f}: skipped ({error})", file=sys.stderr)
            continue
        if run is not None:  # warm-ups and the prefix-caching profile do not count
            runs.append(run)
    if not runs:
        print(
            "specdeploy predict-k: no usable benchmark run — give `vllm bench serve` result JSONs "
            "or folders of them (a compare's or tune's report folder; warm-ups and the "
            "prefix-caching profile do not count)",
            file=sys.stderr,
        )
        return 1
    prediction = predict(runs)
    print(json.dumps(json_rows(prediction), indent=1) if args.json else format_table(prediction))
    return 0


def cmd_releases_list(args) -> int:
    for release in capabilities.known_versions():
        print("\n".join(matrix.lines(release)))
    return 0


def cmd_releases_add(args) -> int:
    out = Path(args.out) if args.out else capabilities.user_releases_dir()
    packages = tuple(args.package or ["vllm"])
    try:
        target = probe.add_release(args.version, out, args.wheel, packages, args.pip)
    except probe.ProbeError as error:
        print(
            f"specdeploy releases add {args.version}: {error} — the probes do not recognise this "
            "release's code (specdeploy's own table of it comes with a specdeploy release); "
            "meanwhile pin a release `specdeploy releases list` shows, or set "
            "allow_unknown_release = true to check against the newest table",
            file=sys.stderr,
        )
        return 1
    except subprocess.CalledProcessError as error:
        print(
            f"specdeploy releases add {args.version}: {error} — check that the release exists "
            "and pip reaches its index (--pip --index-url URL ...), or give its wheel with "
            "--wheel FILE",
            file=sys.stderr,
        )
        return 1
    capabilities.reread_tables()
    print("\n".join(probe.review([out, capabilities.packaged_dir()], target.stem)))
    if target.stem not in capabilities.known_versions():  # --out a folder check does not read
        print(f"wrote {target}; `specdeploy check` reads the package's tables and "
              f"{capabilities.user_releases_dir()}, not that folder")  # fmt: skip
    elif capabilities.table_source(target.stem) == "specdeploy":  # the reviewed one wins
        print(f"wrote {target}; specdeploy's own table of {target.stem} is the one checks use")
    else:
        print(f"wrote {target}; `specdeploy check` reads it from there")
    return 0


def version() -> str:
    """The installed distribution's version (what pip installed), not a copy in the source."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("specdeploy")
    except PackageNotFoundError:  # a checkout run without installing it
        return "unknown (not installed)"


def command(sub, name: str, help: str, description: str | None = None) -> argparse.ArgumentParser:
    """A subcommand that says what it does twice: `help`, its line in its parent's `--help`, and
    `description` (else the help line as a sentence), what its own `--help` says first."""
    text = description or f"{help[0].upper()}{help[1:]}."
    return sub.add_parser(name, help=help, description=text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdeploy", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    def with_inventory(p):
        p.add_argument("inventory", help="pyinfra inventory file, e.g. inventories/prod.py")
        p.add_argument(
            "--group-data", action="append", help="extra group_data directory (repeatable)"
        )
        return p

    p = with_inventory(
        command(
            sub,
            "check",
            "validate every host's data; touches no host",
            "Validate every host's data as the deploy would (merged group_data and host data, the "
            "pinned release's table, the request set) and print each problem with its host, key "
            "and fix; touches no host. Exit 0: every host valid; 1: problems; 2: the inventory "
            "could not be read.",
        )
    )
    p.add_argument(
        "--strict",
        action="store_true",
        help="also refuse top-level keys that are neither specdeploy's nor pyinfra's (listed)",
    )
    p.set_defaults(func=cmd_check)
    p = with_inventory(
        command(
            sub,
            "render",
            "write each host's speculative and baseline units",
            "Write each host's speculative and baseline units, env file and argv (one folder per "
            "host), and the Prometheus and Grafana files for the fleet; touches no host.",
        )
    )
    p.add_argument("--out", required=True, help="output directory (one folder per host)")
    p.add_argument(
        "--reports",
        default=str(reports_root()),
        help="smoke benchmark JSONs (reports/<host>/) for the alerts' baselines",
    )
    p.set_defaults(func=cmd_render)
    p = command(
        sub,
        "migrate",
        "convert old --speculative-model style flags to --speculative-config",
        "Convert an old vLLM command line's speculative flags (--speculative-model, "
        "--num-speculative-tokens, ...) to --speculative-config: prints the equivalent command "
        "and the host data that replaces it (target_model, speculative_config, "
        "vllm_extra_args); give the command after --, e.g. "
        "`specdeploy migrate -- vllm serve MODEL --speculative-model DRAFT`.",
    )
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- vllm serve MODEL ...")
    p.set_defaults(func=cmd_migrate)
    p = command(
        sub,
        "rollout",
        "canary group first, then a ramp of batches within a failure budget; resumable",
        "Run a deploy (pyinfra, one run per batch) over the inventory: the canary group first, "
        "then a ramp of batches within a failure budget; each host's outcome is kept in a "
        "progress file, so a stopped rollout resumes (--resume) with the same pinned revisions. "
        "Ctrl-C, SIGTERM or SIGHUP stops the running batch's pyinfra as its own Ctrl-C does, "
        "waits for it and records the interruption (a second one kills it): exit 128 + the "
        "signal's number.",
    )
    p.add_argument("inventory", help="pyinfra inventory file, e.g. inventories/prod.py")
    p.add_argument(
        "deploy",
        nargs="?",
        default="deploys/serve.py",
        help="deploy file (default deploys/serve.py)",
    )
    p.add_argument(
        "--canary-group", default="canary", help="inventory group deployed first ('' for none)"
    )
    p.add_argument(
        "--batches",
        help="a ramp after the canary, numbers or percentages of the rollout's hosts, the last "
        "repeating (Ansible's serial list), e.g. 1,5%%,25%%,100%% (default 1)",
    )
    p.add_argument("--batch-size", type=int, help="hosts per batch after the canary (--batches N)")
    p.add_argument(
        "--max-fail-percent",
        help="failure budget: failed hosts (rolled back) the rollout goes on past, in %% of its "
        "hosts, rounded down (default 0: the first failure stops it; a failed canary always "
        "does); with --resume it replaces the rollout's own budget, to go on past its failed hosts",
    )
    p.add_argument(
        "--progress",
        help="the progress file (default under $XDG_STATE_HOME/specdeploy/rollouts/)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the unfinished rollout of the progress file (same pins, finished hosts "
        "untouched; a failed canary runs again first; a spent failure budget stops it before any "
        "batch)",
    )
    p.add_argument(
        "--retry-failed",
        action="store_true",
        help="with --resume: run the failed hosts again first",
    )
    p.add_argument(
        "--limit", action="append", help="only these hosts, groups or host patterns (repeatable)"
    )
    p.add_argument(
        "--dry", action="store_true", help="pyinfra --dry per batch: show what would change"
    )
    p.add_argument(
        "--pyinfra-args", default="", help='extra pyinfra arguments, one string, e.g. "--debug"'
    )
    p.set_defaults(func=cmd_rollout)
    p = with_inventory(
        command(
            sub,
            "status",
            "each host now: reachable, version, unit drift, service, live speculation figures",
            "Each host now, read-only: reachable, the deployed version and record, drift of the "
            "installed unit from the rendered one and from the one the record verified (a unit "
            "installed but never verified, or not yet running, is drift), the service's state, "
            "and live speculation figures from the server's /metrics.",
        )
    )
    p.add_argument(
        "--limit", action="append", help="only these hosts, groups or host patterns (repeatable)"
    )
    p.add_argument("--json", action="store_true", help="a JSON list, one object per host")
    p.add_argument(
        "--watch", type=float, metavar="SECONDS", help="repeat every SECONDS until interrupted"
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        help="seconds per host for connecting and every read (default 30)",
    )
    p.add_argument(
        "--interval",
        type=float,
        default=5.0,
        help="seconds between the two /metrics scrapes (default 5)",
    )
    p.set_defaults(func=cmd_status)
    p = with_inventory(
        command(
            sub,
            "live",
            "judge speculation on live traffic on boxes and classes with a control arm",
            "For every box, and every class of plain hosts, with a control arm "
            "(speculation_control): read both arms' /metrics once a window, decide pays, loses "
            "or undecided by the exact sign test over paired windows, export the verdicts for "
            "Prometheus and, where speculation_autopilot says so, roll the box or the class "
            "through the ordinary serve path.",
        )
    )
    p.add_argument(
        "--limit", action="append", help="only these hosts, groups or host patterns (repeatable)"
    )
    p.add_argument(
        "--metrics-port", type=int, help="serve the verdicts' Prometheus metrics on this port"
    )
    p.add_argument(
        "--once", action="store_true", help="one window boundary, then the verdicts; no loop"
    )
    p.set_defaults(func=cmd_live)
    p = with_inventory(
        command(
            sub,
            "unlock",
            "remove a stale per-host deploy lock",
            "Remove the deploy lock a deploy that died left on each host (pyinfra exec); make "
            "sure that deploy really is gone first.",
        )
    )
    p.add_argument(
        "--limit", action="append", help="only these hosts, groups or host patterns (repeatable)"
    )
    p.set_defaults(func=cmd_unlock)
    p = command(
        sub,
        "predict-k",
        "predict TPOT for every k from saved benchmark JSONs (offline)",
        "Predict the time per output token for every num_speculative_tokens k from saved "
        "`vllm bench serve` JSONs (files or folders of them); offline, touches no host.",
    )
    p.add_argument(
        "bench_json", nargs="+", help="vllm bench serve result JSONs, or folders of them"
    )
    p.add_argument("--json", action="store_true", help="a JSON list, one object per k")
    p.set_defaults(func=cmd_predict_k)
    p = command(
        sub,
        "releases",
        "the vLLM releases specdeploy knows, and adding one",
        "The vLLM releases specdeploy knows (the tables `check` validates host data against), "
        "and adding one from its own wheels.",
    )
    releases = p.add_subparsers(dest="releases_cmd", required=True, metavar="COMMAND")
    command(
        releases,
        "list",
        "per known release: what check accepts, refuses as removed, warns about",
    ).set_defaults(func=cmd_releases_list)
    p = command(
        releases,
        "add",
        "read a release's table from its own wheels",
        "Read a vLLM release's table (speculative keys, methods, flags, builds) from its own "
        "wheels, downloaded with pip or given with --wheel, and write it where `specdeploy "
        "check` reads it.",
    )
    p.add_argument("version", help="the release, e.g. 0.34.0")
    p.add_argument("--wheel", action="append", type=Path, default=[], help="a local wheel")
    p.add_argument("--package", action="append", choices=probe.PACKAGES,
                   help="download this build (repeatable; default vllm)")  # fmt: skip
    p.add_argument("--out", help=f"where to write (default ${capabilities.USER_RELEASES_ENV}, "
                   "else $XDG_DATA_HOME/specdeploy/releases)")  # fmt: skip
    p.add_argument("--pip", nargs=argparse.REMAINDER, default=[], help="extra pip arguments")
    p.set_defaults(func=cmd_releases_add)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from specdeploy.host import pyinfra_speed

    pyinfra_speed.compute_global_arguments_once()  # for the commands that run pyinfra in-process
    try:
        return args.func(args)
    except InventoryError as error:  # every command the same way: what, where, nothing touched
        print(f"specdeploy {args.cmd}: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
