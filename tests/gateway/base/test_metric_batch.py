"""Batched metric updates end up exactly as the same plain prometheus_client calls would."""

from __future__ import annotations

import math
import random

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from gateway.base.metric_batch import BatchedCounter, BatchedHistogram

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
                bh.observe_many((model,), [value])
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


def test_finished_requests_and_in_flight_reach_the_metrics_at_flush() -> None:
    from gateway.base.context import RequestContext
    from gateway.base.metrics import GatewayMetrics

    metrics = GatewayMetrics()
    in_flight = {"gpu": 3}
    metrics.in_flight_source = lambda: dict(in_flight)
    for status, ttft, tokens, wait in ((200, 0.02, (5, 7), 0.0), (429, None, (0, 0), None)):
        ctx = RequestContext("id", "/v1/chat/completions")
        ctx.model, ctx.status, ctx.ttft, ctx.elapsed = "m", status, ttft, 0.05
        ctx.prompt_tokens, ctx.completion_tokens = tokens
        ctx.priority_class, ctx.queue_wait = "standard", wait
        metrics.finished(ctx)
    batch = RequestContext("id3", "/v1/chat/completions")  # same labels, another class
    batch.model, batch.status, batch.ttft, batch.elapsed = "m", 200, 0.03, 0.07
    batch.prompt_tokens, batch.completion_tokens = 1, 2
    batch.priority_class, batch.queue_wait = "batch", 0.25
    metrics.finished(batch)
    other = RequestContext("id2", "/v1/completions")
    other.model, other.status, other.elapsed, other.completion_tokens = "n", 200, 0.5, 9
    metrics.finished(other)
    text = metrics.exposition().decode()  # flushes first
    assert 'kvgate_requests_total{model="n",route="/v1/completions",status="200"} 1.0' in text
    assert 'kvgate_request_duration_seconds_sum{route="/v1/completions"} 0.5' in text
    assert 'kvgate_tokens_total{direction="completion",model="n"} 9.0' in text
    route = 'route="/v1/chat/completions"'
    assert f'kvgate_requests_total{{model="m",{route},status="200"}} 2.0' in text
    assert f'kvgate_requests_total{{model="m",{route},status="429"}} 1.0' in text
    assert f"kvgate_request_duration_seconds_count{{{route}}} 3.0" in text
    assert 'kvgate_time_to_first_byte_seconds_count{model="m"} 2.0' in text
    assert 'kvgate_tokens_total{direction="prompt",model="m"} 6.0' in text
    assert 'kvgate_tokens_total{direction="completion",model="m"} 9.0' in text
    assert 'kvgate_queue_wait_seconds_sum{class="batch"} 0.25' in text
    assert 'kvgate_in_flight_requests{pool="gpu"} 3.0' in text
    in_flight["gpu"] = 0
    text = metrics.exposition().decode()
    assert 'kvgate_in_flight_requests{pool="gpu"} 0.0' in text
    assert f'kvgate_requests_total{{model="m",{route},status="200"}} 2.0' in text  # not twice
    assert 'kvgate_queue_wait_seconds_count{class="standard"} 1.0' in text  # 429: never queued


def test_observing_many_at_once_equals_one_at_a_time() -> None:
    values = [0.0005, 0.001, 0.05, 3.0, 50.0, 0.01]
    one, many = (
        BatchedHistogram(Histogram(name, name, ["m"], registry=CollectorRegistry()), BUCKETS)
        for name in ("one", "many")
    )
    for value in values:
        one.observe_many(("x",), [value])
    many.observe_many(("x",), values)
    assert one.pending == many.pending
