# Host data shared by every host (pyinfra group_data: each top-level name is one key).
# Groups and hosts override single keys; every key: docs/reference/host-data.md (generated).
#
# THE EXAMPLE, not a recommendation: Qwen/Qwen3-8B served with Qwen/Qwen3-0.6B as its draft,
# proposing 2 tokens per step (vLLM's docs show 5; on 0.31-0.33 the draft runs without CUDA graphs
# above 2, which `specdeploy check` warns of). Both share Qwen3's vocabulary. The right number of
# speculative tokens depends on your traffic: run `pyinfra INVENTORY deploys/tune.py` and use what
# it measures.

vllm_package = "vllm"
vllm_version = "0.32.0"  # an exact pin; `specdeploy check` refuses ranges

target_model = "Qwen/Qwen3-8B"
target_revision = (
    "main"  # prefer a commit sha; the deployment record stores what "main" resolved to
)
served_model_name = "qwen3-8b"

speculative_config = {
    "method": "draft_model",
    "model": "Qwen/Qwen3-0.6B",
    "revision": "main",
    "num_speculative_tokens": 2,  # an example; measure yours with deploys/tune.py
}

# The traffic this fleet is sized and benchmarked for.
workload = {
    "prompt_len": 1024,
    "output_len": 256,
    "request_rate": 4.0,
    "max_concurrency": 16,
    "num_prompts": 200,
    "dataset": "random",
}

max_model_len = 4096  # prompt + output, with headroom over the workload's 1280

vllm_host = "127.0.0.1"  # loopback by default; put a proxy in front or set "0.0.0.0" on purpose
vllm_port = 8000
