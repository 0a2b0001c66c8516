"""Write the two architecture-only model folders the device loads with `--load-format dummy`.

No weights can reach the device, so each folder holds the real Hugging Face `config.json` of the
architecture (Qwen3-8B target, Qwen3-0.6B draft) and one small byte-level BPE tokenizer trained
here. Both configs keep vocab_size 151936 (the real one) so the draft and target vocabularies match,
as vLLM requires for draft_model; the tokenizer only ever emits ids < its own size, which is all the
random-prompt benchmark needs.

Usage: python -m benchmarks.gpu_payoff.make_models OUTDIR   (writes OUTDIR/target and OUTDIR/draft)
"""

from __future__ import annotations

import glob
import json
import os
import sys
import sysconfig

VOCAB_SIZE = 151936
TOKENIZER_VOCAB = 8192

COMMON = {
    "model_type": "qwen3",
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "hidden_act": "silu",
    "head_dim": 128,
    "initializer_range": 0.02,
    "max_position_embeddings": 40960,
    "max_window_layers": 28,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "use_cache": True,
    "use_sliding_window": False,
    "torch_dtype": "bfloat16",
    "vocab_size": VOCAB_SIZE,
}
# Values from Qwen/Qwen3-8B and Qwen/Qwen3-0.6B config.json.
TARGET = COMMON | {
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_window_layers": 36,
    "tie_word_embeddings": False,
}
DRAFT = COMMON | {
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "tie_word_embeddings": True,
}


def train_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))[:200]
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train(files, trainer)
    return tok


def write_model_files(folder: str, cfg: dict, tok) -> None:
    """config.json and the tokenizer files of one model folder (also used by gpu_truth's
    make_weights.py for its Hugging Face cache snapshots)."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1, sort_keys=True)
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "eos_token": "<|endoftext|>",
                "model_max_length": 40960,
            },
            f,
            indent=1,
        )


def main() -> None:
    out = sys.argv[1]
    tok = train_tokenizer()
    for name, cfg in (("target", TARGET), ("draft", DRAFT)):
        write_model_files(os.path.join(out, name), cfg, tok)
    print(f"wrote {out}/target and {out}/draft (tokenizer vocab {tok.get_vocab_size()})")


if __name__ == "__main__":
    main()
