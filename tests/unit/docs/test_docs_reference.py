"""The generated reference (issue 40): docs/reference/ is what `python -m specdeploy.docs.reference`
writes from the schema, the CLIs' parsers and the release tables; every host-data key, nested ones
too, has its description and a section a check message can link."""

import re

import pytest

from specdeploy.config import schema
from specdeploy.config.problems import REFERENCE_PAGE, Problem, nested_model, reference_anchor
from specdeploy.docs import reference
from tests.unit import REPO


@pytest.mark.parametrize("path", sorted(reference.PAGES))
def test_the_committed_page_is_the_generators_output(path):
    assert (REPO / path).read_text() == reference.PAGES[path](), (
        f"{path} is stale: python -m specdeploy.docs.reference"
    )


def test_check_mode_finds_a_stale_page(tmp_path, monkeypatch):
    monkeypatch.setattr(reference, "REPO", tmp_path)
    assert reference.main(["--check"]) == 1  # nothing written yet: every page differs
    assert reference.main([]) == 0
    assert reference.main(["--check"]) == 0
    (tmp_path / REFERENCE_PAGE).write_text("# edited by hand\n")
    assert reference.main(["--check"]) == 1


def every_key():
    for name in schema.FIELDS:
        field = schema.ServeConfig.model_fields[name]
        yield name, field
        model = nested_model(field)
        for sub, sub_field in model.model_fields.items() if model else ():
            yield f"{name}.{sub}", sub_field


def test_every_key_has_its_description_type_and_default_on_the_page():
    page = reference.host_data_page()
    keys = list(every_key())
    assert {"workload.temperature", "workload.top_p", "speculation_gate.on_fail"} <= dict(
        keys
    ).keys()
    for key, field in keys:
        assert field.description, f"{key}: Field(description=...) missing in the schema"
        section = page.split(f'<a id="{key}"></a>', 1)[1].split("\n#", 1)[0]
        assert f"default `{reference.field_default(field)}`" in section, key
        assert " ".join(field.description.split()) in " ".join(section.split()), key


def test_defaults_on_the_page_are_the_schemas_own():
    page = reference.host_data_page()
    assert "| [vllm_version](#vllm_version) | `str` | `required` |" in page
    assert "| [health_timeout_s](#health_timeout_s) | `int > 0` | `900` |" in page
    assert "type `float >= 0.0, <= 2.0` · default `0.0`" in page  # workload.temperature


def test_a_key_left_out_of_the_pages_groups_is_refused(monkeypatch):
    groups = dict(reference.GROUPS)
    groups["Secrets"] = ("hf_token",)  # vllm_api_key left out
    monkeypatch.setattr(reference, "GROUPS", groups)
    with pytest.raises(ValueError, match="vllm_api_key"):
        reference.host_data_page()


@pytest.mark.parametrize(
    ("field", "anchor"),
    [
        ("workload.temperature", "workload.temperature"),
        ("speculative_config.method", "speculative_config"),
        ("vllm_extra_args[0]", "vllm_extra_args"),
        ("gpu_memory_utilization/kv_cache_memory_bytes", "gpu_memory_utilization"),
        ("speculation_gate.runs", "speculation_gate.runs"),
        ("vllm_env.CUDA_VISIBLE_DEVICES", "vllm_env"),
        ("gpu_memory_utilisation", None),  # a typo names no key: the page, no section
        ("instance_name", None),  # internal, never host data
    ],
)
def test_a_problem_links_the_section_of_the_key_it_names(field, anchor):
    link = Problem("h", field, "what", "todo").reference
    assert link == (f"{REFERENCE_PAGE}#{anchor}" if anchor else REFERENCE_PAGE)
    assert reference_anchor(field) == anchor
    if anchor:  # the section exists on the committed page
        assert f'<a id="{anchor}"></a>' in (REPO / REFERENCE_PAGE).read_text()


def test_the_cli_page_has_every_subcommand_and_flag_of_both_parsers():
    from specdeploy import cli

    page = reference.cli_page()
    for name, _, sub in reference._subcommands(cli.build_parser()):
        assert f"### specdeploy {name}\n" in page
        for action in sub._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert f"`{flag}`" in page, flag
    assert "### specdeploy-sandbox demo\n" in page and "`--instances`" in page
    assert re.search(r"specdeploy check INVENTORY \[--group-data GROUP_DATA\] \[--strict\]", page)


def test_every_page_the_product_points_a_user_at_exists():
    """A message, a generated file or a template that says "read docs/..." names a page that is
    there (the pages move; the pointers must move with them)."""
    sources = [*(REPO / "specdeploy").rglob("*.py"), *(REPO / "templates").rglob("*")]
    named = {
        (path.relative_to(REPO), page)
        for path in sources
        if path.is_file()
        for page in re.findall(r"docs/[\w./-]+\.md", path.read_text(errors="replace"))
    }
    assert any(page == REFERENCE_PAGE for _, page in named)
    missing = [f"{source}: {page}" for source, page in sorted(named) if not (REPO / page).is_file()]
    assert not missing, missing
