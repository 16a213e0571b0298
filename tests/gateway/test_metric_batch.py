"""Batched metric updates end up exactly as the same plain prometheus_client calls would."""

from __future__ import annotations

import math
import random

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from gateway.metric_batch import BatchedCounter, BatchedHistogram

BUCKETS = (0.001, 0.01, 0.1, 1.0, 10.0)


def test_batched_updates_match_plain_ones() -> None:
    rng = random.Random(7)
    expositions = []
    for batched in (False, True):
        registry = CollectorRegistry()
        counter = Counter("c", "c", ["route"], registry=registry)
        gauge = Gauge("g", "g", ["pool"], registry=registry)
        histogram = Histogram("h", "h", ["model"], buckets=BUCKETS, registry=registry)
        bc, bg, bh = (
            BatchedCounter(counter),
            BatchedCounter(gauge),
            BatchedHistogram(histogram, BUCKETS),
        )
        rng.seed(7)
        for step in range(2_000):
            route, model = rng.choice("ab"), rng.choice("xyz")
            value = rng.choice([0.001, 10.0, 50.0, rng.random() * 3])  # on bounds and past them
            delta = rng.choice([1, -1])
            if batched:
                bc.add((route,))
                bg.add(("p",), delta)
                bh.observe((model,), value)
                if step % 300 == 0:
                    for batch in (bc, bg, bh):
                        batch.flush()
            else:
                counter.labels(route).inc()
                gauge.labels("p").inc(delta)
                histogram.labels(model).observe(value)
        for batch in (bc, bg, bh):
            batch.flush()
        text = generate_latest(registry).decode()
        expositions.append([line for line in text.splitlines() if "_created" not in line])
    plain, batched_lines = expositions
    assert len(plain) == len(batched_lines)
    for want, got in zip(plain, batched_lines, strict=True):
        if "_sum{" in want:  # float additions in another order: equal up to rounding
            name, _, expected = want.rpartition(" ")
            assert got.startswith(name + " ")
            assert math.isclose(float(got.rpartition(" ")[2]), float(expected), rel_tol=1e-12)
        else:
            assert got == want
    assert any(line.startswith('h_bucket{le="+Inf",model="x"}') for line in expositions[1])
