"""Host data of the live verdict (checks/live.py): refused with host, field and fix before any host
is touched."""

from __future__ import annotations

import pytest

from specdeploy.checks.host_data import check_host
from specdeploy.checks.live import check_classes
from specdeploy.config.schema import config_from_data


def problems(data):
    return {p.field: p for p in check_host("box-1", data)}


def test_a_control_instance_on_a_box_of_two_is_accepted(valid_data):
    data = {
        **valid_data,
        "instances": 2,
        "speculation_control": {"instances": 1},
        "speculation_autopilot": "fallback",
    }
    assert problems(data) == {}


@pytest.mark.parametrize(
    ("extra", "field", "words"),
    [
        (
            {"instances": 2, "speculation_control": {"instances": 2}},
            "speculation_control",
            "leaves no speculative instance",
        ),
        (
            {"instances": 3, "speculation_control": {"share": 0.9}},
            "speculation_control",
            "leaves no speculative instance",
        ),
        (
            {"speculation_control": {"instances": 1}},
            "speculation_control.instances",
            "a plain host has no instances",
        ),
        (
            {"instances": 1, "speculation_control": {"share": 0.5}},
            "speculation_control",
            "a box of 1 instance",
        ),
        (
            {"instances": 2, "speculation_control": {}},
            "speculation_control",
            "exactly one of instances and share",
        ),
        ({"speculation_autopilot": "fallback"}, "speculation_autopilot", "needs a control arm"),
        ({"live_windows": 5}, "live_windows", "can never reach decision_alpha"),
        (
            {
                "instances": 2,
                "speculation_control": {"instances": 1},
                "speculation_autopilot": "both",
            },
            "speculation_autopilot",
            "no speculative instance",
        ),
    ],
)
def test_refusals_name_the_field_and_the_fix(valid_data, extra, field, words):
    found = problems({**valid_data, **extra})
    assert field in found, found
    assert words in found[field].what and found[field].todo
    assert found[field].host == "box-1"


def test_a_share_across_a_class_of_plain_hosts_is_accepted(valid_data):
    assert problems({**valid_data, "speculation_control": {"share": 0.25}}) == {}


def test_unknown_autopilot_mode_is_refused_by_the_schema(valid_data):
    found = problems({**valid_data, "speculation_autopilot": "sometimes"})
    assert "speculation_autopilot" in found


# --- a control class of plain hosts (checks/live.check_classes) ----------------------------------


def class_of(valid_data, names, **extra):
    """{host: config} of plain hosts serving valid_data's target and draft with a control share."""
    data = {**valid_data, "speculation_control": {"share": 0.25}, **extra}
    return {name: config_from_data(data) for name in names}


def test_a_class_of_plain_hosts_is_accepted_and_a_box_or_another_draft_is_not_in_it(valid_data):
    configs = class_of(valid_data, ["h1", "h2", "h3", "h4"])
    box = {**valid_data, "instances": 2, "speculation_control": {"instances": 1}}
    configs["box"] = config_from_data(box)
    configs["plain"] = config_from_data(valid_data)  # no control arm: in no class
    assert check_classes(configs) == []
    other = {**valid_data["speculative_config"], "num_speculative_tokens": 3}
    configs |= class_of(valid_data, ["k3"], speculative_config=other)  # its own class, of one
    (problem,) = check_classes(configs)
    assert (problem.host, problem.field) == ("k3", "speculation_control")
    assert "has this one plain host: no host is left for the other arm" in problem.what


@pytest.mark.parametrize(
    ("names", "extra", "field", "words"),
    [
        (["h1"], {}, "speculation_control", "no host is left for the other arm"),
        (["h1", "h2"], {"speculation_control": {"share": 0.9}}, "speculation_control.share",
         "2 of its 2 hosts on the baseline leaves no speculative host"),
        (["h1", "h2"], {"speculation_autopilot": "both"}, "speculation_autopilot",
         "a fall-back leaves no speculative host"),
    ],
)  # fmt: skip
def test_class_refusals_name_every_host_the_field_and_the_fix(
    valid_data, names, extra, field, words
):
    problems = check_classes(class_of(valid_data, names, **extra))
    assert sorted(p.host for p in problems) == names
    assert {p.field for p in problems} == {field}
    assert all(words in p.what and p.todo for p in problems), problems


def test_a_class_whose_hosts_differ_in_what_its_judge_reads_is_refused(valid_data):
    configs = class_of(valid_data, ["h1", "h2", "h3"])
    configs |= class_of(valid_data, ["h4"], live_windows=8)
    problems = check_classes(configs)
    assert sorted(p.host for p in problems) == ["h1", "h2", "h3", "h4"]
    assert {p.field for p in problems} == {"live_windows"}
    assert "12 on h1, h2, h3; 8 on h4" in problems[0].what
    configs["h4"] = class_of(valid_data, ["h4"], speculation_control={"share": 0.5})["h4"]
    assert {p.field for p in check_classes(configs)} == {"speculation_control"}


def test_check_refuses_a_class_across_the_inventory(tmp_path):
    """`specdeploy check` on an inventory: each host alone is valid, their class is not."""
    from tests.unit.cli.test_cli_check import run

    (tmp_path / "inv.py").write_text(
        "data = dict(vllm_version='0.32.0', target_model='t/t', speculative_config={"
        "'method': 'draft_model', 'model': 'd/d', 'num_speculative_tokens': 2},"
        " speculation_control={'share': 0.25})\n"
        "hosts = [('h1', data), ('h2', {**data, 'live_windows': 8})]\n"
    )
    result = run("check", "inv.py", cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "error (2 hosts: h1, h2): live_windows: class class-t-" in result.stdout
    assert "nothing was touched" in result.stderr
