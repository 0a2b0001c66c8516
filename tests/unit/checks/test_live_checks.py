"""Host data of the live verdict (checks/live.py): refused with host, field and fix before any host
is touched."""

from __future__ import annotations

import pytest

from specdeploy.checks.host_data import check_host


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
