"""Small wheels for the release probe (releases/probe.py): only the files its probes read,
shaped as vLLM 0.33 (both model runners, a graph-less V2 draft loop) and 0.34 (no Model Runner V1,
a speculator registry, CUDA graphs captured) write them. CI downloads no real wheel (each is
hundreds of MB); the probes' reading of real ones is what the committed tables record."""

import zipfile

SPECULATIVE = """
from typing import Literal
MTPModelTypes = Literal["mtp", "deepseek_mtp"]
SpeculativeMethod = Literal["ngram", "draft_model", "dflash", MTPModelTypes]
@config
class SpeculativeConfig:
    model: str | None = None
    num_speculative_tokens: int = None
    method: SpeculativeMethod | None = None
    parallel_drafting: bool = False
    num_speculative_tokens_per_batch_size: list | None = None
    target_model_config: object = None
    def _verify_args(self):
        raise ValueError(
            "'tensor_parallel_size' is not a valid argument in the "
            "speculative_config. Please pass 'draft_tensor_parallel_size' instead."
        )
"""
HETEROGENEOUS = "    use_heterogeneous_vocab: bool = False\n"
# 0.26-0.33: the method re-detected from the draft's name unless it is one of the kept ones
DETECT_FROM_NAME = """
    def _post_init(self):
        if self.model is not None:
            if self.method in ("eagle", "eagle3"):
                pass
            elif "eagle-" in self.draft_model_config.model.lower():
                self.method = "eagle"
            elif (
                "dflash" in self.draft_model_config.model.lower()
                or "Muse" in self.draft_model_config.architectures
            ):
                self.method = "dflash"
            elif self.draft_model_config.hf_config.model_type == "medusa":
                self.method = "medusa"
"""
PARALLEL_DRAFTING_034 = """
    def _check(self):
        if self.parallel_drafting is not None:
            if self.parallel_drafting and self.method not in ("dflash", "dspark"):
                raise ValueError("parallel_drafting is only supported by the dflash and dspark")
            logger.warning_once("parallel_drafting is deprecated and has no effect")
"""
ASYNC_DEFAULT = """
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
    def _verify_adaptive(self):
        if self.parallel_config.pipeline_parallel_size > 1:
            raise ValueError("Adaptive verification is not compatible with pipeline parallelism")
    def _maybe_disable_dynamic_sd_for_data_parallel(self):
        if self.parallel_config.data_parallel_size <= 1:
            return
        self.speculative_config.num_speculative_tokens_per_batch_size = None
"""
VLLM_CONFIG_033 = (
    """
class VllmConfig:
    def _get_v2_model_runner_unsupported_features(self):
        unsupported = []
        if self.speculative_config.method in ("suffix",):
            unsupported.append("x")
        if getattr(self.speculative_config, "use_heterogeneous_vocab", False):
            unsupported.append("heterogeneous-vocabulary draft models")
        return unsupported
"""
    + ASYNC_DEFAULT
)
VLLM_CONFIG_034 = (
    """
class VllmConfig:
    def _get_model_runner_unsupported_features(self):
        unsupported = []
        return unsupported
"""
    + ASYNC_DEFAULT
)
PLATFORM_034 = """
class Platform:
    @classmethod
    def validate_environ(cls, hard_fail):
        for env, value in os.environ.items():
            if env == "VLLM_USE_V2_MODEL_RUNNER":
                if value != "1":
                    raise ValueError(
                        f"VLLM_USE_V2_MODEL_RUNNER={value} is no longer supported: "
                        "Model Runner V1 has been removed. Unset this variable."
                    )
"""
SCHEDULE = """
def validate_and_normalize_dynamic_sd_schedule(num_speculative_tokens_per_batch_size):
    if not isinstance(num_speculative_tokens_per_batch_size, list):
        raise ValueError("a list")
    parsed_schedule = []
    for entry in num_speculative_tokens_per_batch_size:
        range_start, range_end, num_speculative_tokens = entry
        if range_start > range_end:
            raise ValueError("start <= end")
        if num_speculative_tokens < 0:
            raise ValueError(">= 0")
        parsed_schedule.append(entry)
    parsed_schedule.sort(key=lambda entry: entry[0])
    previous_end = 0
    for range_start, range_end, _ in parsed_schedule:
        if range_start <= previous_end:
            raise ValueError("Batch-size ranges must be non-overlapping and sorted.")
        previous_end = range_end
    return parsed_schedule

def build_dynamic_sd_schedule_lookup(schedule, vllm_max_batch_size, vllm_num_speculative_tokens):
    return [min(vllm_num_speculative_tokens, k) for _, _, k in schedule]
"""
GRAPHLESS_SPECULATOR = """
class StandaloneARSpeculator(DraftModelSpeculator):
    def init_cudagraph_manager(self, cudagraph_mode):
        pass  # CUDA graph not yet supported for standalone AR speculator.
    def capture(self):
        pass  # CUDA graph not yet supported for standalone AR speculator.
"""
CAPTURING_SPECULATOR = """
class StandaloneARSpeculator(AutoRegressiveSpeculator):
    def init_cudagraph_manager(self, cudagraph_mode):
        self.prefill_cudagraph_manager = SpeculatorCudaGraphManager(cudagraph_mode)
        super().init_cudagraph_manager(cudagraph_mode)
"""
COMMON = {
    "vllm/config/utils.py": 'def config(cls):\n    merged_config = ConfigDict(extra="forbid")\n',
    "vllm/engine/arg_utils.py": "class EngineArgs:\n    model: str = 'm'\n    dtype: str = 'a'\n",
    "vllm/v1/spec_decode/dynamic/utils.py": SCHEDULE,
    "vllm/envs.py": '"VLLM_MAIN_CUDA_VERSION": lambda: (\n    os.getenv("X", "") or "13.0"\n),\n',
}
FILES_033 = COMMON | {
    "vllm/config/speculative.py": SPECULATIVE.replace(
        "    target_model", HETEROGENEOUS + "    target_model"
    ).replace("    def _verify_args", DETECT_FROM_NAME + "    def _verify_args"),
    "vllm/config/vllm.py": VLLM_CONFIG_033,
    "vllm/v1/worker/gpu_model_runner.py": "class GPUModelRunner:\n    pass\n",
    "vllm/v1/spec_decode/draft_model.py": "def _raise_if_draft_tp_mismatch(self):\n    pass\n",
    "vllm/v1/worker/gpu/spec_decode/__init__.py": (
        "def init_speculator(speculative_config):\n"
        "    if speculative_config.uses_draft_model():\n"
        "        from vllm.v1.worker.gpu.spec_decode.standalone_ar.speculator import (\n"
        "            StandaloneARSpeculator,\n        )\n"
    ),
    "vllm/v1/worker/gpu/spec_decode/standalone_ar/speculator.py": GRAPHLESS_SPECULATOR,
}  # fmt: skip
FILES_034 = COMMON | {
    "vllm/config/speculative.py": SPECULATIVE.replace(
        "    def _verify_args", PARALLEL_DRAFTING_034 + "    def _verify_args"
    ),
    "vllm/config/vllm.py": VLLM_CONFIG_034,
    "vllm/platforms/interface.py": PLATFORM_034,
    "vllm/v1/worker/gpu/spec_decode/__init__.py": "def init_speculator(config):\n    pass\n",
    "vllm/v1/worker/gpu/spec_decode/speculator_config.py": (
        "_BUILTIN = {\n"
        '    "draft_model": _builtin("standalone_ar.config", "StandaloneARConfig"),\n}\n'
    ),
    "vllm/v1/worker/gpu/spec_decode/standalone_ar/config.py": (
        "class StandaloneARConfig:\n    speculator_class = (\n"
        '        "vllm.v1.worker.gpu.spec_decode.standalone_ar.speculator.StandaloneARSpeculator"\n'
        "    )\n"
    ),
    "vllm/v1/worker/gpu/spec_decode/standalone_ar/speculator.py": CAPTURING_SPECULATOR,
}  # fmt: skip


def metadata(package: str, version: str) -> str:
    return (
        f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n"
        "Requires-Python: <3.15,>=3.11\n"
        'Requires-Dist: torch==2.14.0; platform_machine == "x86_64"\n'
        'Requires-Dist: torch==2.14.0+cpu; platform_machine == "ppc64le"\n'
    )


def wheel(folder, files=FILES_033, version="9.9.0", so=b"\0libcudart.so.13\0", package="vllm"):
    """A wheel of `package` `version` holding `files` and one extension module linking `so`."""
    dist = package.replace("-", "_")
    path = folder / f"{dist}-{version}-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
        z.writestr("vllm/_C.abi3.so", so)
        z.writestr(f"{dist}-{version}.dist-info/METADATA", metadata(package, version))
    return path
