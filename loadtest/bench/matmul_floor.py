"""The physical limit of the engine benchmark: fp32 matmul GFLOP/s of bare torch on this box.

``python -m loadtest.bench.matmul_floor`` prints one JSON line: the GFLOP/s of a large square
matmul (the machine's peak as torch reaches it) and of the decode-shaped matmuls of the
benchmark's model at batch 16 (``[16, hidden] x [hidden, out]``), each the best of a few runs.
"""

from __future__ import annotations

import json
import sys
import time


def gflops(m: int, k: int, n: int, seconds: float = 0.5) -> float:
    import torch

    a, b = torch.randn(m, k), torch.randn(k, n)
    for _ in range(3):
        a @ b
    best = 0.0
    for _ in range(3):
        count, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds / 3:
            a @ b
            count += 1
        best = max(best, 2 * m * k * n * count / (time.perf_counter() - start) / 1e9)
    return best


def main() -> int:
    hidden = int(sys.argv[1]) if len(sys.argv) > 1 else 256
    inter = int(sys.argv[2]) if len(sys.argv) > 2 else 768
    result = {
        "square_1024_gflops": gflops(1024, 1024, 1024),
        "decode16_mlp_gflops": gflops(16, hidden, 2 * inter),
        "decode16_attn_gflops": gflops(16, hidden, 2 * hidden),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
