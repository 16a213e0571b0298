"""Projections on oneDNN's packed weights against the plain matmul, and the fallback."""

from __future__ import annotations

import logging

import pytest
import torch  # the folder's conftest skips it without torch

from backends.models import projection
from backends.models.config import PRESETS
from backends.models.projection import (
    CHUNK_ROWS,
    Projection,
    build_projections,
    packing_supported,
    row_bucket,
)
from backends.models.weights import random_weights

CPU = torch.device("cpu")
needs_packing = pytest.mark.skipif(
    not packing_supported(CPU, torch.float32), reason="this torch has no oneDNN packed matmul"
)


@needs_packing
@pytest.mark.parametrize("rows", [1, 15, 16, 300, 512, 1100])  # 1,100: three chunks, overlapping
@pytest.mark.parametrize("with_bias", [False, True])
def test_a_packed_projection_computes_the_plain_matmul(rows: int, with_bias: bool) -> None:
    generator = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 160, generator=generator)  # [in, out]
    bias = torch.randn(160, generator=generator) if with_bias else None
    wide = torch.randn(rows, 2 * 96, generator=generator)
    x = wide[:, ::2]  # a strided view, as the decoder's slices are
    packed, plain = Projection(weight, bias, pack=True), Projection(weight, bias, pack=False)
    assert packed.packed and not plain.packed
    with torch.inference_mode():
        got, want = packed(x), plain(x)
    expected = x @ weight + (bias if bias is not None else 0)
    torch.testing.assert_close(want, expected)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-4)


def test_packed_calls_see_only_a_few_row_counts() -> None:
    # oneDNN keeps a kernel and its buffers per row count: every count up to the chunk size
    # maps onto a small set of buckets, each at least the count and less than a step above it
    buckets = {row_bucket(rows) for rows in range(1, CHUNK_ROWS + 1)}
    assert len(buckets) <= 25
    assert max(buckets) == CHUNK_ROWS
    assert [row_bucket(n) for n in (1, 2, 3, 5, 16, 17, 32, 33, 64, 65, 500)] == [
        1,
        2,
        4,
        8,
        16,
        32,
        32,
        64,
        64,
        96,
        512,
    ]


@needs_packing
def test_every_projection_of_a_model_is_packed_and_the_head_too() -> None:
    weights = random_weights(PRESETS["tiny"], seed=1, dtype=torch.float32, device=CPU)
    built = build_projections(weights)
    assert built.packed and built.lm_head.packed
    assert all(
        p.packed
        for layer in built.layers
        for p in (layer.qkv, layer.o_proj, layer.gate_up, layer.down)
    )
    assert not build_projections(weights, pack=False).packed


def test_packing_is_never_tried_for_other_dtypes_or_devices() -> None:
    assert not packing_supported(CPU, torch.float64)
    assert not packing_supported(torch.device("cuda"), torch.float32)
    weights = random_weights(PRESETS["tiny"], seed=1, dtype=torch.float64, device=CPU)
    assert not build_projections(weights).packed


@needs_packing
def test_a_torch_whose_packed_ops_fail_falls_back_to_matmuls_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(weight: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("mkldnn reorder failed")

    monkeypatch.setattr(projection, "_pack", broken)
    weights = random_weights(PRESETS["tiny"], seed=1, dtype=torch.float32, device=CPU)
    with caplog.at_level(logging.WARNING, logger="backends.models.projection"):
        built = build_projections(weights)
    assert not built.packed
    assert "mkldnn reorder failed" in caplog.text


@needs_packing
def test_packed_ops_that_disagree_with_matmul_are_not_used(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    original = Projection.__call__

    def off_by_one(self: Projection, x: torch.Tensor) -> torch.Tensor:
        return original(self, x) + (1.0 if self.packed else 0.0)

    monkeypatch.setattr(Projection, "__call__", off_by_one)
    weights = random_weights(PRESETS["tiny"], seed=1, dtype=torch.float32, device=CPU)
    with caplog.at_level(logging.WARNING, logger="backends.models.projection"):
        assert not build_projections(weights).packed
    assert "disagree" in caplog.text
