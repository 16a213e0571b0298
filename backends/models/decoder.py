"""The Llama/Qwen2 decoder forward over a step's flattened tokens and a paged KV cache.

Embedding, then per layer: RMSNorm, fused q/k/v (with Qwen2's biases), RoPE, GQA paged
attention, output projection, residual, RMSNorm, SwiGLU MLP, residual; a final RMSNorm, and
the LM head applied only to the rows whose next token is sampled. A LoRA batch, when given,
adds each token's adapter delta to the projections it targets.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F

from backends.models.attention import AttentionMetadata, GatherBuffers, paged_attention
from backends.models.config import ModelConfig
from backends.models.projection import build_projections
from backends.models.rope import apply_rope, rope_table
from backends.models.weights import ModelWeights


class LoraDelta(Protocol):
    def add(self, layer: int, module: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``y`` plus the adapters' delta for projection ``module`` of ``layer`` on ``x``."""
        ...


class KVCache:
    """One preallocated tensor per layer holding its K and V:
    ``[num_blocks * block_size, 2, kv_heads, dim]`` (a block's keys and values are adjacent, so
    one gather reads both)."""

    def __init__(
        self,
        config: ModelConfig,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        shape = (num_blocks * block_size, 2, config.num_key_value_heads, config.head_dim)
        self.layers = [
            torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)
        ]

    @staticmethod
    def bytes_per_block(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
        per_token = 2 * config.num_key_value_heads * config.head_dim * dtype.itemsize
        return per_token * block_size * config.num_hidden_layers


class Decoder:
    def __init__(
        self,
        config: ModelConfig,
        weights: ModelWeights,
        device: torch.device,
        *,
        packed_projections: bool = True,
    ) -> None:
        """``packed_projections``: run the projections on oneDNN's packed weights where this
        torch and device allow it (``backends.models.projection``)."""
        self.config = config
        self.weights = weights
        self.projections = build_projections(weights, packed_projections)
        self.device = device
        dtype = weights.embed.dtype
        self.cos, self.sin = rope_table(config, device, dtype)
        self.scale = config.head_dim**-0.5
        self.q_size = config.num_attention_heads * config.head_dim
        self.kv_size = config.num_key_value_heads * config.head_dim
        self.buffers = GatherBuffers()

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        cache: KVCache,
        lora: LoraDelta | None = None,
    ) -> torch.Tensor:
        """The final-normed hidden state of every input token: ``[tokens, hidden]``."""
        cfg, w = self.config, self.weights
        eps = cfg.rms_norm_eps
        cos, sin = self.cos[positions], self.sin[positions]
        heads, kv_heads, dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        hidden = F.embedding(input_ids, w.embed)
        size = (cfg.hidden_size,)
        for n, (layer, proj) in enumerate(zip(w.layers, self.projections.layers, strict=True)):
            x = F.rms_norm(hidden, size, layer.input_norm, eps)
            qkv = proj.qkv(x)
            if lora is not None:
                qkv = lora.add(n, "qkv", x, qkv)
            qk = apply_rope(
                qkv[:, : self.q_size + self.kv_size].view(-1, heads + kv_heads, dim), cos, sin
            )
            v = qkv[:, self.q_size + self.kv_size :].view(-1, kv_heads, dim)
            attended = paged_attention(
                qk[:, :heads], qk[:, heads:], v, cache.layers[n], meta, self.scale, self.buffers
            )
            out = proj.o_proj(attended)
            if lora is not None:
                out = lora.add(n, "o_proj", attended, out)
            hidden = hidden + out
            x = F.rms_norm(hidden, size, layer.post_norm, eps)
            gate_up = proj.gate_up(x)
            if lora is not None:
                gate_up = lora.add(n, "gate_up", x, gate_up)
            gate, up = gate_up.chunk(2, dim=-1)
            act = F.silu(gate) * up
            down = proj.down(act)
            if lora is not None:
                down = lora.add(n, "down", act, down)
            hidden = hidden + down
        return F.rms_norm(hidden, size, w.norm, eps)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.projections.lm_head(hidden)
