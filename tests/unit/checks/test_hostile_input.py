"""Host data is not trusted text (issue 36): names that reach units and shells are refused unless
plain, and every legal value reaches the unit and env file as one word, read back unchanged."""

from __future__ import annotations

import copy
import json
import random
import subprocess

import pytest

from specdeploy.checks.host_data import Problem, check_host
from specdeploy.config.host_text import unsafe_char
from specdeploy.config.schema import config_from_data
from specdeploy.host.facts.cuda_boot import CudaBootInfo
from specdeploy.render.argv import flag_value, systemd_split, unit_exec_argv
from specdeploy.render.units import (
    env_file_quote,
    exec_start,
    haproxy_quote,
    instances,
    render_balancer,
    render_env_file,
    render_unit,
    service_environment,
)

BOOT = CudaBootInfo()
INJECTION = "qwen\nExecStartPre=+/bin/sh -c 'id > /root/pwned'"


def directives(text: str) -> list[str]:
    """A unit's lines as systemd reads them, each cut to its directive (or comment, or blank)."""
    return [line.split("=", 1)[0] if "=" in line and line[0] != "#" else line[:1] for line in
            text.splitlines()]  # fmt: skip


def test_newline_in_served_model_name_is_refused_with_field_and_fix(valid_data):
    data = valid_data | {"served_model_name": INJECTION}
    (problem,) = [p for p in check_host("h1", data) if p.field == "served_model_name"]
    assert "newline" in problem.what
    assert "letters, digits" in problem.todo and "'/'" in problem.todo
    assert str(problem).startswith("h1: served_model_name: ")


def test_a_value_past_the_schema_still_adds_no_line_to_either_unit(valid_data):
    """Rendering is the second fence: a config built without validation (model_copy) still
    cannot add a directive to the unit or the balancer's unit."""
    cfg = config_from_data(valid_data).model_copy(
        update={"served_model_name": INJECTION, "target_model": INJECTION}
    )
    benign = config_from_data(valid_data)
    member = instances.expand(benign.model_copy(update={"instances": 2})).instances
    for hostile, plain in [
        (render_unit(cfg, cuda_boot=BOOT).text, render_unit(benign, cuda_boot=BOOT).text),
        (render_balancer(cfg, member)[1].text, render_balancer(benign, member)[1].text),
    ]:
        assert not [line for line in hostile.splitlines() if line.startswith("ExecStartPre=+/bin")]
        assert directives(hostile) == directives(plain)


# --- the fuzz: every string field, hostile values -------------------------------------------------
# A seeded corpus rather than hypothesis (not among the test extras): the characters each reader
# treats specially, alone, embedded and mixed at random.

CONTROLS = [chr(c) for c in range(0x20)] + ["\x7f", "\x85", "\x9b", "\u2028", "\u2029"]
SPECIAL = [" ", "'", '"', "%", "$", "\\", ";", "#", "=", "{", "}", "`", "é", "☃", "𝔘", "\u00a0"]
PRINTABLE_HOSTILE = [
    "a b", "it's \"quoted\"", "50%", "%n %h %%", "$HOME ${USER} $$", "back\\slash", "trailing\\",
    ";", "a;b", "#not a comment", "é-ünicode ☃ 𝔘", "=", "x=y", "'", '"', '\\"', "\\n literally",
    "\\x41", "\\u2028", "", " leading space", "ExecStartPre=+/bin/sh -c 'id > /root/pwned'",
    "[Service]", "$(id)", "`id`", "a\u00a0b",
]  # fmt: skip
_rng = random.Random(36)
PRINTABLE_HOSTILE += ["".join(_rng.choices(SPECIAL + ["a", "Z", "0"], k=12)) for _ in range(40)]
WITH_CONTROL = [f"a{c}b" for c in CONTROLS] + [
    "".join(_rng.choices(SPECIAL + ["a"], k=6)) + _rng.choice(CONTROLS) for _ in range(20)
]


def _set(path: str):
    """A setter for one host data path: `a.b` into dicts, `a[i]` into a list of two."""

    def put(data: dict, value) -> None:
        *parents, last = path.replace("[1]", "").split(".")
        node = data
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = ["--flag", value] if path.endswith("[1]") else value

    return put


# Every string field of the schema and where its refusal is reported.
STRING_FIELDS = [
    "vllm_version", "pip_install_args[1]", "target_model", "target_revision", "served_model_name",
    "speculative_config.model", "speculative_config.revision", "speculative_config.quantization",
    "speculative_config.code_revision", "workload.dataset_path", "vllm_extra_args[1]",
    "vllm_env.SPECDEPLOY_FUZZ", "vllm_host", "service_name", "service_user", "install_dir",
    "state_dir", "hf_endpoint", "hf_token", "vllm_api_key", "max_unavailable",
]  # fmt: skip
# Names: refused unless plain, whatever the character (their readers take no quoting).
NAME_FIELDS = [
    "target_model", "served_model_name", "speculative_config.model", "service_name",
    "service_user", "install_dir", "state_dir", "vllm_host",
]  # fmt: skip
GENERIC_TODO = "fix the value in group_data or host data"


def _refused(valid_data: dict, field: str, value: str) -> Problem:
    data = copy.deepcopy(valid_data)
    _set(field)(data, value)
    found = [p for p in check_host("h1", data) if p.field == field]
    assert found, (field, value, check_host("h1", data))
    problem = found[0]
    assert problem.todo and problem.todo != GENERIC_TODO, problem
    # the refusal itself is one line: no value can write into the operator's terminal or a log
    assert unsafe_char(str(problem)) is None, problem
    return problem


@pytest.mark.parametrize("field", STRING_FIELDS)
def test_every_string_field_refuses_control_characters(valid_data, field):
    for value in WITH_CONTROL:
        _refused(valid_data, field, value)


def test_environment_names_and_nested_speculative_values_refuse_them_too(valid_data):
    for value in WITH_CONTROL:
        problem = _refused(valid_data, "vllm_env", {"OK": "1", f"A{value}": "1"})
        assert "environment variable names" in problem.what
        nested = {"k": ["fine", value]}
        data = copy.deepcopy(valid_data)
        data["speculative_config"]["draft_load_config"] = nested
        (problem,) = [p for p in check_host("h1", data) if "draft_load_config" in p.field]
        assert problem.field == "speculative_config.draft_load_config.k[1]", problem


@pytest.mark.parametrize("field", NAME_FIELDS)
def test_names_refuse_what_only_quoting_could_carry(valid_data, field):
    for value in [v for v in PRINTABLE_HOSTILE if v.strip(".-") and not v.isalnum()]:
        _refused(valid_data, field, value)
    for value in ["-x", "--enable-lora", ".hidden", "a/b/c", "a b"]:
        _refused(valid_data, field, value)


def test_names_keep_what_hosts_have(valid_data):
    names = {
        "target_model": ["Qwen/Qwen3-8B", "/tmp/models/target", "tiny", "org/m_v1.5-it"],
        "served_model_name": ["qwen3-8b", "pycode", "org/model.v2"],
        "target_revision": ["main", "0" * 40, "v1.0", "refs/pr/1", "release/2024-01"],
        "speculative_config.model": ["Qwen/Qwen3-0.6B", "/tmp/models/draft"],
    }
    for field, values in names.items():
        for value in values:
            data = copy.deepcopy(valid_data)
            _set(field)(data, value)
            assert check_host("h1", data) == [], (field, value)
    for revision in ["a b", "a..b", "-x", "x.lock", "a:b", "a~1", "a^", "a\\b", "/x", "x/"]:
        _refused(valid_data, "target_revision", revision)


# --- legal hostile values: rendered, and read back unchanged -------------------------------------


def environment_lines(text: str) -> dict[str, str]:
    """Environment= lines as systemd reads them: the words ExecStart takes (quotes, C escapes,
    `%%`), but `$` is no reference there, so it is doubled before systemd_split halves it."""
    out = {}
    for line in text.splitlines():
        if line.startswith("Environment="):
            for word in systemd_split(line[len("Environment=") :].replace("$", "$$")):
                name, _, value = word.partition("=")
                out[name] = value
    return out


def read_env_file(text: str) -> dict[str, str]:
    """systemd's EnvironmentFile= rules (env-file.c): `#`/`;` comments, NAME=VALUE; single quotes
    literal; double quotes with `\\` before `"\\`$` dropped (kept before anything else); unquoted,
    `\\` escapes the next character and trailing whitespace is cut."""
    out = {}
    for line in text.split("\n"):
        if not line.strip() or line.lstrip()[0] in "#;":
            continue
        name, _, rest = line.partition("=")
        value, i = [], 0
        if rest[:1] == "'":
            value, i = list(rest[1 : rest.index("'", 1)]), len(rest)
        elif rest[:1] == '"':
            i = 1
            while rest[i] != '"':
                if rest[i] == "\\":
                    value += [rest[i + 1]] if rest[i + 1] in '"\\`$' else ["\\", rest[i + 1]]
                    i += 2
                else:
                    value.append(rest[i])
                    i += 1
        else:
            while i < len(rest):
                value.append(rest[i + 1] if rest[i] == "\\" else rest[i])
                i += 2 if rest[i] == "\\" else 1
        out[name.strip()] = "".join(value) if rest[:1] in "'\"" else "".join(value).rstrip()
    return out


def read_haproxy_words(line: str) -> list[str]:
    """HAProxy's parse_line for what haproxy_quote writes: whitespace splits, single quotes are
    literal, `\\` escapes outside them, `#` outside quotes starts a comment."""
    words, word, quote, i, started = [], [], None, 0, False
    while i < len(line):
        char = line[i]
        if quote:
            if char == quote:
                quote = None
            else:
                word.append(char)
        elif char in "'\"":
            quote, started = char, True
        elif char == "\\":
            word.append(line[i + 1])
            i += 1
            started = True
        elif char == "#":
            break
        elif char in " \t":
            if started:
                words.append("".join(word))
            word, started = [], False
        else:
            word.append(char)
            started = True
        i += 1
    return words + (["".join(word)] if started else [])


def _rendered(cfg):
    return [render_unit(cfg, role, cuda_boot=BOOT) for role in ("speculative", "baseline")]


def test_legal_hostile_values_reach_unit_and_env_file_unchanged(valid_data):
    benign = valid_data | {"vllm_env": {"SPECDEPLOY_FUZZ": "plain"}}
    plain = {unit.role: directives(unit.text) for unit in _rendered(config_from_data(benign))}
    for value in PRINTABLE_HOSTILE:
        data = copy.deepcopy(valid_data)
        data["speculative_config"]["quantization"] = value
        data["speculative_config"]["draft_load_config"] = {value or "k": [value, {"x": value}]}
        data["vllm_extra_args"] = ["--override-generation-config", value]
        data["vllm_env"] = {"SPECDEPLOY_FUZZ": value}
        assert [p for p in check_host("h1", data) if "quantization" not in p.field] == [], value
        cfg = config_from_data(data)
        for unit in _rendered(cfg):
            text = unit.text
            assert text.split("\n")[:-1] == text.splitlines(), value  # no other line break
            assert directives(text) == plain[unit.role], value  # no line the value introduced
            assert unit_exec_argv(text) == unit.argv, value  # argv read back exactly
            assert unit.argv[-1] == value
            if unit.role == "speculative":
                spec = json.loads(flag_value(unit.argv, "--speculative-config"))
                assert spec["quantization"] == value and spec == cfg.speculative_config
            assert environment_lines(text) == service_environment(cfg), value


def test_legal_api_keys_reach_the_env_file_unchanged(valid_data):
    keys = [
        "sk-" + "".join(_rng.choices("!#$%&()*+,-./:;<=>?@[]^_`{|}~aZ9", k=24)) for _ in range(50)
    ]
    for key in keys + ["$HOME", "%n", "a#b", "`id`", "$(id)", "x;y"]:
        assert check_host("h1", valid_data | {"vllm_api_key": key}) == [], key
        cfg = config_from_data(valid_data | {"vllm_api_key": key})
        assert read_env_file(render_env_file(cfg)) == {"VLLM_API_KEY": key}
    # the env file's one writer quotes what the schema refuses too, or refuses it
    for value in PRINTABLE_HOSTILE:
        written = f"X={env_file_quote(value)}\n"
        assert read_env_file(written) == {"X": value}, (value, written)
    for value in WITH_CONTROL[:32]:
        with pytest.raises(ValueError):
            env_file_quote(value)


def test_haproxy_and_systemd_helpers_carry_any_printable_word(valid_data):
    for value in PRINTABLE_HOSTILE:
        assert read_haproxy_words(f"server {haproxy_quote(value)} x") == ["server", value, "x"]
        assert systemd_split(exec_start(["/bin/x", value, "y"])) == ["/bin/x", value, "y"]
    for value in WITH_CONTROL:
        with pytest.raises(ValueError):
            haproxy_quote(value)
        quoted = exec_start([value])  # past the schema, a control character is escaped
        assert unsafe_char(quoted) is None and systemd_split(quoted) == [value], value


# --- the real parsers, systemd's and HAProxy's own (.ci/install-system-deps.sh installs them)


def _systemd_complaints(directory, names: list[str]) -> list[str]:
    """What `systemd-analyze verify` says about the units, minus the one thing a control node
    cannot have: the venv's interpreter (it reports a missing ExecStart binary, nothing else)."""
    result = subprocess.run(["systemd-analyze", "verify", "--man=no", *names], cwd=directory,
                            capture_output=True, text=True)  # fmt: skip
    return [
        line
        for line in (result.stdout + result.stderr).splitlines()
        if line.strip() and "is not executable: No such file or directory" not in line
    ]


def test_systemd_and_haproxy_parse_every_rendered_file_with_hostile_values(valid_data, tmp_path):
    """Every free-form field at its most hostile legal value: systemd reads both units and the
    balancer's unit without a complaint (an unknown key, a bad quote or an invalid line would be
    one), and `haproxy -c` accepts the balancer's config."""
    sample = PRINTABLE_HOSTILE[:12] + PRINTABLE_HOSTILE[-8:]
    for index, value in enumerate(sample):
        data = copy.deepcopy(valid_data) | {"instances": 2}
        data["speculative_config"]["quantization"] = value
        data["vllm_extra_args"] = ["--override-generation-config", value]
        data["vllm_env"] = {"SPECDEPLOY_FUZZ": value}
        cfg = config_from_data(data)
        layout = instances.expand(cfg)
        here = tmp_path / str(index)
        here.mkdir()
        files = [render_unit(member.cfg, role, cuda_boot=BOOT) for member in layout.instances
                 for role in ("speculative", "baseline")]  # fmt: skip
        config, balancer_unit = render_balancer(cfg, layout.instances)
        for unit in [*files, balancer_unit]:
            (here / unit.name).write_text(unit.text)
        assert _systemd_complaints(here, [u.name for u in [*files, balancer_unit]]) == [], value
        (here / "haproxy.cfg").write_text(config.text)
        checked = subprocess.run(["haproxy", "-c", "-f", str(here / "haproxy.cfg")],
                                 capture_output=True, text=True)  # fmt: skip
        assert checked.returncode == 0, (value, checked.stdout + checked.stderr)


def test_the_real_parsers_do_complain_about_a_broken_file(tmp_path):
    """The check above can fail: a unit with an unknown key and a config with a bad line."""
    (tmp_path / "bad.service").write_text('[Service]\nExecStart=/bin/x\nFooBar=1\nEnvironment="A\n')
    assert len(_systemd_complaints(tmp_path, ["bad.service"])) >= 2
    (tmp_path / "bad.cfg").write_text("frontend x\n    bind :8000\n    no-such-keyword yes\n")
    result = subprocess.run(["haproxy", "-c", "-f", str(tmp_path / "bad.cfg")], capture_output=True)
    assert result.returncode != 0
