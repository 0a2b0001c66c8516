"""The server's lifecycle on the current host, at execution time (inside `python.call`): talk to it,
wait until it is healthy, start a unit fresh, stop, restore the deployed unit or the kept rollback
copy, and the measurement watchdog that restores it when the control node is gone. Used by the
serve path (health, rollback, gate) and by every measurement (compare, tune).

Every command goes through `on_host` (the host's sudo settings). Planning-time unit changes are
pyinfra operations in `steps/unit.py`; what runs here is what can only be decided mid-run.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import time
from typing import Protocol

from pyinfra import host, logger

from specdeploy.config.schema import ServeConfig, Workload
from specdeploy.decide.metrics import spec_decode_counters
from specdeploy.host.facts.haproxy import BACKEND, show_stat_servers
from specdeploy.host.facts.systemd import ServiceActive
from specdeploy.host.on_host import journal_tail, read_text, sh, sh_status, write_text


class HealthError(RuntimeError):
    pass


class UnitFile(Protocol):
    """A unit as start_fresh installs and starts it: render.RenderedUnit, which sits above this
    module (the lifecycle needs a unit's name, path and text, not how they were rendered)."""

    name: str
    path: str
    text: str


SAMPLED_HEALTH_TEMPERATURE = 0.8
WARM_UP_TIMEOUT_S = 300  # the discarded warm-up completion of a measurement's fresh server


# --- talking to the server ------------------------------------------------------------------------


def curl_config(cfg: ServeConfig, data: dict | None = None) -> str:
    """curl's `-K -` config text: the API key header and the JSON body travel on stdin, so neither
    appears in any process's argv on the host."""
    lines = []
    if cfg.vllm_api_key:
        lines.append(f'header = "Authorization: Bearer {cfg.vllm_api_key}"')
    if data is not None:
        body = json.dumps(data).replace("\\", "\\\\").replace('"', '\\"')
        lines += ['header = "Content-Type: application/json"', f'data = "{body}"']
    return "\n".join(lines) + "\n"


def request(
    cfg: ServeConfig, path: str, *, data: dict | None = None, check: bool = True, timeout: int = 30
) -> str:
    """GET (or POST `data` as JSON) `path` on the host's server, from the host; the body."""
    config = curl_config(cfg, data)
    command = f"curl -sS --fail-with-body -m {int(timeout)} -K - {shlex.quote(cfg.base_url + path)}"
    return sh(command, check=check, stdin=config)


# --- systemd's view of a unit ---------------------------------------------------------------------


def is_active(unit: str) -> str:
    """`systemctl is-active` now (the ServiceActive fact's command and parser, at execution
    time)."""
    fact = ServiceActive()
    return fact.process(sh(fact.command(unit), check=False).splitlines())


def restart_count(unit: str) -> int:
    text = sh(f"systemctl show -p NRestarts --value {shlex.quote(unit)}", check=False).strip()
    return int(text) if text.isdigit() else 0


def is_healthy(cfg: ServeConfig) -> bool:
    """/health answers 200 on the config's port now."""
    ok, _, _ = sh_status(f"curl -sf -m 5 -o /dev/null {shlex.quote(cfg.base_url)}/health")
    return ok


POLL_SLICE_S = 10  # one host command waits this long at most, so progress is printed and a
# timeout is seen from the control node; inside it the host looks every POLL_STEP_S
POLL_STEP_S = 0.2


def poll_command(cfg: ServeConfig, unit: str, *, restarts_at_start: int = 0) -> str:
    """Wait on the host, up to POLL_SLICE_S, until /health answers, the unit failed or systemd
    restarted it (more restarts than `restarts_at_start`); then say which: "healthy", or the
    unit's state and restart count. Looking on the host every 0.2 s sees a server up within
    a fraction of a second, where one SSH round trip per look cost about a second a start."""
    q = shlex.quote(unit)
    tries = int(POLL_SLICE_S / POLL_STEP_S)
    return (
        f"i=0; while [ $i -lt {tries} ]; do "
        f"if curl -sf -m 5 -o /dev/null {shlex.quote(cfg.base_url)}/health; then echo healthy; "
        "exit 0; fi; "
        f"s=$(systemctl is-active {q}); r=$(systemctl show -p NRestarts --value {q}); "
        f'if [ "$s" = failed ] || [ "${{r:-0}}" -gt {int(restarts_at_start)} ]; then break; fi; '
        f"sleep {POLL_STEP_S}; i=$((i + 1)); done; "
        f"systemctl is-active {q} || true; systemctl show -p NRestarts --value {q}"
    )


def parse_poll(output: str) -> tuple[bool, str, int]:
    """poll_command's output -> (healthy, the unit's state, its restart count)."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    if lines[:1] == ["healthy"]:
        return True, "active", 0
    state = lines[0] if lines else "unknown"
    restarts = lines[1] if len(lines) > 1 else ""
    return False, state, int(restarts) if restarts.isdigit() else 0


def poll(cfg: ServeConfig, unit: str, *, restarts_at_start: int = 0) -> tuple[bool, str, int]:
    command = poll_command(cfg, unit, restarts_at_start=restarts_at_start)
    return parse_poll(sh(command, check=False, timeout=POLL_SLICE_S + 30))


# --- healthy --------------------------------------------------------------------------------------


def wait_healthy(
    cfg: ServeConfig, unit: str, *, speculative: bool = True, timeout_s: int | None = None
) -> dict:
    """Poll until healthy (printing progress), then run every check. Raises HealthError with the
    journal's last lines when the server does not come up or a check fails."""
    timeout_s = timeout_s or cfg.health_timeout_s
    started = time.monotonic()
    next_report = 0.0
    restarts_at_start = restart_count(unit)
    while True:
        healthy, state, restarts = poll(cfg, unit, restarts_at_start=restarts_at_start)
        elapsed = time.monotonic() - started
        if healthy:
            break
        # Restart=on-failure hides a crash loop as "activating"
        crashed = restarts > restarts_at_start
        if state == "failed" or crashed or elapsed > timeout_s:
            why = "it crashed and systemd restarted it" if crashed else f"state {state}"
            raise HealthError(
                f"{host.name}: {unit} not healthy after {elapsed:.0f}s ({why}); "
                f"last journal lines:\n{journal_tail(unit, restarted=crashed)}"
            )
        if elapsed >= next_report:
            logger.info(
                f"{host.print_prefix}waiting for {unit} /health "
                f"({elapsed:.0f}s of {timeout_s}s, {state})"
            )
            next_report = elapsed + 15
    try:
        return check_endpoints(cfg, speculative=speculative) | {
            "seconds_to_healthy": round(elapsed, 1)
        }
    except Exception as error:
        raise HealthError(
            f"{host.name}: {unit} is up but a check failed: {error}\n"
            f"last journal lines:\n{journal_tail(unit, restarted=False)}"
        ) from error


def check_endpoints(cfg: ServeConfig, *, speculative: bool = True) -> dict:
    """/v1/models lists the served name, one completion returns tokens, and (speculative) the
    `vllm:spec_decode_*` counters on /metrics moved."""
    models = json.loads(request(cfg, "/v1/models"))
    served = [m["id"] for m in models.get("data", [])]
    if cfg.effective_served_name not in served:
        raise HealthError(f"/v1/models lists {served}, not {cfg.effective_served_name!r}")
    completion = json.loads(
        request(
            cfg,
            "/v1/completions",
            data={
                "model": cfg.effective_served_name,
                "prompt": "The capital of France is",
                "max_tokens": 8,
                "temperature": 0,
            },
            timeout=120,
        )
    )
    if not completion.get("choices") or completion.get("usage", {}).get("completion_tokens", 0) < 1:
        raise HealthError(f"completion returned no tokens: {completion}")
    # one sampled request too, so the T > 0 path (rejection sampling of drafts) runs before traffic
    sampled = json.loads(
        request(
            cfg,
            "/v1/completions",
            data={
                "model": cfg.effective_served_name,
                "prompt": "The capital of France is",
                "max_tokens": 8,
                "temperature": SAMPLED_HEALTH_TEMPERATURE,
                "top_p": 0.95,
                "seed": 0,
            },
            timeout=120,
        )
    )
    if not sampled.get("choices"):
        raise HealthError(
            f"a sampled completion (T = {SAMPLED_HEALTH_TEMPERATURE}) failed: {sampled}"
        )
    metrics_text = request(cfg, "/metrics")
    counters = spec_decode_counters(metrics_text)
    if speculative and not counters:
        raise HealthError("/metrics has no vllm:spec_decode_* counters: speculation is not on")
    if speculative and counters.get("num_drafts", 0) < 1:
        raise HealthError(f"spec-decode counters did not move after a completion: {counters}")
    return {
        "served_models": served,
        "completion_tokens": completion["usage"]["completion_tokens"],
        "sampled_completion_tokens": (sampled.get("usage") or {}).get("completion_tokens"),
        "spec_decode": counters,
    }


def warm_up(cfg: ServeConfig, workload: Workload) -> None:
    """One discarded completion of the workload's output length (the health check already sent
    one)."""
    request(
        cfg,
        "/v1/completions",
        data={
            "model": cfg.effective_served_name,
            "prompt": "warm up " * 8,
            "max_tokens": workload.output_len,
            "temperature": 0,
            "ignore_eos": True,
        },
        timeout=WARM_UP_TIMEOUT_S,
    )


# --- starting, stopping, restoring ----------------------------------------------------------------


def swap_in_staged(cfg: ServeConfig, name: str) -> bool:
    """Move the staged unit (steps/unit.py uploads it) into place when it differs from the
    installed one, in one `mv`, and daemon-reload. True when it was swapped in."""
    staged, target = shlex.quote(cfg.staged_unit_path(name)), shlex.quote(cfg.unit_path(name))
    out = sh(
        f"if cmp -s {staged} {target}; then echo SAME; else "
        f"cp -p {staged} {target}.tmp && mv -f {target}.tmp {target} && systemctl daemon-reload "
        "&& echo SWAPPED; fi"
    )
    return out.strip().endswith("SWAPPED")


def enable(unit: str) -> None:
    quoted = shlex.quote(unit)
    sh(f"systemctl is-enabled -q {quoted} 2>/dev/null || systemctl enable -q {quoted}")


def restart(unit: str) -> None:
    """Restart `unit` now (a failed state is reset first, so a crash-looped unit restarts too)."""
    quoted = shlex.quote(unit)
    sh(f"(systemctl reset-failed {quoted} 2>/dev/null || true) && systemctl restart {quoted}")


def start_if_inactive(unit: str, *, stop_first: list[str] = ()) -> bool:
    """Start `unit` unless it is active, `stop_first` stopped before (units that would hold its
    port: a measurement's arm an interrupted run left running); True when it was started."""
    quoted = shlex.quote(unit)
    stopping = stop_command(list(stop_first)) + "; " if stop_first else ""
    out = sh(
        f"if systemctl is-active -q {quoted}; then echo ACTIVE; else {stopping}"
        f"(systemctl reset-failed {quoted} 2>/dev/null || true) && systemctl start {quoted} "
        "&& echo STARTED; fi"
    )
    return out.strip().endswith("STARTED")


def stop_command(units: list[str]) -> str:
    return "; ".join(f"systemctl stop {shlex.quote(u)} 2>/dev/null" for u in units) + "; true"


def stop(units: list[str]) -> None:
    sh(stop_command(units), check=False)


def stop_others(cfg: ServeConfig, keep: str) -> None:
    """Every other unit of this server (the other role, a measurement's arm) off its port, so only
    `keep` may hold it: what a turn leaves running is the unit it verified or restored."""
    stop([u for u in cfg.service_units if u != keep])


def disable_and_stop(units: list[str]) -> None:
    """Stopped and disabled (not started at boot); reset-failed: a stopped crashed unit would
    still read "failed" and be found again next run."""
    stop(units)
    names = " ".join(shlex.quote(u) for u in units)
    sh(f"systemctl disable -q {names} 2>/dev/null; systemctl reset-failed {names} "
       "2>/dev/null; true", check=False)  # fmt: skip


def start_unit(unit: str) -> None:
    """Start `unit` (enabled before by the caller), a failed state reset first."""
    quoted = shlex.quote(unit)
    sh(f"systemctl reset-failed {quoted} 2>/dev/null; systemctl start {quoted}", check=False)


def start_enabled(units: list[str]) -> None:
    """Start each of `units` that is enabled at boot and not running: what the host would run
    after a reboot runs now."""
    for unit in units:
        q = shlex.quote(unit)
        sh(f"if systemctl is-enabled -q {q} 2>/dev/null && ! systemctl is-active -q {q}; then "
           f"systemctl reset-failed {q} 2>/dev/null; systemctl start {q}; fi; true",
           check=False)  # fmt: skip


def put_back_record(cfg: ServeConfig, text: str | None) -> None:
    """The server's deployment record as it was before this run (`text`; None: it had none)."""
    if text is None:
        sh(f"rm -f -- {shlex.quote(cfg.record_path)}")
    else:
        write_text(cfg.record_path, text, mode="644")


def start_fresh(
    cfg: ServeConfig, unit: UnitFile, *, speculative: bool, install: bool = True
) -> dict:
    """Stop every server on the port, (re)write the unit, start it, wait until healthy: the
    host's commands one after the other, then the wait."""
    name, stop_all = shlex.quote(unit.name), stop_command(cfg.service_units)
    sh(stop_all, check=False)
    if install:
        write_text(unit.path, unit.text, mode="644")
        sh("systemctl daemon-reload")
    sh(f"systemctl reset-failed {name} 2>/dev/null; systemctl start {name}")
    return wait_healthy(cfg, unit.name, speculative=speculative)


def remove_measure_unit(cfg: ServeConfig) -> None:
    """Stop and remove the measurement instance (compare/tune/gate), so no arm's unit outlives
    its measurement."""
    measure = cfg.measure_unit
    stop([measure])
    sh(
        f"rm -f {shlex.quote(cfg.unit_path(measure))} && systemctl daemon-reload && "
        f"systemctl reset-failed {shlex.quote(measure)} 2>/dev/null; true"
    )


def restore_deployed(cfg: ServeConfig, unit: str, role: str) -> dict:
    """Remove the measurement unit and bring the deployed unit back, healthy."""
    remove_measure_unit(cfg)
    sh(f"systemctl start {shlex.quote(unit)}")
    checked = wait_healthy(cfg, unit, speculative=role == "speculative")
    logger.info(f"{host.print_prefix}back on {unit}, healthy")
    return checked


def switch_enabled(cfg: ServeConfig, *, disable: str, enable: str) -> None:
    """Serve with `enable` from now on (also after a reboot); its staged copy is refreshed so the
    next deploy compares against the unit that really runs."""
    installed, staged = cfg.unit_path(enable), cfg.staged_unit_path(enable)
    sh(
        f"cp -p {shlex.quote(installed)} {shlex.quote(staged)} && "
        f"systemctl disable {shlex.quote(disable)} && "
        f"systemctl enable {shlex.quote(enable)}"
    )


def enable_only(cfg: ServeConfig, role: str) -> None:
    """Only the unit the host serves with stays enabled (an earlier gate decision may have left the
    other one enabled)."""
    other = shlex.quote(cfg.unit_names["baseline" if role == "speculative" else "speculative"])
    sh(f"systemctl is-enabled -q {other} 2>/dev/null && systemctl disable {other}; true")


def kept_unit_text(cfg: ServeConfig, name: str) -> str | None:
    """The unit kept for rollback (steps/unit.py keeps it), or None when there is none."""
    text = read_text(cfg.kept_unit_path(name), missing_ok=True)
    return text if text and text.strip() else None


# what a unit installed but never verified means, as the deploy logs it and `specdeploy status` says
NEVER_VERIFIED = (
    "installed, never verified: an earlier run stopped between its swap and its health check"
)


def unverified_unit(name: str, installed_sha256: str | None, verified) -> bool:
    """`name`, installed with this sha256 (None: not installed), is not the unit the record last
    verified (`verified`, the record's UnitRef): another unit, or another text (an earlier run
    swapped it in and never finished its health check). False without a record to compare. The
    one test of it: the deploy's at planning time (steps/unit.py) and at execution time
    (`unverified_installed`), and `specdeploy status` (observe/status.py)."""
    if verified is None:
        return False
    return verified.name != name or installed_sha256 != verified.sha256


def unverified_installed(cfg: ServeConfig, name: str, verified) -> bool:
    """Execution time: `name`'s installed unit is not the one the record last verified
    (`unverified_unit`; the unit is read only when the record names this one)."""
    if verified is None or verified.name != name:
        return unverified_unit(name, None, verified)
    text = read_text(cfg.unit_path(name), missing_ok=True) or ""
    return unverified_unit(name, hashlib.sha256(text.encode()).hexdigest(), verified)


def restore_recorded(cfg: ServeConfig, failed: str, serving: str) -> str | None:
    """The record serves with another unit than the one that failed (a gate's fall-back to the
    baseline, then a change of the speculative unit): `failed` is stopped and disabled, the env
    file kept with it put back, and `serving` — untouched by this run — enabled and restarted.
    Returns `serving`'s unit text, or None when it is not installed (nothing is changed)."""
    text = read_text(cfg.unit_path(serving), missing_ok=True)
    if not text or not text.strip():
        return None
    kept, env_file = shlex.quote(cfg.kept_unit_path(failed)), shlex.quote(cfg.env_file)
    stop([failed])
    sh(
        " && ".join(
            [
                f"(systemctl disable -q {shlex.quote(failed)} || true)",
                f"if [ -f {kept}.env ]; then cp -p {kept}.env {env_file}; fi",
                f"systemctl enable -q {shlex.quote(serving)}",
            ]
        )
    )
    restart(serving)
    return text


def restore_previous(cfg: ServeConfig, name: str) -> str | None:
    """Put the kept unit + env file back, daemon-reload and restart. Returns the restored unit's
    text, or None when no unit was kept (nothing is changed)."""
    text = kept_unit_text(cfg, name)
    if text is None:
        return None
    target, env_file = shlex.quote(cfg.unit_path(name)), shlex.quote(cfg.env_file)
    kept, staged = shlex.quote(cfg.kept_unit_path(name)), shlex.quote(cfg.staged_unit_path(name))
    unit = shlex.quote(name)
    sh(
        " && ".join(
            [
                f"cp -p {kept} {target}.tmp",
                f"mv -f {target}.tmp {target}",
                f"cp -p {target} {staged}",  # the next deploy compares against what really runs
                f"if [ -f {kept}.env ]; then cp -p {kept}.env {env_file}; fi",
                "systemctl daemon-reload",
                f"(systemctl reset-failed {unit} || true)",
                f"systemctl enable -q {unit}",
                f"systemctl restart {unit}",
            ]
        )
    )
    return text


# --- the local balancer of a whole box (HAProxy's runtime API on its admin socket) ----------------


def balancer(cfg: ServeConfig, command: str) -> str:
    """One HAProxy runtime API command on the host's admin socket (root-only); its answer."""
    return sh(
        f"socat -t 5 stdio UNIX-CONNECT:{shlex.quote(cfg.balancer_socket)}", stdin=command + "\n"
    )


def parse_stat(text: str) -> dict[str, dict[str, str]]:
    """`show stat` CSV -> {server name: its columns} for the instances backend (the one parser of
    that CSV, the BalancerServers fact's); {} where the answer is not that CSV."""
    return show_stat_servers(text.splitlines()) or {}


def balancer_servers(cfg: ServeConfig) -> dict[str, dict[str, str]]:
    """Each instance as the balancer sees it: status (UP, DOWN, MAINT, DRAIN, ...), scur, ..."""
    return parse_stat(balancer(cfg, "show stat"))


def drain_timeout_s(cfg: ServeConfig) -> float:
    """How long a drained instance's requests in flight may take to finish: one request of the
    workload's output length at the smoke floor rate, at least 60 s, at most health_timeout_s."""
    one_request = cfg.workload.output_len / cfg.smoke_min_tokens_per_s
    return min(max(60.0, one_request), float(cfg.health_timeout_s))


def drain(cfg: ServeConfig, name: str, *, timeout_s: float) -> None:
    """Take `name` out of the balancer: no new requests (drain), wait until its requests in flight
    are answered (at most `timeout_s`), then maintenance, so its restart fails no client request."""
    balancer(cfg, f"set server {BACKEND}/{name} state drain")
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        row = balancer_servers(cfg).get(name, {})
        if row.get("scur", "0") in ("0", ""):
            break
        time.sleep(1)
    else:
        logger.warning(
            f"{host.print_prefix}{name} still had requests in flight after {timeout_s:.0f}s of "
            "draining; restarting it anyway"
        )
    balancer(cfg, f"set server {BACKEND}/{name} state maint")
    logger.info(f"{host.print_prefix}{name} drained from the balancer")


def undrain(cfg: ServeConfig, name: str) -> None:
    """Put `name` back into the balancer (its /health check decides from then on)."""
    balancer(cfg, f"set server {BACKEND}/{name} state ready")
    logger.info(f"{host.print_prefix}{name} back in the balancer")


def start_balancer(cfg: ServeConfig, *, reload: bool) -> None:
    """Start the balancer (or reload it, seamlessly, when its config changed) and wait until it
    answers /health on vllm_port through an instance."""
    unit = shlex.quote(cfg.balancer_unit)
    sh("systemctl daemon-reload")
    enable(cfg.balancer_unit)
    if start_if_inactive(cfg.balancer_unit):
        logger.info(f"{host.print_prefix}started {cfg.balancer_unit}")
    elif reload:
        sh(f"systemctl reload {unit}")
        logger.info(f"{host.print_prefix}reloaded {cfg.balancer_unit} (its config changed)")
    started = time.monotonic()
    while True:
        if is_healthy(cfg):
            return
        if time.monotonic() - started > 60:
            # An active balancer that does not answer is its last invocation alone; one that is
            # not active may be a restart that has not logged its failure yet.
            state = is_active(cfg.balancer_unit)
            raise HealthError(
                f"{host.name}: {cfg.balancer_unit} does not answer /health on {cfg.base_url} "
                f"({state}); last journal lines:\n"
                f"{journal_tail(cfg.balancer_unit, restarted=state != 'active')}"
            )
        time.sleep(1)
