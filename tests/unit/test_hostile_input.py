"""Host data is not trusted text: names that reach units and shells are refused unless plain, and
every legal value reaches the unit and env file as exactly one word, read back unchanged (issue 36)."""

from __future__ import annotations

from specdeploy import instances
from specdeploy.checks import check_host
from specdeploy.config import config_from_data
from specdeploy.facts import CudaBootInfo
from specdeploy.render import render_balancer, render_unit

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
