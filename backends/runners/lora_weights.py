"""Multi-LoRA for the torch runner: PEFT adapters loaded at run time, a bounded number resident.

``load`` reads a PEFT folder (``adapter_config.json`` + ``adapter_model.safetensors``) into CPU
memory, checking every tensor against the base model; at most ``max_loras`` adapters are
resident on the device at once, swapped in least-recently-used. A step's ``LoraBatch`` adds,
for each adapter in the batch, ``scale * x_rows @ A.T @ B.T`` to the rows of its tokens, on the
slice of a fused projection (q/k/v, gate/up) the adapter targets.
"""

from __future__ import annotations

import json
import math
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from backends.engine.step import SeqStep
from backends.models.config import ModelConfig

# PEFT module name -> (fused projection, which slice of its output)
FUSED = {
    "q_proj": ("qkv", 0),
    "k_proj": ("qkv", 1),
    "v_proj": ("qkv", 2),
    "o_proj": ("o_proj", 0),
    "gate_proj": ("gate_up", 0),
    "up_proj": ("gate_up", 1),
    "down_proj": ("down", 0),
}
KEY = re.compile(r"layers\.(\d+)\.(?:self_attn|mlp)\.(\w+_proj)\.lora_([AB])\.weight$")


@dataclass(frozen=True, slots=True)
class LoraLayer:
    a: torch.Tensor  # [rank, in]
    b: torch.Tensor  # [out slice, rank]
    start: int  # first output column of the slice in the fused projection
    scale: float


Adapter = dict[tuple[int, str], list[LoraLayer]]  # (layer, fused projection) -> its parts


class LoraRegistry:
    def __init__(
        self,
        config: ModelConfig,
        max_loras: int,
        max_rank: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.config = config
        self.max_loras = max_loras
        self.max_rank = max_rank
        self.dtype = dtype
        self.device = device
        self._cpu: dict[str, Adapter] = {}
        self._resident: OrderedDict[str, Adapter] = OrderedDict()
        self._lock = threading.Lock()
        self.num_swaps = 0

    @property
    def resident(self) -> list[str]:
        return list(self._resident)

    def load(self, name: str, path: str) -> None:
        """Read adapter ``name``; ``ValueError`` naming the file and tensor if unusable."""
        adapter = self._read(Path(path))
        with self._lock:
            self._cpu[name] = adapter
            self._resident.pop(name, None)  # a reload replaces what was resident

    def unload(self, name: str) -> None:
        """Forget ``name``: no new step can make it resident. A resident copy stays until the
        LRU needs its slot, so that requests already running on it finish (the server takes
        no new request for it)."""
        with self._lock:
            self._cpu.pop(name, None)

    def batch(self, seqs: Sequence[SeqStep]) -> LoraBatch:
        """The step's adapters made resident, with the token rows of each."""
        rows: dict[str, list[int]] = {}
        offset = 0
        for seq in seqs:
            if seq.lora_name is not None:
                rows.setdefault(seq.lora_name, []).extend(
                    range(offset, offset + seq.num_new_tokens)
                )
            offset += seq.num_new_tokens
        parts = []
        for name, token_rows in rows.items():
            adapter = self._make_resident(name)
            index = (
                None if len(token_rows) == offset else torch.tensor(token_rows, device=self.device)
            )
            parts.append((adapter, index))
        return LoraBatch(parts)

    def _make_resident(self, name: str) -> Adapter:
        with self._lock:
            adapter = self._resident.get(name)
            if adapter is not None:
                self._resident.move_to_end(name)
                return adapter
            stored = self._cpu.get(name)
            if stored is None:
                raise ValueError(f"LoRA adapter {name!r} is not loaded")
            while len(self._resident) >= self.max_loras:
                self._resident.popitem(last=False)
            adapter = {
                key: [
                    LoraLayer(p.a.to(self.device), p.b.to(self.device), p.start, p.scale)
                    for p in layers
                ]
                for key, layers in stored.items()
            }
            self._resident[name] = adapter
            self.num_swaps += 1
            return adapter

    def _read(self, root: Path) -> Adapter:
        config_path = root / "adapter_config.json"
        try:
            adapter_config = json.loads(config_path.read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"{config_path}: cannot be read: {exc}") from exc
        if not isinstance(adapter_config, dict):
            raise ValueError(f"{config_path}: must hold a JSON object")
        rank = adapter_config.get("r")
        alpha = adapter_config.get("lora_alpha", rank)
        if not isinstance(rank, int) or rank < 1 or not isinstance(alpha, int | float):
            raise ValueError(f"{config_path}: r must be a positive integer and lora_alpha a number")
        if rank > self.max_rank:
            raise ValueError(f"{config_path}: rank {rank} exceeds --max-lora-rank {self.max_rank}")
        scale = alpha / (math.sqrt(rank) if adapter_config.get("use_rslora") else rank)
        weights = root / "adapter_model.safetensors"
        pairs = self._read_tensors(weights)
        adapter: Adapter = {}
        for (layer, module), ab in sorted(pairs.items()):
            if set(ab) != {"A", "B"}:
                raise ValueError(f"{weights}: layer {layer} {module} lacks lora_A or lora_B")
            fused, part = FUSED[module]
            a, b = ab["A"], ab["B"]
            start, width, in_features = self._slice(fused, part)
            if a.shape != (rank, in_features) or b.shape != (width, rank):
                raise ValueError(
                    f"{weights}: layer {layer} {module}: lora_A {tuple(a.shape)} / lora_B "
                    f"{tuple(b.shape)} do not fit rank {rank} and the base model "
                    f"({in_features} in, {width} out)"
                )
            adapter.setdefault((layer, fused), []).append(LoraLayer(a, b, start, scale))
        if not adapter:
            raise ValueError(f"{weights}: no LoRA tensors for the model's projections")
        return adapter

    def _read_tensors(self, path: Path) -> dict[tuple[int, str], dict[str, torch.Tensor]]:
        from safetensors import safe_open

        pairs: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
        try:
            with safe_open(str(path), framework="pt") as handle:
                for key in handle.keys():  # noqa: SIM118 - safe_open is not a Mapping
                    match = KEY.search(key)
                    if match is None:
                        raise ValueError(f"{path}: tensor {key} is not a LoRA A/B of a projection")
                    layer, module, which = int(match[1]), match[2], match[3]
                    if module not in FUSED or layer >= self.config.num_hidden_layers:
                        raise ValueError(f"{path}: tensor {key} targets no layer of the model")
                    tensor = handle.get_tensor(key).to(self.dtype)
                    pairs.setdefault((layer, module), {})[which] = tensor
        except ValueError:
            raise
        except Exception as exc:  # safetensors' own error types for a bad or missing file
            raise ValueError(f"{path}: cannot be read as safetensors: {exc}") from exc
        return pairs

    def _slice(self, fused: str, part: int) -> tuple[int, int, int]:
        """(first output column, width, input features) of a part of a fused projection."""
        cfg = self.config
        q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
        h, i = cfg.hidden_size, cfg.intermediate_size
        if fused == "qkv":
            return ((0, q, h), (q, kv, h), (q + kv, kv, h))[part]
        if fused == "gate_up":
            return (part * i, i, h)
        if fused == "o_proj":
            return (0, h, q)
        return (0, h, i)


class LoraBatch:
    """The ``LoraDelta`` of one step: each adapter's delta on its own tokens' rows."""

    def __init__(self, parts: list[tuple[Adapter, torch.Tensor | None]]) -> None:
        self.parts = parts

    def add(self, layer: int, module: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        for adapter, rows in self.parts:
            layers = adapter.get((layer, module))
            if not layers:
                continue
            xs = x if rows is None else x[rows]
            for part in layers:
                delta = (xs @ part.a.T) @ part.b.T * part.scale
                end = part.start + delta.shape[1]
                if rows is None:
                    y[:, part.start : end] += delta
                else:
                    y[rows, part.start : end] += delta
        return y
