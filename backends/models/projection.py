"""The decoder's projections, ``x @ W (+ b)``, through oneDNN's packed weights on the CPU.

torch's CPU matmul hands float32 products to MKL; the same torch build carries oneDNN, whose
matmul runs on a weight reordered once into its blocked layout (``torch.ops.mkldnn``: the ops
torch's own compiler emits for frozen linear layers). A ``Projection`` packs its weight that
way when ``packing_supported`` says the device and dtype allow it and a probe product agrees
with the plain matmul; otherwise, and on CUDA, it is the plain matmul. Both give the same
numbers up to float rounding. The measured difference is in docs/benchmarks.md ("Engine").

oneDNN builds and caches a kernel, with buffers sized by the row count, for every distinct
number of rows it sees; a step's rows take any value up to the token budget, and that cache
grew by gigabytes. A packed projection therefore only ever runs on a few row counts: up to
``CHUNK_ROWS`` rows rounded up to a bucket (padded with zero rows), and longer inputs in
chunks of ``CHUNK_ROWS`` (the last chunk overlapping the one before it).

The packed copy is held beside the ``[in, out]`` weight that ``ModelWeights`` keeps (the
plain path's, and what tests compare), so packed projections take the projection weights'
memory twice.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from backends.models.weights import LayerWeights, ModelWeights

log = logging.getLogger(__name__)

PACK_BATCH_HINT = 16  # the batch oneDNN tunes its layout for (any batch is served)
CHUNK_ROWS = 512  # the most rows one oneDNN call gets
ROW_STEP = 32  # row buckets: powers of two up to this, then its multiples up to CHUNK_ROWS


def row_bucket(rows: int) -> int:
    """The row count a packed call runs ``rows`` (1 to ``CHUNK_ROWS``) as."""
    if rows <= ROW_STEP:
        return 1 << (rows - 1).bit_length()
    return -(-rows // ROW_STEP) * ROW_STEP


def packing_supported(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether this torch can pack a projection for ``device`` and ``dtype``."""
    ops = torch.ops.mkldnn
    return (
        device.type == "cpu"
        and dtype == torch.float32
        and torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call]
        and hasattr(ops, "_reorder_linear_weight")
        and hasattr(ops, "_linear_pointwise")
    )


def _pack(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` (``[in, out]``) in oneDNN's blocked layout for ``_linear_pointwise``."""
    packed: torch.Tensor = torch.ops.mkldnn._reorder_linear_weight(
        weight.t().contiguous(), PACK_BATCH_HINT
    )
    return packed


class Projection:
    """``x @ weight + bias`` for a weight stored ``[in, out]``; packed when asked."""

    __slots__ = ("_packed", "bias", "weight")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, pack: bool) -> None:
        self.weight = weight
        self.bias = bias
        self._packed = _pack(weight) if pack else None

    @property
    def packed(self) -> bool:
        return self._packed is not None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: ``[rows, in]``; returns ``[rows, out]``."""
        if self._packed is None:
            if self.bias is None:
                return x @ self.weight
            return torch.addmm(self.bias, x, self.weight)
        rows = x.shape[0]
        if rows <= CHUNK_ROWS:
            bucket = row_bucket(rows)
            if bucket == rows:
                return self._run(x)
            padded = x.new_zeros(bucket, x.shape[1])
            padded[:rows] = x
            return self._run(padded)[:rows]
        out = x.new_empty(rows, self.weight.shape[1])
        for start in range(0, rows, CHUNK_ROWS):
            start = min(start, rows - CHUNK_ROWS)  # the last chunk overlaps the one before
            out[start : start + CHUNK_ROWS] = self._run(x[start : start + CHUNK_ROWS])
        return out

    def _run(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(
            x, self._packed, self.bias, "none", [], ""
        )
        return out


@dataclass(frozen=True, slots=True)
class LayerProjections:
    qkv: Projection
    o_proj: Projection
    gate_up: Projection
    down: Projection


@dataclass(frozen=True, slots=True)
class ModelProjections:
    layers: list[LayerProjections]
    lm_head: Projection

    @property
    def packed(self) -> bool:
        """Whether they run on oneDNN's packed weights (all or none do)."""
        return self.lm_head.packed


def build_projections(weights: ModelWeights, pack: bool = True) -> ModelProjections:
    """Every projection of ``weights``; packed where ``pack``, ``packing_supported`` and a
    probe product agree (a torch whose packed ops fail or disagree falls back, with a
    warning)."""
    embed = weights.embed
    pack = pack and packing_supported(embed.device, embed.dtype) and _probe_agrees()

    def layer(w: LayerWeights) -> LayerProjections:
        return LayerProjections(
            qkv=Projection(w.qkv, w.qkv_bias, pack),
            o_proj=Projection(w.o_proj, None, pack),
            gate_up=Projection(w.gate_up, None, pack),
            down=Projection(w.down, None, pack),
        )

    layers = [layer(w) for w in weights.layers]
    return ModelProjections(layers, Projection(weights.lm_head, None, pack))


def _probe_agrees() -> bool:
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(64, 48, generator=generator)
    bias = torch.randn(48, generator=generator)
    x = torch.randn(5, 64, generator=generator)
    try:
        with torch.inference_mode():
            packed = Projection(weight, bias, pack=True)(x)
    except RuntimeError as exc:
        log.warning("oneDNN packed projections unavailable (%s): using plain matmuls", exc)
        return False
    if torch.allclose(packed, torch.addmm(bias, x, weight), rtol=1e-4, atol=1e-4):
        return True
    log.warning("oneDNN packed projections disagree with matmul: using plain matmuls")
    return False
