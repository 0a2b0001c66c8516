"""Worker side of the trained sandbox models: runs under the control venv's torch, imported only by
`models.py _build` (never by the torch-free control code).

A model is trained from its seed on windows of one tokenized corpus (AdamW, warm-up then cosine
decay, a fixed number of steps and torch threads), so one machine always produces the same weights.
`add_identity_layers` makes a trained target more expensive without changing what it computes:
extra decoder layers whose attention and MLP output projections are zero add exactly 0 to the
residual stream, yet cost a full layer of compute in every forward pass.
"""

from __future__ import annotations

import math
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def token_stream(texts: list[str], tokenizer, eos_id: int) -> torch.Tensor:
    """One long stream of token ids, documents separated by EOS (no BOS: windows start anywhere)."""
    ids: list[int] = []
    for encoding in tokenizer.encode_batch(texts, add_special_tokens=False):
        ids += encoding.ids + [eos_id]
    return torch.tensor(ids, dtype=torch.long)


def _windows(stream: torch.Tensor, batch: int, seq_len: int, generator) -> torch.Tensor:
    starts = torch.randint(0, len(stream) - seq_len - 1, (batch,), generator=generator)
    return torch.stack([stream[int(s) : int(s) + seq_len] for s in starts])


def train(
    model: LlamaForCausalLM,
    stream: torch.Tensor,
    recipe: dict,
    teacher: LlamaForCausalLM | None = None,
    log=print,
) -> dict:
    """Train in place; returns {"steps", "tokens", "final_loss", "seconds"}. With a `teacher`, the
    loss is the KL divergence from the teacher's next-token distribution (distillation: a draft
    learns to agree with its target) instead of cross-entropy against the text."""
    generator = torch.Generator().manual_seed(recipe["seed"])
    steps, warmup = recipe["steps"], recipe["warmup_steps"]
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=recipe["lr"], betas=(0.9, 0.95), weight_decay=0.01
    )

    def lr_factor(step: int) -> float:  # linear warm-up, cosine decay to 10 %
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, steps - warmup)
        return 0.1 + 0.45 * (1 + math.cos(math.pi * progress))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    model.train()
    started = time.monotonic()
    recent: list[float] = []
    for step in range(steps):
        batch = _windows(stream, recipe["batch"], recipe["seq_len"], generator)
        if teacher is None:
            loss = model(input_ids=batch, labels=batch).loss
        else:
            with torch.no_grad():
                target = teacher(input_ids=batch).logits.log_softmax(-1).flatten(0, 1)
            student = model(input_ids=batch).logits.log_softmax(-1).flatten(0, 1)
            loss = torch.nn.functional.kl_div(
                student, target, log_target=True, reduction="batchmean"
            )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        recent = (recent + [loss.item()])[-20:]
        if step % 50 == 0 or step == steps - 1:
            log(f"  step {step}/{steps} loss {loss.item():.3f} ({time.monotonic() - started:.0f}s)")
    model.eval()
    return {
        "steps": steps,
        "tokens": steps * recipe["batch"] * recipe["seq_len"],
        "final_loss": round(sum(recent) / len(recent), 3),
        "seconds": round(time.monotonic() - started, 1),
    }


@torch.no_grad()
def heldout(models: dict[str, LlamaForCausalLM], stream: torch.Tensor, seq_len: int, seed: int):
    """Held-out loss per model, and how often each model's greedy next token equals the first
    model's (the target's): the teacher-forced agreement that draft acceptance comes from."""
    generator = torch.Generator().manual_seed(seed)
    batch = _windows(stream, 16, seq_len, generator)
    out, reference = {}, None
    for name, model in models.items():
        result = model(input_ids=batch, labels=batch)
        greedy = result.logits[:, :-1].argmax(-1)
        reference = greedy if reference is None else reference
        out[name] = {
            "heldout_loss": round(result.loss.item(), 3),
            "greedy_agreement_with_target": round((greedy == reference).float().mean().item(), 3),
        }
    return out


def add_identity_layers(model: LlamaForCausalLM, extra: int, seed: int) -> LlamaForCausalLM:
    """The same function with `extra` more decoder layers after the trained ones: their q/k/v
    and gate/up weights are random (real work), their o_proj and down_proj are zero, so each adds
    exactly 0 to the residual stream. Checked: the logits are bit-identical."""
    config = LlamaConfig.from_dict(model.config.to_dict())
    trained = config.num_hidden_layers
    config.num_hidden_layers = trained + extra
    torch.manual_seed(seed)
    padded = LlamaForCausalLM(config).to(torch.float32).eval()
    missing, unexpected = padded.load_state_dict(model.state_dict(), strict=False)
    assert not unexpected and all(".layers." in key for key in missing), (missing, unexpected)
    with torch.no_grad():
        for layer in padded.model.layers[trained:]:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        probe = torch.arange(1, 65).unsqueeze(0) % config.vocab_size
        assert torch.equal(model(input_ids=probe).logits, padded(input_ids=probe).logits)
    return padded
