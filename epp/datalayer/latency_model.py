"""A per-pool model of a request's time to first token on each endpoint, trained online from
every request whose first token came back.

    TTFT ~ w0 + w1 · prefill + w2 · owed + w3 · requests

with ``prefill`` the thousands of prompt tokens the endpoint has to compute before this request's
first token (what the picker sent there and is not prefilled yet, plus this request's own
uncached tokens), ``owed`` the thousands of output tokens still owed there, ``requests`` the
requests in flight there, each divided by the endpoint's capacity (so unlike endpoints share one
model). The fit is ridge regression on exponentially forgotten sufficient statistics (half the
weight after ~140 requests), pulled toward a prior that ranks like the token backlog (seconds per
thousand tokens ahead), solved again every few requests: a few dozen multiply-adds per request,
no history kept, and no step can blow up as recursive least squares can without excitation.
"""

from __future__ import annotations

from epp.framework import Endpoint

Features = tuple[float, float, float, float]
PRIOR: Features = (0.0, 0.1, 0.01, 0.0)  # seconds: at rest, per 1k prefill, per 1k owed, per req
RIDGE = 1.0  # the prior's weight, in requests
FORGET = 0.995  # each request's weight decays by this per newer one
REFIT_EVERY = 8  # requests between solves


class _Fit:
    """One pool's forgotten statistics and current weights."""

    __slots__ = ("gram", "moment", "seen", "weights")

    def __init__(self) -> None:
        self.gram = [[0.0] * 4 for _ in range(4)]  # Σ λ^age x xᵀ
        self.moment = [0.0] * 4  # Σ λ^age x y
        self.weights: list[float] = list(PRIOR)
        self.seen = 0

    def add(self, x: Features, y: float) -> None:
        gram, moment = self.gram, self.moment
        for i in range(4):
            row, xi = gram[i], x[i]
            for j in range(4):
                row[j] = FORGET * row[j] + xi * x[j]
            moment[i] = FORGET * moment[i] + xi * y
        self.seen += 1
        if self.seen % REFIT_EVERY == 0 or self.seen < REFIT_EVERY:
            self.weights = _solve(
                [
                    [g + (RIDGE if i == j else 0.0) for j, g in enumerate(row)]
                    for i, row in enumerate(gram)
                ],
                [m + RIDGE * p for m, p in zip(moment, PRIOR, strict=True)],
            )


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """``a x = b`` by Gaussian elimination with partial pivoting (``a`` is positive definite:
    the ridge keeps it so)."""
    n = len(b)
    m = [[*row, rhs] for row, rhs in zip(a, b, strict=True)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(col + 1, n):
            factor = m[r][col] / m[col][col]
            for c in range(col, n + 1):
                m[r][c] -= factor * m[col][c]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (m[r][n] - sum(m[r][c] * x[c] for c in range(r + 1, n))) / m[r][r]
    return x


class LatencyModel:
    """Predicted TTFT per endpoint, one fit per pool (``features``, ``predict``, ``learn``)."""

    def __init__(self) -> None:
        self._fits: dict[str, _Fit] = {}

    @staticmethod
    def features(endpoint: Endpoint, uncached: int) -> Features:
        """What the model reads of ``endpoint`` for a request with ``uncached`` prompt tokens
        it would compute there (before the request is counted there)."""
        load, capacity = endpoint.load, endpoint.capacity
        return (
            1.0,
            (load.prefill_tokens + uncached) / 1000 / capacity,
            load.decode_tokens / 1000 / capacity,
            endpoint.in_flight / capacity,
        )

    def predict(self, pool: str, x: Features) -> float:
        """Seconds to the first token, never below 0."""
        fit = self._fits.get(pool)
        w = fit.weights if fit is not None else PRIOR
        return max(0.0, w[0] * x[0] + w[1] * x[1] + w[2] * x[2] + w[3] * x[3])

    def learn(self, pool: str, x: Features, ttft: float) -> float:
        """A request sent with ``x`` saw its first token after ``ttft`` seconds: the relative
        error of what was predicted for it, |predicted - actual| / actual; then learn it."""
        error = abs(self.predict(pool, x) - ttft) / max(ttft, 1e-6)
        fit = self._fits.get(pool)
        if fit is None:
            fit = self._fits[pool] = _Fit()
        fit.add(x, ttft)
        return error

    def weights(self, pool: str) -> Features:
        w = self._fits[pool].weights if pool in self._fits else PRIOR
        return (w[0], w[1], w[2], w[3])
