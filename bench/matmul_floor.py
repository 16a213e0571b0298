"""The physical limit of the engine benchmark: fp32 matmul GFLOP/s of bare torch on this box.

``python -m bench.matmul_floor`` prints one JSON line: the GFLOP/s of a large square
matmul (the machine's peak as torch reaches it) and of the decode-shaped matmuls of the
benchmark's model at batch 16 (``[16, hidden] x [hidden, out]``), each the best of a few runs,
through torch's plain matmul and through oneDNN's packed weights (the engine's projections,
``backends.models.projection``) where this torch has them; the ``*_gflops`` keys are the
faster of the two.
"""

from __future__ import annotations

import json
import sys
import time


def gflops(m: int, k: int, n: int, packed: bool, seconds: float = 0.5) -> float:
    import torch

    from backends.models.projection import Projection

    a = torch.randn(m, k)
    product = Projection(torch.randn(k, n), None, pack=packed)
    best = 0.0
    with torch.inference_mode():
        for _ in range(3):
            product(a)
        for _ in range(3):
            count, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds / 3:
                product(a)
                count += 1
            best = max(best, 2 * m * k * n * count / (time.perf_counter() - start) / 1e9)
    return best


def main() -> int:
    import torch

    from backends.models.projection import packing_supported

    hidden = int(sys.argv[1]) if len(sys.argv) > 1 else 256
    inter = int(sys.argv[2]) if len(sys.argv) > 2 else 768
    shapes = {
        "square_1024": (1024, 1024, 1024),
        "decode16_mlp": (16, hidden, 2 * inter),
        "decode16_attn": (16, hidden, 2 * hidden),
    }
    ways = ["plain", *(["packed"] if packing_supported(torch.device("cpu"), torch.float32) else [])]
    result: dict[str, float] = {}
    for name, (m, k, n) in shapes.items():
        for way in ways:
            result[f"{name}_{way}_gflops"] = gflops(m, k, n, packed=way == "packed")
        result[f"{name}_gflops"] = max(result[f"{name}_{way}_gflops"] for way in ways)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
