"""What host data may say, where it reaches a unit, the env file, HAProxy's config or a shell.

The schema (config.py) types its string fields with these. Names that systemd, vLLM's argparse,
the Hub and HAProxy read as names (models, the served name, revisions, units, users) get a strict
pattern. Every other string may say anything printable, because render.py and the steps quote it
for where it lands; but none may hold a control character: a newline or carriage return ends a
unit's (or HAProxy's) line, and no quoting is safe in every reader (issue 36). A refusal carries
its fix in the error's context, which checks.py prints as `host: field: what — what to do`.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator
from pydantic_core import PydanticCustomError

ABSOLUTE_PATH = r"^/[A-Za-z0-9._/+-]*[A-Za-z0-9._+-]$"
POSIX_USER = r"^[a-z_][a-z0-9_-]{0,31}$"
# systemd's unit name characters without '@', '\\' and ':'; the longest name made from it
# ("<stem>-NN-baseline.service") stays within systemd's 255
UNIT_STEM = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,200}$"
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
# Secrets reach curl's config and the env file inside double/single quotes: printable ASCII only.
SECRET = r"^[!#-&(-\[\]-~]+$"
# A Hub repo id ("owner/name") or a plain name; never a leading '-' or '.', which argparse would
# read as a flag and a path as a parent directory.
_PART = r"[A-Za-z0-9_][A-Za-z0-9._-]*"
REPO_ID = rf"^{_PART}(/{_PART})?$"
# git's check-ref-format, as the Hub takes revisions: a commit sha, a branch or a tag
_REVISION = re.compile(
    r"^(?![/.-])(?!.*(\.\.|@\{|//|/\.|\.lock$|[/.]$))[^\x00-\x20\x7f~^:?*\[\\]+$"
)
_URL = re.compile(r"^https?://[^\s\x00-\x1f\x7f]+$")

NAME_TODO = "use letters, digits, '.', '_', '-' and one '/'"
MODEL_TODO = (
    "use a Hub repo id (letters, digits, '.', '_', '-' and one '/') or an absolute path of "
    "letters, digits and ._+-/"
)
REVISION_TODO = "use a commit sha, a branch or a tag (no spaces, control characters or ~^:?*[\\)"
TEXT_TODO = "write it on one line without control characters (quotes, spaces, % and $ are fine)"
_NAMED = {"\n": "a newline", "\r": "a carriage return", "\t": "a tab"}


def unsafe_char(text: str) -> str | None:
    """The first character no unit, env file or HAProxy line can carry unquoted and no reader
    splits alike, in words: C0/C1 controls, DEL, and the separators str.splitlines() breaks at."""
    for char in text:
        code = ord(char)
        if code < 0x20 or 0x7F <= code <= 0x9F or char in "\u2028\u2029":
            return _NAMED.get(char, f"a control character (U+{code:04X})")
    return None


def refusal(what: str, todo: str, path: str = "") -> PydanticCustomError:
    """A refusal checks.py reports as `field<path>: what — todo` (path: within the field)."""
    return PydanticCustomError("host_text", "{what}", {"what": what, "todo": todo, "path": path})


def _one_line(value: str, todo: str = TEXT_TODO, path: str = "") -> str:
    bad = unsafe_char(value)
    if bad:
        raise refusal(f"contains {bad}", todo, path)
    return value


def _pattern(pattern: str | re.Pattern, what: str, todo: str):
    def check(value: str, path: str = "") -> str:
        _one_line(value, todo, path)
        if not re.match(pattern, value):
            raise refusal(what, todo, path)
        return value

    return check


served_name = _pattern(REPO_ID, "is not a plain name", NAME_TODO)
revision = _pattern(_REVISION, "is not a commit sha, branch or tag", REVISION_TODO)
endpoint = _pattern(_URL, "is not an http(s) URL", "use the mirror's URL, e.g. https://hf.example")


def model_ref(value: str, path: str = "") -> str:
    _one_line(value, MODEL_TODO, path)
    if not (re.match(REPO_ID, value) or re.match(ABSOLUTE_PATH, value)):
        raise refusal("is not a Hub repo id or an absolute path", MODEL_TODO, path)
    return value


def environment(value: dict[str, str]) -> dict[str, str]:
    """vllm_env: names as the environment takes them, values on one line (Environment= quotes
    the rest)."""
    bad = [name for name in value if not re.match(ENV_NAME, name)]
    if bad:
        raise refusal(
            f"not environment variable names: {bad}",
            "use environment variable names of letters, digits and '_', values on one line",
        )
    for name, text in value.items():
        _one_line(text, path=f".{name}")
    return value


def speculative(value: dict[str, Any]) -> dict[str, Any]:
    """The --speculative-config JSON: its draft named like target_model, its revision like
    target_revision, and no control character in any key or string within."""
    if isinstance(value.get("model"), str):
        model_ref(value["model"], ".model")
    for key in ("revision", "code_revision"):
        if isinstance(value.get(key), str):
            revision(value[key], f".{key}")

    def walk(item: Any, path: str) -> None:
        if isinstance(item, str):
            _one_line(item, path=path)
        elif isinstance(item, dict):
            for key, inner in item.items():
                walk(str(key), f"{path}.{key!r}" if unsafe_char(str(key)) else f"{path}.{key}")
                walk(inner, f"{path}.{key}")
        elif isinstance(item, (list, tuple)):
            for index, inner in enumerate(item):
                walk(inner, f"{path}[{index}]")

    walk(value, "")
    return value


# one-argument wrappers: pydantic reads a second parameter as its validation info
Text = Annotated[str, AfterValidator(lambda v: _one_line(v))]
ModelRef = Annotated[str, AfterValidator(lambda v: model_ref(v))]
ServedName = Annotated[str, AfterValidator(lambda v: served_name(v))]
Revision = Annotated[str, AfterValidator(lambda v: revision(v))]
Endpoint = Annotated[str, AfterValidator(lambda v: endpoint(v))]
Environment = Annotated[dict[str, str], AfterValidator(environment)]
SpeculativeConfig = Annotated[dict[str, Any], AfterValidator(speculative)]
