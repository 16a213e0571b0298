"""A Llama/Qwen2-style model's shape, read from an HF ``config.json`` or a size preset.

Torch-free, so that a bad folder is reported before torch is imported. Only the fields the
forward pass reads are kept; an architecture other than Llama, Mistral or Qwen2 is refused
with the file and field named.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
}


class ModelConfigError(ValueError):
    """A model folder that cannot be served: the message names the file and field."""


@dataclass(frozen=True, slots=True)
class RopeScaling:
    """``rope_scaling`` of the config: ``default``, ``linear`` or ``llama3``."""

    kind: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True, slots=True)
class ModelConfig:
    family: str  # "llama" or "qwen2" (Qwen2 has biases on q/k/v)
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int = 4096
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    torch_dtype: str = "float32"

    @property
    def num_parameters(self) -> int:
        h, i, d = self.hidden_size, self.intermediate_size, self.head_dim
        attn = h * d * (2 * self.num_attention_heads + 2 * self.num_key_value_heads)
        layer = attn + 3 * h * i + 2 * h
        embed = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return layer * self.num_hidden_layers + embed + h

    def with_vocab(self, vocab_size: int) -> ModelConfig:
        return replace(self, vocab_size=vocab_size)


# Random-weight presets (no download): tiny is about 5M parameters, small about 30M.
PRESETS = {
    "tiny": ModelConfig(
        family="llama",
        vocab_size=512,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        tie_word_embeddings=True,
    ),
    "small": ModelConfig(
        family="llama",
        vocab_size=512,
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=9,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=64,
        tie_word_embeddings=True,
    ),
}


def load_config(folder: str | Path) -> ModelConfig:
    """The config of an HF model folder; ``ModelConfigError`` naming what is wrong."""
    path = Path(folder) / "config.json"
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise ModelConfigError(f"{path}: missing (a model folder needs config.json)") from None
    except (OSError, ValueError) as exc:
        raise ModelConfigError(f"{path}: cannot be read as JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise ModelConfigError(f"{path}: must hold a JSON object")
    return parse_config(raw, str(path))


def parse_config(raw: dict[str, Any], where: str = "config.json") -> ModelConfig:
    architectures = raw.get("architectures") or []
    arch = architectures[0] if isinstance(architectures, list) and architectures else None
    family = SUPPORTED_ARCHITECTURES.get(arch) if isinstance(arch, str) else None
    if family is None:
        supported = ", ".join(sorted(SUPPORTED_ARCHITECTURES))
        raise ModelConfigError(
            f"{where}: architectures {architectures!r} is not supported (supported: {supported})"
        )

    def number(key: str, default: Any = None, kind: type = int) -> Any:
        value = raw.get(key, default)
        if value is None or isinstance(value, bool) or not isinstance(value, int | float):
            raise ModelConfigError(f"{where}: {key} must be a number, got {value!r}")
        return kind(value)

    heads = number("num_attention_heads")
    hidden = number("hidden_size")
    head_dim = raw.get("head_dim") or hidden // heads
    eos = raw.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
    return ModelConfig(
        family=family,
        vocab_size=number("vocab_size"),
        hidden_size=hidden,
        intermediate_size=number("intermediate_size"),
        num_hidden_layers=number("num_hidden_layers"),
        num_attention_heads=heads,
        num_key_value_heads=number("num_key_value_heads", heads),
        head_dim=int(head_dim),
        max_position_embeddings=number("max_position_embeddings", 4096),
        rms_norm_eps=number("rms_norm_eps", 1e-6, float),
        rope_theta=_rope_theta(raw, where),
        rope_scaling=_rope_scaling(raw.get("rope_scaling") or raw.get("rope_parameters"), where),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        attention_bias=family == "qwen2" or bool(raw.get("attention_bias", False)),
        mlp_bias=bool(raw.get("mlp_bias", False)),
        bos_token_id=raw.get("bos_token_id"),
        eos_token_ids=eos_ids,
        torch_dtype=str(raw.get("torch_dtype") or raw.get("dtype") or "float32"),
    )


def _rope_theta(raw: dict[str, Any], where: str) -> float:
    params = raw.get("rope_parameters")
    if isinstance(params, dict) and "rope_theta" in params:  # transformers 5's layout
        return float(params["rope_theta"])
    theta = raw.get("rope_theta", 10000.0)
    if not isinstance(theta, int | float):
        raise ModelConfigError(f"{where}: rope_theta must be a number")
    return float(theta)


def _rope_scaling(value: object, where: str) -> RopeScaling:
    if not isinstance(value, dict):
        return RopeScaling()
    kind = str(value.get("rope_type") or value.get("type") or "default")
    if kind not in ("default", "linear", "llama3"):
        raise ModelConfigError(f"{where}: rope_scaling type {kind!r} is not supported")
    return RopeScaling(
        kind=kind,
        factor=float(value.get("factor", 1.0)),
        low_freq_factor=float(value.get("low_freq_factor", 1.0)),
        high_freq_factor=float(value.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(value.get("original_max_position_embeddings", 8192)),
    )
