"""Step 5: prove the server is up and speculating: /health, /v1/models, one completion, and the
`vllm:spec_decode_*` counters on /metrics."""

from __future__ import annotations

import json
import shlex
import time

from pyinfra import host, logger

from ..config import ServeConfig
from ..metrics import spec_decode_counters
from ..render import env_file_path
from .remote import journal_tail, run, with_env_file


class HealthError(RuntimeError):
    pass


def base_url(cfg: ServeConfig) -> str:
    address = "127.0.0.1" if cfg.vllm_host in ("0.0.0.0", "::", "") else cfg.vllm_host
    return f"http://{address}:{cfg.vllm_port}"


def _curl(
    cfg: ServeConfig, path: str, *, data: dict | None = None, check: bool = True, timeout: int = 30
) -> str:
    # The API key (if any) is read from the root-only env file on the host, never from argv here.
    auth = '${VLLM_API_KEY:+-H "Authorization: Bearer $VLLM_API_KEY"}'
    body = f"-H 'Content-Type: application/json' -d {shlex.quote(json.dumps(data))}" if data else ""
    command = f"curl -sS --fail-with-body -m {timeout} {auth} {body} {base_url(cfg)}{path}"
    return run(with_env_file(env_file_path(cfg), command), check=check)


def wait_healthy(
    cfg: ServeConfig, unit: str, *, speculative: bool = True, timeout_s: int | None = None
) -> dict:
    """Poll until healthy (printing progress), then run every check. Raises HealthError with the
    journal's last lines when the server does not come up or a check fails."""
    timeout_s = timeout_s or cfg.health_timeout_s
    started = time.monotonic()
    next_report = 0.0
    restarts_at_start = _restarts(unit)
    while True:
        elapsed = time.monotonic() - started
        ok, _ = host.run_shell_command(command=f"curl -sf -m 5 -o /dev/null {base_url(cfg)}/health")
        if ok:
            break
        state = run(f"systemctl is-active {unit} || true", check=False).strip()
        crashed = (
            _restarts(unit) > restarts_at_start
        )  # Restart=on-failure hides a crash loop as "activating"
        if state == "failed" or crashed or elapsed > timeout_s:
            why = "it crashed and systemd restarted it" if crashed else f"state {state}"
            raise HealthError(
                f"{host.name}: {unit} not healthy after {elapsed:.0f}s ({why}); "
                f"last journal lines:\n{journal_tail(unit)}"
            )
        if elapsed >= next_report:
            logger.info(
                f"{host.print_prefix}waiting for {unit} /health ({elapsed:.0f}s of {timeout_s}s, {state})"
            )
            next_report = elapsed + 15
        time.sleep(2)
    try:
        return check_endpoints(cfg, speculative=speculative) | {
            "seconds_to_healthy": round(elapsed, 1)
        }
    except Exception as error:
        raise HealthError(
            f"{host.name}: {unit} is up but a check failed: {error}\n"
            f"last journal lines:\n{journal_tail(unit)}"
        ) from error


def _restarts(unit: str) -> int:
    text = run(f"systemctl show -p NRestarts --value {unit}", check=False).strip()
    return int(text) if text.isdigit() else 0


def check_endpoints(cfg: ServeConfig, *, speculative: bool = True) -> dict:
    models = json.loads(_curl(cfg, "/v1/models"))
    served = [m["id"] for m in models.get("data", [])]
    if cfg.effective_served_name not in served:
        raise HealthError(f"/v1/models lists {served}, not {cfg.effective_served_name!r}")
    completion = json.loads(
        _curl(
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
    counters = spec_decode_counters(_curl(cfg, "/metrics"))
    if speculative and not counters:
        raise HealthError("/metrics has no vllm:spec_decode_* counters: speculation is not on")
    if speculative and counters.get("num_drafts", 0) < 1:
        raise HealthError(f"spec-decode counters did not move after a completion: {counters}")
    return {
        "served_models": served,
        "completion_tokens": completion["usage"]["completion_tokens"],
        "spec_decode": counters,
    }
