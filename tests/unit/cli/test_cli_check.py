"""`specdeploy check` and `render` on real pyinfra inventory files (no host is contacted)."""

import argparse
import importlib.metadata
import json
import os
import stat
import subprocess
import sys

import pytest

from specdeploy.cli import build_parser
from tests.unit import REPO


def run(*args, cwd=REPO):
    # this checkout's package first, also where cwd is elsewhere (an editable install may point
    # at another checkout)
    path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}
    return subprocess.run(
        [sys.executable, "-m", "specdeploy.cli", *args],
        cwd=cwd, capture_output=True, text=True, env=env,
    )  # fmt: skip


def test_version_is_the_installed_distributions():
    result = run("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"specdeploy {importlib.metadata.version('specdeploy')}"


def subcommands(parser, prog="specdeploy"):
    """(full name, help line, parser) of every subcommand, nested ones too."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield f"{prog} {name}", helps.get(name), sub
                yield from subcommands(sub, f"{prog} {name}")


def test_every_subcommand_says_what_it_does_in_its_own_help_and_in_its_parents(monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # argparse wraps at the terminal's width: no wrapping
    found = list(subcommands(build_parser()))
    assert {"specdeploy migrate", "specdeploy releases add"} <= {name for name, _, _ in found}
    top = " ".join(build_parser().format_help().split())
    for name, help_line, sub in found:
        assert help_line, f"{name}: no help= (the line `specdeploy --help` lists)"
        assert sub.description, f"{name}: no description= (what `{name} --help` says first)"
        own = " ".join(sub.format_help().split())
        assert " ".join(sub.description.split()) in own, name
        parent = " ".join(name.split()[:-1])
        listing = (
            top
            if parent == "specdeploy"
            else " ".join(next(p for n, _, p in found if n == parent).format_help().split())
        )
        assert " ".join(help_line.split()) in listing, name


@pytest.mark.parametrize("command", ["migrate", "rollout", "releases add"])
def test_subcommand_help_shows_its_description(command):
    result = run(*command.split(), "--help")
    assert result.returncode == 0
    usage, _, rest = result.stdout.partition("\n\n")
    assert usage.startswith(f"usage: specdeploy {command}")
    assert not rest.startswith(("positional arguments", "options")), result.stdout


def test_example_inventory_is_valid():
    result = run("check", "inventories/prod.py")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 host(s) valid." in result.stdout


def test_invalid_inventory_lists_every_problem_and_exits_1(tmp_path):
    (tmp_path / "group_data").mkdir()
    (tmp_path / "group_data" / "all.py").write_text(
        'vllm_version = "0.32.0"\ntarget_model = "t/t"\n'
        'speculative_config = {"method": "draft_model", "model": "d/d", '
        '"num_speculative_tokens": 2}\n'  # k <= 2: no graph-less draft warning on 0.32.0
    )
    (tmp_path / "inv.py").write_text(
        'good = ["h-good"]\n'
        'bad = [("h-bad", {"gpu_memory_utilization": 0.9, "kv_cache_memory_bytes": 10,'
        ' "vllm_extra_args": ["--num-speculative-tokens", "4"]})]\n'
    )
    result = run("check", "inv.py", cwd=tmp_path)
    assert result.returncode == 1
    lines = result.stdout.strip().splitlines()
    assert lines == [
        "h-bad: vllm_extra_args[0]: --num-speculative-tokens was removed from vLLM — "
        "put it in speculative_config "
        'instead: {"num_speculative_tokens": 4} '
        "(`specdeploy migrate -- vllm serve ...` converts a whole command line) "
        "(see docs/reference/host-data.md#vllm_extra_args)",
        lines[1],
    ]
    assert lines[1].startswith(
        "h-bad: gpu_memory_utilization/kv_cache_memory_bytes: both memory mechanisms are set"
    )
    assert lines[1].endswith("(see docs/reference/host-data.md#gpu_memory_utilization)")
    assert "2 problem(s) on 1 of 2 host(s)" in result.stderr


def test_typos_refused_and_strict_lists_unknown_keys(tmp_path):
    (tmp_path / "group_data").mkdir()
    (tmp_path / "group_data" / "all.py").write_text(
        'vllm_version = "0.32.0"\ntarget_model = "t/t"\n'
        'speculative_config = {"method": "draft_model", "model": "d/d", '
        '"num_speculative_tokens": 2}\nteam = "infra"\n_sudo = True\n'
    )
    (tmp_path / "inv.py").write_text(
        'hosts = [("h1", {"ssh_user": "deploy"}), '
        '("h2", {"gpu_memory_utilisation": 0.5, "max_num_seq": 4})]\n'
    )
    result = run("check", "inv.py", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        "h2: gpu_memory_utilisation: not a specdeploy key (the deploy would ignore it) — "
        "did you mean 'gpu_memory_utilization'? (see docs/reference/host-data.md)",
        "h2: max_num_seq: not a specdeploy key (the deploy would ignore it) — "
        "did you mean 'max_num_seqs'? (see docs/reference/host-data.md)",
    ]
    (tmp_path / "inv.py").write_text('hosts = [("h1", {"ssh_user": "deploy"})]\n')
    assert run("check", "inv.py", cwd=tmp_path).returncode == 0  # "team" is the user's own
    strict = run("check", "--strict", "inv.py", cwd=tmp_path)
    assert strict.returncode == 1
    assert strict.stdout.splitlines() == [
        "h1: team: not a specdeploy or pyinfra key: the deploy ignores it — remove it, or keep it "
        "if it is your own data (see docs/reference/host-data.md)"
    ]


def test_render_writes_both_units_per_host(tmp_path):
    result = run("render", "inventories/prod.py", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    host = tmp_path / "gpu-01.example.internal"
    argv = json.loads((host / "argv.json").read_text())
    assert (
        "--speculative-config" in argv["speculative"]
        and "--speculative-config" not in argv["baseline"]
    )
    assert (host / "specdeploy-vllm.service").exists() and (
        host / "specdeploy-vllm-baseline.service"
    ).exists()
    assert stat.S_IMODE(os.stat(host / "specdeploy-vllm.env").st_mode) == 0o600


# --- an inventory that cannot be read as given: refused with its file and line, exit 2 ----------

GROUP_DATA = (
    'vllm_version = "0.32.0"\ntarget_model = "t/t"\n'
    'speculative_config = {"method": "draft_model", "model": "d/d", "num_speculative_tokens": 2}\n'
)


def fleet(tmp_path, inventory='canary = ["h1"]\nrest = ["h2", "h3"]\n', group_data=GROUP_DATA):
    (tmp_path / "group_data").mkdir(exist_ok=True)
    (tmp_path / "group_data" / "all.py").write_text(group_data)
    (tmp_path / "inv.py").write_text(inventory)
    return tmp_path


@pytest.mark.parametrize(
    "where, text, line, kind",
    [
        ("group_data", GROUP_DATA + 'max_model_len = = 4096\nworkload = {"x": 1}\n', 4,
         "SyntaxError"),
        ("group_data", GROUP_DATA + "import os\nmin_free_disk_gb = gigabytes(5)\n", 5,
         "NameError"),
        ("inventory", 'hosts = ["h1"]\nmore = [("h2", {"a": 1 / 0})]\n', 2, "ZeroDivisionError"),
        ("inventory", 'hosts = ["h1",\n', 1, "SyntaxError"),
    ],
)  # fmt: skip
def test_a_file_that_does_not_run_is_named_with_its_line(tmp_path, where, text, line, kind):
    fleet(tmp_path, **({"group_data": text} if where == "group_data" else {"inventory": text}))
    path = "group_data/all.py" if where == "group_data" else "inv.py"
    for command in (["check", "inv.py"], ["render", "inv.py", "--out", "out"]):
        result = run(*command, cwd=tmp_path)
        assert result.returncode == 2, result.stdout + result.stderr
        assert "Traceback" not in result.stderr
        assert f"{path}, line {line}: {kind}" in result.stderr, result.stderr
        assert f"specdeploy {command[0]}: " in result.stderr


BAD_PATHS = {
    "inventory": (["nope.py"], "inventory file not found: nope.py"),
    "group_data": (["inv.py", "--group-data", "nowhere"], "--group-data directory not found"),
    "limit": (["inv.py", "--limit", "h9"], "--limit 'h9' matches no host or group of inv.py"),
}
TAKES = {  # subcommand: the arguments it takes, and what it needs besides
    "check": (["inventory", "group_data"], []),
    "render": (["inventory", "group_data"], ["--out", "out"]),
    "status": (["inventory", "group_data", "limit"], []),
    "unlock": (["inventory", "group_data", "limit"], []),
    "rollout": (["inventory", "limit"], []),
    "live": (["inventory", "group_data", "limit"], ["--once"]),
}


@pytest.mark.parametrize("command, bad", [(c, b) for c, (takes, _) in TAKES.items() for b in takes])
def test_every_subcommand_refuses_a_path_or_limit_that_names_nothing(tmp_path, command, bad):
    fleet(tmp_path)
    args, message = BAD_PATHS[bad]
    result = run(command, *args, *TAKES[command][1], cwd=tmp_path)
    assert result.returncode == 2, (command, bad, result.stdout + result.stderr)
    assert f"specdeploy {command}: " in result.stderr and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "out").exists()


def test_every_subcommand_with_a_limit_is_in_the_table():
    found = {name.split()[1] for name, _, sub in subcommands(build_parser())
             for action in sub._actions if "--limit" in action.option_strings}  # fmt: skip
    assert found == {c for c, (takes, _) in TAKES.items() if "limit" in takes}


def test_a_limit_is_a_host_a_group_or_a_pattern_and_a_typo_is_named():
    from specdeploy.config.inventory import InventoryError, limit_hosts

    hosts = [("gpu-01", ["canary", "inv"]), ("gpu-02", ["inv"]), ("cpu-01", ["inv", "cpu"])]
    assert limit_hosts(hosts, None, "inv.py") == ["gpu-01", "gpu-02", "cpu-01"]
    assert limit_hosts(hosts, ["cpu", "gpu-0*"], "inv.py") == ["gpu-01", "gpu-02", "cpu-01"]
    assert limit_hosts(hosts, ["canary"], "inv.py") == ["gpu-01"]
    with pytest.raises(InventoryError) as refused:
        limit_hosts(hosts, ["gpu-01", "gpu-2"], "inv.py")
    assert str(refused.value).startswith("--limit 'gpu-2' matches no host or group of inv.py")
    assert "did you mean 'gpu-02'?" in str(refused.value)


def test_what_many_hosts_share_is_said_once_with_the_hosts_counted(tmp_path):
    # a group_data setting of 7 hosts: one warning, one note per moving ref, not 7 of each
    hosts = [f"gpu-0{i}" for i in range(1, 8)]
    fleet(tmp_path, inventory=f"canary = {hosts[:1]}\nrest = {hosts[1:]}\n",
          group_data=GROUP_DATA + 'speculation_gate = {"runs": 2}\n')  # fmt: skip
    result = run("check", "inv.py", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    named = "7 hosts: gpu-01, gpu-02, gpu-03, gpu-04, gpu-05 and 2 more"
    (warning,) = [line for line in result.stdout.splitlines() if line.startswith("warning")]
    assert warning.startswith(f"warning ({named}): speculation_gate.runs: 2 + 2 runs cannot ")
    assert warning.endswith("(see docs/reference/host-data.md#speculation_gate.runs)")
    assert result.stderr.splitlines() == [
        f"note ({named}): target_revision: 'main' of t/t is a moving ref — the deploy pins it to "
        "the commit the control node resolves at rollout time (recorded per host); pin a commit "
        "sha to choose the weights yourself",
        f"note ({named}): speculative_config.revision: 'main' of d/d is a moving ref — the deploy "
        "pins it to the commit the control node resolves at rollout time (recorded per host); pin "
        "a commit sha to choose the weights yourself",
    ]
    # identical errors too, once; one host's own stays its own line
    (tmp_path / "inv.py").write_text('hosts = ["h1", "h2", ("h3", {"max_num_seq": 4})]\n')
    (tmp_path / "group_data" / "all.py").write_text(GROUP_DATA + "max_num_seqq = 4\n")
    result = run("check", "inv.py", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        "error (3 hosts: h1, h2, h3): max_num_seqq: not a specdeploy key (the deploy would ignore "
        "it) — did you mean 'max_num_seqs'? (see docs/reference/host-data.md)",
        "h3: max_num_seq: not a specdeploy key (the deploy would ignore it) — did you mean "
        "'max_num_seqs'? (see docs/reference/host-data.md)",
    ]
    assert "4 problem(s) on 3 of 3 host(s)" in result.stderr


# --- every refusal names its way out ------------------------------------------------------------

REFUSALS = {  # the command, and what its refusal must say to do
    "a rollout without a canary group": (
        ["rollout", "plain.py"],
        ["--canary-group GROUP", "--canary-group ''"],
    ),
    "--resume with nothing to resume": (
        ["rollout", "inv.py", "--resume", "--progress", "none.json"],
        ["run without --resume", "--progress FILE"],
    ),
    "a status timeout shorter than its interval": (
        ["status", "inv.py", "--timeout", "2", "--interval", "5"],
        ["raise --timeout or lower --interval"],
    ),
    "an inventory without hosts": (["check", "empty.py"], ["add hosts to it"]),
    "predict-k without a usable run": (
        ["predict-k", "missing.json"],
        ["give `vllm bench serve` result JSONs"],
    ),
    "migrate without a vllm serve command": (
        ["migrate", "--", "python", "-m", "vllm"],
        ["e.g. specdeploy migrate -- vllm serve"],
    ),
    "migrate of a command with nothing to migrate": (
        ["migrate", "--", "vllm", "serve", "m", "--dtype", "float16"],
        ["nothing to migrate", "speculative_config"],
    ),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_every_refusal_names_its_way_out(tmp_path, case):
    fleet(tmp_path)
    (tmp_path / "plain.py").write_text('gpu = ["h1", "h2"]\n')
    (tmp_path / "empty.py").write_text("# no hosts yet\n")
    command, ways_out = REFUSALS[case]
    result = run(*command, cwd=tmp_path)
    assert result.returncode in (1, 2), result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    for way_out in ways_out:
        assert way_out in result.stderr, (case, result.stderr)
