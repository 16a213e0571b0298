"""The plain-torch ceiling of the engine benchmark: its workload computed by the least eager
torch can do, with none of an engine's work.

``python -m bench.torch_floor MODEL_DIR PROMPTS_JSON OUTPUT_TOKENS [BATCH]`` loads the
model with kvgate's own loader and projections (the same fused weights, on oneDNN's packed
layout where the engine uses it), then times, each the best of a few repeats:

- a decode step of ``BATCH`` sequences whose KV is one contiguous tensor per layer, every
  sequence at the workload's mean decode context (no paging, no padding, no masks, no
  scheduler, argmax instead of a sampler, no HTTP);
- the same step at a context of one token (what the step costs without attention);
- prefill of 2,048 tokens in one forward, as 8 causal rows of 256 tokens and as 4 of 512
  (the faster counts: long rows amortise the per-op cost, and no prompt is padded).

It prints one JSON line: those times and the workload's tokens/s if every prompt were
prefilled at that rate and every output token decoded in full batches at that step time. No
scheduled engine in eager torch can beat it on this workload.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from backends.models.config import load_config
from backends.models.projection import build_projections
from backends.models.rope import apply_rope, rope_table
from backends.models.weights import ModelWeights, load_weights


class ContiguousModel:
    def __init__(self, folder: str) -> None:
        self.config = cfg = load_config(folder)
        self.w: ModelWeights = load_weights(folder, cfg, torch.float32, torch.device("cpu"))
        self.p = build_projections(self.w)
        self.cos, self.sin = rope_table(cfg, torch.device("cpu"), torch.float32)
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.dim = cfg.head_dim

    def prefill(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``ids``/``positions``: ``[batch, q_len]``, each row a whole prompt attended causally;
        returns each row's argmax next token."""
        cfg, w = self.config, self.w
        batch, q_len = ids.shape
        heads, kv_heads, dim = self.heads, self.kv_heads, self.dim
        q_size, kv_size = heads * dim, kv_heads * dim
        size, eps = (cfg.hidden_size,), cfg.rms_norm_eps
        cos, sin = self.cos[positions.reshape(-1)], self.sin[positions.reshape(-1)]
        hidden = F.embedding(ids.reshape(-1), w.embed)
        for layer, proj in zip(w.layers, self.p.layers, strict=True):
            x = F.rms_norm(hidden, size, layer.input_norm, eps)
            qkv = proj.qkv(x)
            qk = apply_rope(qkv[:, : q_size + kv_size].view(-1, heads + kv_heads, dim), cos, sin)
            q = qk[:, :heads].view(batch, q_len, heads, dim).transpose(1, 2)
            k = qk[:, heads:].view(batch, q_len, kv_heads, dim).transpose(1, 2)
            v = qkv[:, q_size + kv_size :].view(batch, q_len, kv_heads, dim).transpose(1, 2)
            attended = F.scaled_dot_product_attention(
                q, k, v, is_causal=True, scale=dim**-0.5, enable_gqa=True
            )
            hidden = hidden + proj.o_proj(attended.transpose(1, 2).reshape(-1, q_size))
            x = F.rms_norm(hidden, size, layer.post_norm, eps)
            gate, up = proj.gate_up(x).chunk(2, dim=-1)
            hidden = hidden + proj.down(F.silu(gate) * up)
        last = hidden.view(batch, q_len, -1)[:, -1]
        return self.p.lm_head(F.rms_norm(last, size, w.norm, eps)).argmax(-1)


class DecodeStep:
    """One batched decode step over a contiguous KV cache held outside the timed call."""

    def __init__(self, model: ContiguousModel, batch: int, context: int) -> None:
        self.model, self.context = model, context
        shape = (batch, model.kv_heads, context, model.dim)
        self.cache = [(torch.randn(shape), torch.randn(shape)) for _ in model.w.layers]
        self.ids = torch.full((batch, 1), 7)
        self.positions = torch.full((batch, 1), context - 1)

    def __call__(self) -> None:
        m, cfg, w = self.model, self.model.config, self.model.w
        heads, kv_heads, dim = m.heads, m.kv_heads, m.dim
        q_size, kv_size = heads * dim, kv_heads * dim
        size, eps = (cfg.hidden_size,), cfg.rms_norm_eps
        batch = self.ids.shape[0]
        cos, sin = m.cos[self.positions.reshape(-1)], m.sin[self.positions.reshape(-1)]
        hidden = F.embedding(self.ids.reshape(-1), w.embed)
        for layer, proj, (keys, values) in zip(w.layers, m.p.layers, self.cache, strict=True):
            x = F.rms_norm(hidden, size, layer.input_norm, eps)
            qkv = proj.qkv(x)
            qk = apply_rope(qkv[:, : q_size + kv_size].view(-1, heads + kv_heads, dim), cos, sin)
            q = qk[:, :heads].reshape(batch, kv_heads, heads // kv_heads, dim)
            keys[:, :, -1] = qk[:, heads:]  # the new token's KV written in place
            values[:, :, -1] = qkv[:, q_size + kv_size :].view(-1, kv_heads, dim)
            attended = F.scaled_dot_product_attention(q, keys, values, scale=dim**-0.5)
            hidden = hidden + proj.o_proj(attended.reshape(batch, q_size))
            x = F.rms_norm(hidden, size, layer.post_norm, eps)
            gate, up = proj.gate_up(x).chunk(2, dim=-1)
            hidden = hidden + proj.down(F.silu(gate) * up)
        m.p.lm_head(F.rms_norm(hidden, size, w.norm, eps)).argmax(-1).tolist()


def best_seconds(call: Callable[[], object], repeats: int, rounds: int = 3) -> float:
    with torch.inference_mode():
        for _ in range(3):
            call()
        best = float("inf")
        for _ in range(rounds):
            start = time.perf_counter()
            for _ in range(repeats):
                call()
            best = min(best, (time.perf_counter() - start) / repeats)
    return best


PREFILLS = ((8, 256), (4, 512))  # rows x tokens, 2,048 prompt tokens in one forward


def prefill_tokens_per_s(model: ContiguousModel, rows: int, length: int) -> float:
    ids = torch.randint(5, model.config.vocab_size, (rows, length))
    positions = torch.arange(length).expand(rows, length)
    return ids.numel() / best_seconds(lambda: model.prefill(ids, positions), 3)


def main() -> int:
    folder, prompts_file, output_tokens = sys.argv[1], sys.argv[2], int(sys.argv[3])
    batch = int(sys.argv[4]) if len(sys.argv) > 4 else 16
    prompts = json.loads(Path(prompts_file).read_text())
    prompt_tokens = sum(len(p) for p in prompts)
    outputs = len(prompts) * output_tokens
    context = round(prompt_tokens / len(prompts) + output_tokens / 2)
    model = ContiguousModel(folder)
    decode_s = best_seconds(DecodeStep(model, batch, context), 40)
    bare_s = best_seconds(DecodeStep(model, batch, 1), 40)
    prefill_rate = max(prefill_tokens_per_s(model, rows, length) for rows, length in PREFILLS)
    seconds = prompt_tokens / prefill_rate + outputs / batch * decode_s
    result = {
        "batch": batch,
        "mean_decode_context": context,
        "decode_step_ms": decode_s * 1000,
        "decode_step_without_attention_ms": bare_s * 1000,
        "prefill_tokens_per_s": prefill_rate,
        "prompt_tokens": prompt_tokens,
        "output_tokens": outputs,
        "ceiling_tokens_per_s": outputs / seconds,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
