"""Mean decode step of one model served alone by vLLM (batch 1, greedy), in ms, printed as JSON.

    $SPECDEPLOY_CACHE/venv-vllm/bin/python benchmarks/decode_step.py MODEL_DIR [PROMPTS_JSONL]

Runs under a python with vLLM (the control venv: the same CPU the sandbox hosts share), with the
sandbox's CPU flags. Step = (latency of a 129-token request - latency of a 1-token request) / 128,
median over the first prompts of the request set, so prefill and request overhead cancel out.
(`vllm bench latency` cannot be used: its dummy prompts draw token ids from 0-9999.)
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

STEPS = 128


def main() -> None:
    from vllm import LLM, SamplingParams

    model = sys.argv[1]
    prompts_file = sys.argv[2] if len(sys.argv) > 2 else None
    prompts = (
        [json.loads(line)["prompt"] for line in open(prompts_file)][:4]
        if prompts_file
        else ["def main():"]
    )
    llm = LLM(
        model=model,
        dtype="float32",
        enforce_eager=True,
        max_model_len=1024,
        kv_cache_memory_bytes=256 * 1024 * 1024,
        enable_prefix_caching=False,
    )

    def latency(prompt: str, tokens: int) -> float:
        params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
        started = time.perf_counter()
        llm.generate([prompt], params, use_tqdm=False)
        return time.perf_counter() - started

    latency(prompts[0], STEPS + 1)  # warm-up
    steps = [
        (latency(p, STEPS + 1) - latency(p, 1)) / STEPS * 1000 for p in prompts for _ in range(2)
    ]
    print(json.dumps({"model": model, "step_ms": statistics.median(steps), "samples": steps}))


if __name__ == "__main__":
    main()
