"""Streaming load generator with a timestamp per engine output (stdlib only; runs on the device).

The metric is `vllm bench serve`'s: TPOT = (last chunk - first chunk) / (output tokens - 1), ITL
per chunk, TTFT = first chunk - send; the workload is the plan's (random prompt of PROMPT_LEN token
ids, OUTPUT_LEN tokens, temperature 0, ignore_eos, every request sent as soon as a slot is free, at
most C in flight). Unlike `vllm bench serve` it keeps every chunk's wall-clock time and its running
token count (`continuous_usage_stats`), so an engine step can be lined up with GPU and host samples.

Usage: python3 client.py PORT N C OUT.json [--prompt-len 256] [--output-len 128] [--seed 0]
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import statistics
import threading
import time


def one_request(port: int, prompt: list[int], output_len: int) -> dict:
    body = json.dumps(
        {
            "model": "m",
            "prompt": prompt,
            "max_tokens": output_len,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
    )
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    t_send = time.time()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    chunks: list[tuple[float, int]] = []  # (wall time, completion tokens so far)
    while True:
        line = resp.readline()
        if not line:
            break
        if not line.startswith(b"data:"):
            continue
        t = time.time()
        data = line[5:].strip()
        if data == b"[DONE]":
            break
        msg = json.loads(data)
        usage = msg.get("usage") or {}
        if msg.get("choices"):
            chunks.append((t, int(usage.get("completion_tokens", len(chunks) + 1))))
    conn.close()
    return summarize_request(t_send, chunks)


def summarize_request(t_send: float, chunks: list[tuple[float, int]]) -> dict:
    out = {"t_send": round(t_send, 6), "n_chunks": len(chunks)}
    if len(chunks) < 2:
        return out | {"error": "fewer than 2 chunks"}
    n_tokens = chunks[-1][1]
    out |= {
        "output_tokens": n_tokens,
        "ttft_ms": round(1000 * (chunks[0][0] - t_send), 3),
        "tpot_ms": round(1000 * (chunks[-1][0] - chunks[0][0]) / max(n_tokens - 1, 1), 4),
        "t_first": round(chunks[0][0], 6),
        "t_last": round(chunks[-1][0], 6),
        # per chunk after the first: [ms since the previous chunk, tokens it carried]
        "steps": [
            [round(1000 * (b[0] - a[0]), 3), b[1] - a[1]]
            for a, b in zip(chunks, chunks[1:], strict=False)
        ],
    }
    return out


def prompts(n: int, prompt_len: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    # ids inside the small trained tokenizer's vocabulary (8192), so detokenizing is cheap and valid
    return [[rng.randrange(300, 8000) for _ in range(prompt_len)] for _ in range(n)]


def run(port: int, n: int, conc: int, prompt_len: int, output_len: int, seed: int) -> dict:
    todo = list(enumerate(prompts(n, prompt_len, seed)))
    results: list[dict | None] = [None] * n
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if not todo:
                    return
                i, p = todo.pop(0)
            try:
                results[i] = one_request(port, p, output_len)
            except Exception as error:  # recorded, counted as failed
                results[i] = {"error": repr(error)}

    t0 = time.time()
    threads = [threading.Thread(target=worker) for _ in range(conc)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ok = [r for r in results if r and "tpot_ms" in r]
    tpots = [r["tpot_ms"] for r in ok]
    itls = [s[0] for r in ok for s in r["steps"]]
    return {
        "completed": len(ok),
        "failed": n - len(ok),
        "duration": round(time.time() - t0, 3),
        "max_concurrency": conc,
        "median_tpot_ms": statistics.median(tpots) if tpots else None,
        "mean_tpot_ms": statistics.fmean(tpots) if tpots else None,
        "median_itl_ms": statistics.median(itls) if itls else None,
        "median_ttft_ms": statistics.median([r["ttft_ms"] for r in ok]) if ok else None,
        "per_request_tpot_ms": tpots,
        "requests": results,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("port", type=int)
    ap.add_argument("n", type=int)
    ap.add_argument("conc", type=int)
    ap.add_argument("out")
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    res = run(a.port, a.n, a.conc, a.prompt_len, a.output_len, a.seed)
    with open(a.out, "w") as f:
        json.dump(res, f)
    print(f"c={a.conc} n={a.n}: median TPOT {res['median_tpot_ms']} ms, failed {res['failed']}")


if __name__ == "__main__":
    main()
