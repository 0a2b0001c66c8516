import copy

import pytest

VALID = {
    "vllm_version": "0.32.0",
    "target_model": "Qwen/Qwen3-8B",
    "target_revision": "main",
    "speculative_config": {
        "method": "draft_model",
        "model": "Qwen/Qwen3-0.6B",
        "num_speculative_tokens": 5,
    },
    "gpu_memory_utilization": 0.92,
    "workload": {
        "prompt_len": 256,
        "output_len": 256,
        "request_rate": 2.0,
        "max_concurrency": 4,
        "num_prompts": 16,
    },
}


@pytest.fixture
def valid_data():
    return copy.deepcopy(VALID)
