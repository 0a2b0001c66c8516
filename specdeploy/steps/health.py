"""Step 6: prove the server is up and speculating: /health, /v1/models, one completion, and the
`vllm:spec_decode_*` counters on /metrics."""

from __future__ import annotations

import json
import shlex
import time

from pyinfra import host, logger

from ..config import ServeConfig
from ..metrics import spec_decode_counters
from ..on_host import journal_tail, sh, sh_status


class HealthError(RuntimeError):
    pass


def base_url(cfg: ServeConfig) -> str:
    """The server's URL as seen from the host itself (a wildcard bind is reached on loopback)."""
    if cfg.vllm_host in ("0.0.0.0", ""):
        address = "127.0.0.1"
    elif cfg.vllm_host == "::":
        address = "[::1]"
    elif ":" in cfg.vllm_host:  # an IPv6 literal needs brackets in a URL
        address = f"[{cfg.vllm_host}]"
    else:
        address = cfg.vllm_host
    return f"http://{address}:{cfg.vllm_port}"


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
    command = (
        f"curl -sS --fail-with-body -m {int(timeout)} -K - {shlex.quote(base_url(cfg) + path)}"
    )
    return sh(command, check=check, stdin=curl_config(cfg, data))


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
        ok, _, _ = sh_status(f"curl -sf -m 5 -o /dev/null {shlex.quote(base_url(cfg))}/health")
        if ok:
            break
        state = sh(f"systemctl is-active {shlex.quote(unit)} || true", check=False).strip()
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
                f"{host.print_prefix}waiting for {unit} /health "
                f"({elapsed:.0f}s of {timeout_s}s, {state})"
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
    text = sh(f"systemctl show -p NRestarts --value {shlex.quote(unit)}", check=False).strip()
    return int(text) if text.isdigit() else 0


def check_endpoints(cfg: ServeConfig, *, speculative: bool = True) -> dict:
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
    counters = spec_decode_counters(request(cfg, "/metrics"))
    if speculative and not counters:
        raise HealthError("/metrics has no vllm:spec_decode_* counters: speculation is not on")
    if speculative and counters.get("num_drafts", 0) < 1:
        raise HealthError(f"spec-decode counters did not move after a completion: {counters}")
    return {
        "served_models": served,
        "completion_tokens": completion["usage"]["completion_tokens"],
        "spec_decode": counters,
    }
