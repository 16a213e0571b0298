"""A decoder's weights: loaded from a local HF folder's safetensors, or random from a seed.

Projections that read the same input are fused at load time (q/k/v into one matrix, gate/up
into another) so a layer runs four matmuls, and every projection is stored transposed,
``[in, out]`` and contiguous, for ``x @ W`` (the faster layout for MKL at decode batch sizes:
docs/benchmarks.md, "Engine"). Every tensor is checked against the config: a
missing tensor or a wrong shape fails at start with the file and tensor named.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from backends.models.config import ModelConfig, ModelConfigError


@dataclass(slots=True)
class LayerWeights:
    input_norm: torch.Tensor  # [hidden]
    qkv: torch.Tensor  # [hidden, (heads + 2 * kv_heads) * head_dim]
    qkv_bias: torch.Tensor | None
    o_proj: torch.Tensor  # [heads * head_dim, hidden]
    post_norm: torch.Tensor  # [hidden]
    gate_up: torch.Tensor  # [hidden, 2 * intermediate]
    down: torch.Tensor  # [intermediate, hidden]


@dataclass(slots=True)
class ModelWeights:
    embed: torch.Tensor  # [vocab, hidden]
    layers: list[LayerWeights]
    norm: torch.Tensor  # [hidden]
    lm_head: torch.Tensor  # [hidden, vocab] (a transposed copy of the embedding when tied)


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """HF tensor names of a Llama/Qwen2 checkpoint and their shapes."""
    h, d, i = config.hidden_size, config.head_dim, config.intermediate_size
    q_out, kv_out = config.num_attention_heads * d, config.num_key_value_heads * d
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (config.vocab_size, h),
        "model.norm.weight": (h,),
    }
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, h)
    for n in range(config.num_hidden_layers):
        p = f"model.layers.{n}."
        shapes |= {
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q_out, h),
            p + "self_attn.k_proj.weight": (kv_out, h),
            p + "self_attn.v_proj.weight": (kv_out, h),
            p + "self_attn.o_proj.weight": (h, q_out),
            p + "mlp.gate_proj.weight": (i, h),
            p + "mlp.up_proj.weight": (i, h),
            p + "mlp.down_proj.weight": (h, i),
        }
        if config.attention_bias:
            shapes |= {
                p + "self_attn.q_proj.bias": (q_out,),
                p + "self_attn.k_proj.bias": (kv_out,),
                p + "self_attn.v_proj.bias": (kv_out,),
            }
    return shapes


def load_weights(
    folder: str | Path, config: ModelConfig, dtype: torch.dtype, device: torch.device
) -> ModelWeights:
    """The folder's ``*.safetensors`` (sharded or not), checked and fused."""
    from safetensors import safe_open

    root = Path(folder)
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise ModelConfigError(f"{root}: no *.safetensors weights in the model folder")
    expected = expected_shapes(config)
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as handle:
                for name in handle.keys():  # noqa: SIM118 - safe_open is not a Mapping
                    if name not in expected:
                        continue  # e.g. rotary_emb.inv_freq of old checkpoints
                    tensor = handle.get_tensor(name)
                    if tuple(tensor.shape) != expected[name]:
                        raise ModelConfigError(
                            f"{file}: tensor {name} has shape {tuple(tensor.shape)}, "
                            f"the config says {expected[name]}"
                        )
                    tensors[name] = tensor.to(device, dtype)
        except ModelConfigError:
            raise
        except Exception as exc:  # safetensors raises its own error types for a bad file
            raise ModelConfigError(f"{file}: cannot be read as safetensors: {exc}") from exc
    missing = [name for name in expected if name not in tensors]
    if missing:
        raise ModelConfigError(
            f"{root}: tensor {missing[0]} is missing from the safetensors files"
            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
        )
    return fuse(tensors, config)


def random_weights(
    config: ModelConfig, seed: int, dtype: torch.dtype, device: torch.device
) -> ModelWeights:
    """Weights drawn from ``N(0, 0.02)`` (norms at 1) with a fixed seed: no download."""
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, shape in expected_shapes(config).items():
        if name.endswith("norm.weight"):
            tensors[name] = torch.ones(shape)
        elif name.endswith(".bias"):
            tensors[name] = torch.zeros(shape)
        else:
            tensors[name] = torch.randn(shape, generator=generator) * 0.02
    return fuse({k: v.to(device, dtype) for k, v in tensors.items()}, config)


def fuse(tensors: dict[str, torch.Tensor], config: ModelConfig) -> ModelWeights:
    layers = []
    for n in range(config.num_hidden_layers):
        p = f"model.layers.{n}."
        qkv_names = [p + f"self_attn.{x}_proj" for x in "qkv"]
        bias = None
        if config.attention_bias:
            bias = torch.cat([tensors[name + ".bias"] for name in qkv_names])
        layers.append(
            LayerWeights(
                input_norm=tensors[p + "input_layernorm.weight"],
                qkv=_transposed(torch.cat([tensors[name + ".weight"] for name in qkv_names])),
                qkv_bias=bias,
                o_proj=_transposed(tensors[p + "self_attn.o_proj.weight"]),
                post_norm=tensors[p + "post_attention_layernorm.weight"],
                gate_up=_transposed(
                    torch.cat(
                        [tensors[p + "mlp.gate_proj.weight"], tensors[p + "mlp.up_proj.weight"]]
                    )
                ),
                down=_transposed(tensors[p + "mlp.down_proj.weight"]),
            )
        )
    embed = tensors["model.embed_tokens.weight"]
    lm_head = embed if config.tie_word_embeddings else tensors["lm_head.weight"]
    return ModelWeights(embed, layers, tensors["model.norm.weight"], _transposed(lm_head))


def _transposed(weight: torch.Tensor) -> torch.Tensor:
    """An HF ``[out, in]`` weight as a contiguous ``[in, out]`` matrix."""
    return weight.t().contiguous()
