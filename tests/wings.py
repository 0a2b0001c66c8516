"""The two test tiers, and which live proofs guard which code: the one map of both.

* The **fast tier** (`make test`, what CI runs): every test not in a wing below: tests/unit (unit
  tests, the replays of live decisions), tests/facts (the fact fixtures), the contract tests
  against vLLM's own parser and engine config, and one real end-to-end path on the sandbox
  (FAST_LIVE).
* The **live tier** (`make test-live`, `make test-live WING=box`): every other live proof, grouped
  by wing. A wing is a pytest marker (tests/conftest.py adds it, with `live`, to each test of the
  wing's modules) and a set of paths: `make test-changed` runs the wings whose paths changed since
  the merge base with main (`python -m tests.wings changed`).

tests/unit/project/test_wings.py holds the map to the tree: every module under tests/integration is
in the fast tier or in exactly one wing, every product and sandbox file is guarded by at least one
wing, and the live tier never has fewer tests than LIVE_TESTS_AT_LEAST (a proof is moved, not
dropped).
"""

from __future__ import annotations

import argparse
import fnmatch
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Wing:
    proves: str  # the marker's description, and docs/develop/tests.md's
    tests: tuple[str, ...]  # its test modules, repo-relative
    code: tuple[str, ...]  # fnmatch patterns, repo-relative: a change here runs the wing


# The sandbox end to end and the contract tests: live, but in the fast tier.
FAST_LIVE = (
    "tests/integration/test_clean_room.py",
    "tests/integration/test_main_job.py",
    "tests/integration/test_vllm_argparse_probe.py",
)

# What every live proof stands on: the fleet, its fixtures, the serve path every wing deploys with.
EVERY_WING = (
    "sandbox/*",
    "inventories/sandbox.py",
    "group_data/all.py",
    "group_data/sandbox.py",
    "tests/integration/conftest.py",
    "tests/conftest.py",
    "tests/wings.py",
    "pyproject.toml",
    "Makefile",
    ".ci/*",
    "deploys/serve.py",
    "specdeploy/__init__.py",
    "specdeploy/*/__init__.py",
    "specdeploy/config/schema.py",
    "specdeploy/config/host_text.py",
    "specdeploy/config/inventory.py",
    "specdeploy/host/on_host.py",
    "specdeploy/host/pyinfra_speed.py",
    "specdeploy/config/problems.py",
    "specdeploy/config/timestamps.py",
    "specdeploy/checks/host_data.py",
    "specdeploy/releases/capabilities.py",
    "specdeploy/releases/tables/*",
    "specdeploy/render/argv.py",
    "specdeploy/render/units.py",
    "specdeploy/host/server.py",
    "specdeploy/flows/serve.py",
    "specdeploy/steps/*",
    "specdeploy/host/facts/*",
    "specdeploy/templates",
    "specdeploy/host/scripts/*",
    "specdeploy/config/record.py",
    "specdeploy/host/bench.py",
    "templates/vllm.*",
)

WINGS: dict[str, Wing] = {
    "serve": Wing(
        "deploys/serve.py on fresh hosts with the tiny pair: record, smoke, no-op re-run, a new "
        "request set measured without a restart, vocabulary refused, a short live tune; the host's "
        "own vLLM (0.32.0, 0.31.0) proves the argv before the swap, refusing a value its table "
        "allows with the old server untouched",
        ("tests/integration/test_serve.py", "tests/integration/test_host_proof.py"),
        (
            "specdeploy/checks/preflight.py",
            "specdeploy/checks/gpus.py",
            "specdeploy/checks/memory.py",
            "specdeploy/config/datasets.py",
            "specdeploy/checks/request_set.py",
            "specdeploy/checks/release.py",
            "specdeploy/releases/probe.py",
            "specdeploy/releases/matrix.py",
            "specdeploy/cli/migrate.py",
            "specdeploy/report/bench_summary.py",
            "specdeploy/measure/tune_flow.py",
            "specdeploy/decide/predict.py",
            "specdeploy/decide/choose.py",
        ),
    ),
    "measure": Wing(
        "the trained pair: smoke figures, the compare, gate and tune verdicts, the tune and proof "
        "across load levels (recorded for the replays), the gate across load levels and a load "
        "ramp across a schedule boundary, the choice among three drafts",
        (
            "tests/integration/test_trained_models.py",
            "tests/integration/test_load_aware.py",
            "tests/integration/test_load_gate.py",
            "tests/integration/test_choose_draft.py",
        ),
        (
            "specdeploy/measure/*",
            "specdeploy/decide/*",
            "specdeploy/report/*",
            "specdeploy/checks/load.py",
            "specdeploy/steps/gate.py",
            "specdeploy/sampling/*",
            "specdeploy/config/datasets.py",
            "specdeploy/host/watchdog.py",
            "deploys/compare.py",
            "deploys/tune.py",
            "deploys/choose_draft.py",
            "specdeploy/checks/draft_candidates.py",
            "specdeploy/checks/model_cards.py",
        ),
    ),
    "box": Wing(
        "a whole box: instances behind HAProxy, rolled one at a time, rolled back alone, measured "
        "drained, one shared gate, the weights cache given back to root, status and the host suite "
        "per instance; a host becoming a box whose first instance fails is back on its one server",
        ("tests/integration/test_whole_box.py", "tests/integration/test_box_lifecycle.py"),
        (
            "specdeploy/render/instances.py",
            "specdeploy/host/facts/haproxy.py",
            "specdeploy/observe/status_box.py",
            "specdeploy/observe/rows.py",
            "specdeploy/steps/gate.py",
            "specdeploy/sampling/*",
            "specdeploy/flows/measure.py",
            "templates/haproxy.cfg.j2",
            "templates/balancer.service.j2",
            "tests/host/*",
        ),
    ),
    "rollout": Wing(
        "fleet rollout: the host suite, --dry, locks and leases, canary and batches with a broken "
        "draft, the plain pyinfra run host by host (health timeline recorded for the replay), a "
        "host its own state refuses fails alone",
        ("tests/integration/test_rollout.py",),
        (
            "specdeploy/flows/rollout.py",
            "specdeploy/cli/*",
            "tests/integration/planted.py",
            "specdeploy/docs/*",  # the reference pages document the CLI the rollout drives
            "specdeploy/config/revisions.py",
            "tests/host/*",
            "tests/timeline.py",
        ),
    ),
    "prodshape": Wing(
        "a stock host through the prod.py shape: gated model, API key, moving ref, a real "
        "0.31.0 -> 0.32.0 upgrade, a broken release refused by its own argv proof before the "
        "swap, a token rotation, no leaked secret",
        ("tests/integration/test_production_shape.py",),
        (
            "specdeploy/config/revisions.py",
            "specdeploy/checks/release.py",
            "inventories/prod.py",
            "group_data/prod.py",
        ),
    ),
    "observe": Wing(
        "specdeploy status and its drift, Prometheus and the alert rules, an unreachable host, "
        "pins kept after main moves, the watchdog when the control node dies",
        ("tests/integration/test_status_prometheus.py",),
        (
            "specdeploy/observe/status.py",
            "specdeploy/observe/status_table.py",
            "specdeploy/observe/rows.py",
            "specdeploy/decide/metrics.py",
            "specdeploy/observe/monitoring.py",
            "specdeploy/host/watchdog.py",
            "specdeploy/config/revisions.py",
            "specdeploy/cli/*",
            "specdeploy/measure/*",
            "templates/monitoring/*",
            "tests/timeline.py",
        ),
    ),
    "faults": Wing(
        "a SIGKILLed server comes back through systemd; an interrupted download completes; "
        "a killed control process, SSH cut or a reboot after the swap, a gate fall-back then a "
        "failed change, on_fail fail and a gate whose baseline fails over an unchanged unit each "
        "leave the host serving the unit its record verified, enabled alone, no lock; status "
        "names a unit never verified; a SIGTERMed rollout leaves no pyinfra and --resume ends it",
        ("tests/integration/test_hardening.py", "tests/integration/test_fault_matrix.py"),
        (
            "specdeploy/host/watchdog.py",
            "specdeploy/steps/rollback.py",
            "tests/integration/planted.py",
            "specdeploy/steps/verify.py",
            "specdeploy/flows/rollout.py",  # (h): the controller SIGTERMed mid-batch
        ),
    ),
    "downloads": Wing(
        "a multi-format repo comes down as only what vLLM loads; a small disk is refused first",
        ("tests/integration/test_host_download.py",),
        ("specdeploy/config/revisions.py",),
    ),
    "verdict": Wing(
        "speculation judged on live traffic: a box with a control arm behind HAProxy routing at "
        "random, the live verdict pays on the trained set and loses on random-token traffic, the "
        "autopilot falls back through the serve path with no failed request",
        ("tests/integration/test_live_verdict.py",),
        (
            "specdeploy/decide/live_rule.py",
            "specdeploy/checks/live.py",
            "specdeploy/render/control.py",
            "specdeploy/observe/live_verdict.py",
            "specdeploy/flows/serve.py",
            "templates/haproxy.cfg.j2",
            "templates/monitoring/live-verdict.yml",
        ),
    ),
    "fleet": Wing(
        "the sandbox fleet itself: hosts, services, systemd quoting, down leaves nothing",
        (
            "tests/integration/test_sandbox_hosts.py",
            "tests/integration/test_sandbox_services.py",
            "tests/integration/test_systemd_quoting.py",
        ),
        (),
    ),
}

# The live tier's size when this map was written (collected with `-m live`): it may grow, never
# fall (tests/unit/project/test_wings.py collects it).
LIVE_TESTS_AT_LEAST = 95


def wing_of_test(path: str) -> str | None:
    """The wing of a test module (repo-relative), None for the fast tier."""
    for name, wing in WINGS.items():
        if path in wing.tests:
            return name
    return None


def wings_of_file(path: str) -> list[str]:
    """The wings a change to `path` (repo-relative) must run: the wing of a test module, the
    wings whose code patterns match, every wing for what all of them stand on."""
    if any(fnmatch.fnmatch(path, p) for p in EVERY_WING):
        return list(WINGS)
    return [
        name
        for name, wing in WINGS.items()
        if path in wing.tests or any(fnmatch.fnmatch(path, p) for p in wing.code)
    ]


def changed_files(base: str) -> list[str]:
    """Files changed since the merge base of HEAD and `base`, committed or not, and new files."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout

    merge_base = git("merge-base", "HEAD", base).strip()
    names = git("diff", "--name-only", merge_base).split()
    names += git("ls-files", "--others", "--exclude-standard").split()
    return sorted(set(names))


def changed_wings(base: str) -> list[str]:
    hit = {w for path in changed_files(base) for w in wings_of_file(path)}
    return [name for name in WINGS if name in hit]  # the map's order: the live tier's order


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.wings", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    changed = sub.add_parser("changed", help="the wings whose files changed, as a -m expression")
    changed.add_argument("--base", default="main", help="compare with the merge base with this")
    changed.add_argument("--why", action="store_true", help="each changed file and its wings")
    sub.add_parser("list", help="each wing, its test modules and what it proves")
    args = parser.parse_args(argv)
    if args.command == "list":
        for name, wing in WINGS.items():
            print(f"{name}: {wing.proves}\n  " + "\n  ".join(wing.tests))
        return 0
    if args.why:
        for path in changed_files(args.base):
            print(f"{path}: {' '.join(wings_of_file(path)) or '-'}", file=sys.stderr)
    print(" or ".join(changed_wings(args.base)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
