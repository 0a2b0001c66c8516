"""Render systemd units and the secrets env file from a ServeConfig (templates/ holds the text)."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import jinja2

from .config import ServeConfig
from .flags import serve_argv

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


def unit_name(cfg: ServeConfig, role: str) -> str:
    return (
        f"{cfg.service_name}.service"
        if role == "speculative"
        else f"{cfg.service_name}-baseline.service"
    )


def env_file_path(cfg: ServeConfig) -> str:
    return f"/etc/specdeploy/{cfg.service_name}.env"


def service_environment(cfg: ServeConfig) -> dict[str, str]:
    """Non-secret environment: weights come only from the HF cache the deploy filled (offline)."""
    return {
        "HF_HOME": cfg.hf_home,
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        **cfg.vllm_env,
    }


def secrets(cfg: ServeConfig) -> dict[str, str]:
    values = {"HF_TOKEN": cfg.hf_token, "VLLM_API_KEY": cfg.vllm_api_key}
    return {name: value for name, value in values.items() if value}


def _env_file_value(value: str) -> str:
    if "'" in value or "\n" in value:
        raise ValueError("secrets may not contain single quotes or newlines")
    return f"'{value}'"


@dataclass(frozen=True)
class RenderedUnit:
    role: str
    name: str
    argv: list[str]
    text: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()


def render_unit(
    cfg: ServeConfig, role: str = "speculative", *, prefix_caching: bool | None = None
) -> RenderedUnit:
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}")
    argv = serve_argv(cfg, speculative=role == "speculative", prefix_caching=prefix_caching)
    other = unit_name(cfg, "baseline" if role == "speculative" else "speculative")
    text = _env.get_template("vllm.service.j2").render(
        cfg=cfg,
        role=role,
        conflicts=other,
        env_file=env_file_path(cfg),
        environment=[
            systemd_quote(f"{n}={v}", expands_dollar=False)
            for n, v in sorted(service_environment(cfg).items())
        ],
        exec_start=exec_start(argv),
    )
    return RenderedUnit(role=role, name=unit_name(cfg, role), argv=argv, text=text)


def render_env_file(cfg: ServeConfig) -> str:
    return _env.get_template("vllm.env.j2").render(
        service=cfg.service_name,
        secrets=[(n, _env_file_value(v)) for n, v in sorted(secrets(cfg).items())],
    )
