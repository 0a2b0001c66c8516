"""The release probe (`specdeploy releases add`, checks/release_probe.py) on wheels made here:
what it reads, a release without Model Runner V1 (0.34-shaped code), and that it refuses code it
does not recognise instead of guessing."""

import json
import zipfile

import pytest

from specdeploy.checks import release_probe as extract

SPECULATIVE = """
from typing import Literal
MTPModelTypes = Literal["mtp", "deepseek_mtp"]
SpeculativeMethod = Literal["ngram", "draft_model", MTPModelTypes]
class SpeculativeConfig:
    model: str | None = None
    num_speculative_tokens: int = None
    method: SpeculativeMethod | None = None
    target_model_config: object = None
    def _verify_args(self):
        raise ValueError(
            "'tensor_parallel_size' is not a valid argument in the "
            "speculative_config. Please pass 'draft_tensor_parallel_size' instead."
        )
"""
VLLM_CONFIG = """
class VllmConfig:
    def _get_v2_model_runner_unsupported_features(self):
        unsupported = []
        if self.speculative_config.method in ("suffix",):
            unsupported.append("x")
        if getattr(self.speculative_config, "use_heterogeneous_vocab", False):
            unsupported.append("heterogeneous-vocabulary draft models")
        return unsupported
    def post(self):
        v1_async_sched_incompat = None
        if self.speculative_config.method not in ("draft_model",):
            v1_async_sched_incompat = "x"
        if self.scheduler_config.async_scheduling:
            pass
        elif self.scheduler_config.async_scheduling is None:
            if v1_async_sched_incompat is not None:
                self.scheduler_config.async_scheduling = False
            else:
                self.scheduler_config.async_scheduling = True
"""
FILES = {
    "vllm/config/speculative.py": SPECULATIVE,
    "vllm/config/vllm.py": VLLM_CONFIG,
    "vllm/engine/arg_utils.py": "class EngineArgs:\n    model: str = 'm'\n    dtype: str = 'a'\n",
    "vllm/v1/spec_decode/draft_model.py": "def _raise_if_draft_tp_mismatch(self):\n    pass\n",
    "vllm/v1/worker/gpu/spec_decode/__init__.py": "if spec.uses_draft_model():\n    pass\n",
    "vllm/envs.py": '"VLLM_MAIN_CUDA_VERSION": lambda: (\n    os.getenv("X", "") or "13.0"\n),\n',
}
METADATA = (
    "Metadata-Version: 2.1\nName: vllm\nVersion: 9.9.0\nRequires-Python: <3.15,>=3.11\n"
    'Requires-Dist: torch==2.14.0; platform_machine == "x86_64"\n'
    'Requires-Dist: torch==2.14.0+cpu; platform_machine == "ppc64le"\n'
)


def wheel(tmp_path, files=FILES, so=b"\0libcudart.so.13\0"):
    path = tmp_path / "vllm-9.9.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
        z.writestr("vllm/_C.abi3.so", so)
        z.writestr("vllm-9.9.0.dist-info/METADATA", METADATA)
    return path


def test_table_read_from_the_wheel(tmp_path):
    out = tmp_path / "releases"
    out.mkdir()
    extract.write([wheel(tmp_path)], out)
    table = json.loads((out / "9.9.0.json").read_text())
    assert table["speculative"]["keys"] == ["method", "model", "num_speculative_tokens"]
    assert table["speculative"]["methods"] == ["deepseek_mtp", "draft_model", "mtp", "ngram"]
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
    }
    build = table["builds"]["vllm"]
    assert (build["torch"], build["cuda"], build["requires_python"]) == (
        "2.14.0",
        "13.0",
        "<3.15,>=3.11",
    )


def test_unrecognised_code_stops_the_script(tmp_path):
    files = dict(FILES, **{"vllm/v1/spec_decode/draft_model.py": "pass\n"})
    with pytest.raises(extract.ProbeError, match="_raise_if_draft_tp_mismatch"):
        extract.write([wheel(tmp_path, files)], tmp_path)
    with pytest.raises(extract.ProbeError, match="links \\[12\\]"):
        extract.write([wheel(tmp_path, so=b"libcudart.so.12")], tmp_path)
