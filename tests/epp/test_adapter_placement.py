"""A new prefix of a LoRA adapter goes where the adapter fits (LoRA mix): an endpoint
that serves the adapter already, or one that serves fewer adapters than it holds at once."""

from __future__ import annotations

import time

import pytest

from epp.datalayer.placement import HALF_LIFE, adapter_fits, add_placed, room_among, served_adapters
from epp.framework import Endpoint
from epp.scheduling.handle import PluginHandle
from epp.scheduling.scorers.cold_spread import ColdSpreadScorer
from epp.scheduling.scorers.prefix_cache import PrefixCacheScorer
from tests.epp.builders import make_endpoint, make_request

A, B, C = "10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"


def serving(address: str, adapters: dict[str, int], tokens: int, max_loras: int = 2) -> Endpoint:
    """An endpoint the picker sent ``adapters`` (requests each, now) and ``tokens`` of new
    prompt content."""
    endpoint = make_endpoint(address, max_loras=max_loras)
    endpoint.metrics.num_gpu_blocks = 1000  # caches alike in fill: placed content decides
    now = time.monotonic()  # the scorer reads the clock
    add_placed(endpoint, tokens, now=now)
    for adapter, requests in adapters.items():
        for _ in range(requests):
            add_placed(endpoint, 0, adapter, now=now)
    return endpoint


def test_an_adapter_is_served_for_a_while_after_its_last_request() -> None:
    endpoint = make_endpoint(A)
    add_placed(endpoint, 100, "x", now=10.0)
    assert served_adapters(endpoint, 10.0) == {"x"}
    assert served_adapters(endpoint, 10.0 + HALF_LIFE * 0.9) == {"x"}
    assert served_adapters(endpoint, 10.0 + HALF_LIFE * 1.1) == set()
    add_placed(endpoint, 100, "y", now=10.0 + 5 * HALF_LIFE)  # x is dropped, not kept decaying
    assert endpoint.load.placed_adapters == {"y": 1.0}


def test_adapters_the_endpoint_reports_running_count_as_served() -> None:
    endpoint = make_endpoint(A, running_loras=("z",), max_loras=2)
    add_placed(endpoint, 0, "x", now=0.0)
    assert served_adapters(endpoint, 0.0) == {"x", "z"}


@pytest.mark.parametrize(
    ("served", "max_loras", "adapter", "fits"),
    [
        ({"x": 1}, 2, "x", True),  # serves it
        ({"x": 1}, 2, "y", True),  # a free adapter slot
        ({"x": 1, "y": 3}, 2, "y", True),
        ({"x": 1, "y": 3}, 2, "z", False),  # both slots taken by others
        ({"x": 1, "y": 3}, 0, "z", True),  # max_loras unknown: anything fits
        ({}, 1, "z", True),
    ],
)
def test_adapter_fits(served: dict[str, int], max_loras: int, adapter: str, fits: bool) -> None:
    assert adapter_fits(serving(A, served, 0, max_loras), adapter) is fits


def spread_scores(endpoints: list[Endpoint], lora: str | None) -> dict[str, float]:
    handle = PluginHandle()
    PrefixCacheScorer.from_config("prefix", {"block_size_tokens": 4, "chars_per_token": 1}, handle)
    spread = ColdSpreadScorer.from_config("spread", {}, handle)
    return spread.score(make_request("a new system prompt", lora=lora), endpoints)


def test_a_new_prefix_goes_where_its_adapter_fits_least_placed_first() -> None:
    # A serves x (a slot free), B serves y and z (full), C serves x and y; placed 300/100/200
    endpoints = [
        serving(A, {"x": 2}, 300),
        serving(B, {"y": 1, "z": 1}, 100),
        serving(C, {"x": 1, "y": 1}, 200),
    ]
    # x fits A and C: they score 0.5-1 by placed content (C has less), B (the least placed) 0
    assert spread_scores(endpoints, "x") == pytest.approx({A: 0.5, B: 0.0, C: 1.0})
    # z fits A (a free slot) and B (serves it)
    assert spread_scores(endpoints, "z") == pytest.approx({A: 0.5, B: 1.0, C: 0.0})


def test_where_an_adapter_fits_everywhere_or_nowhere_placed_content_alone_decides() -> None:
    endpoints = [serving(A, {"x": 1, "y": 1}, 300), serving(B, {"y": 1, "z": 1}, 100)]
    by_placed = {A: 0.0, B: 1.0}
    assert spread_scores(endpoints, "y") == by_placed  # both serve y
    assert spread_scores(endpoints, "w") == by_placed  # neither has room: no preference
    assert spread_scores(endpoints, None) == by_placed  # the base model


def test_a_crowded_adapter_spreads_to_endpoints_with_room() -> None:
    # only A serves x, and it was sent 2.25x the pool's mean new content: its cache would
    # overflow, so x's new prefix goes where there is room, as for an adapter that fits nowhere
    endpoints = [
        serving(A, {"x": 4, "y": 1}, 900),
        serving(B, {"y": 1, "z": 1}, 100),
        serving(C, {"v": 1, "w": 1}, 200),
    ]
    assert spread_scores(endpoints, "x") == pytest.approx({A: 0.0, B: 1.0, C: 0.875})
    # below 1.25x the mean it still has room (A sent 200 of 500: 1.2x the mean)
    endpoints[0] = serving(A, {"x": 4, "y": 1}, 200)
    assert spread_scores(endpoints, "x") == pytest.approx({A: 1.0, B: 0.0, C: 0.0})


@pytest.mark.parametrize(
    ("fit_placed", "pool_placed", "room"),
    [
        ((125,), (125, 75, 100), True),  # at most 1.25x the mean (100)
        ((126,), (126, 75, 100), False),
        ((400, 100), (400, 100, 100), True),  # one fitting endpoint has room
        ((0,), (0, 0), True),  # nothing sent yet
    ],
)
def test_room_among(fit_placed: tuple[int, ...], pool_placed: tuple[int, ...], room: bool) -> None:
    pool = [make_endpoint(f"10.0.1.{i}:8000") for i in range(len(pool_placed))]
    for endpoint, tokens in zip(pool, pool_placed, strict=True):
        add_placed(endpoint, tokens, now=0.0)
    assert room_among(pool[: len(fit_placed)], pool, now=0.0) is room


def placed_by_gateway(address: str, loaded: set[str], slots: int = 2, queue: int = 0) -> Endpoint:
    """An endpoint of a pool whose adapters the gateway loads, holding ``loaded``."""
    endpoint = make_endpoint(address, queue=queue)
    endpoint.adapters_loaded, endpoint.adapter_slots = loaded, slots
    return endpoint


def test_a_gateway_placed_adapter_stays_where_it_is_loaded_until_those_saturate() -> None:
    from epp.scheduling.filters.placed_adapter import PlacedAdapterFilter

    keep = PlacedAdapterFilter("adapters", PluginHandle().saturation)
    a, b = placed_by_gateway(A, {"x"}), placed_by_gateway(B, set())
    assert keep.filter(make_request(lora="x"), [a, b]) == [a]
    assert keep.filter(make_request(lora="y"), [a, b]) == [a, b]  # held nowhere: all stay
    assert keep.filter(make_request(), [a, b]) == [a, b]  # no adapter
    busy = placed_by_gateway(A, {"x"}, queue=50)  # saturated: the adapter may spread
    assert keep.filter(make_request(lora="x"), [busy, b]) == [busy, b]
    plain = make_endpoint(A)  # the gateway does not place this pool's adapters
    plain.adapters_loaded = {"x"}
    assert keep.filter(make_request(lora="x"), [plain, b]) == [plain, b]


def test_a_gateway_placed_adapter_fits_where_loaded_or_where_a_slot_is_free() -> None:
    full = placed_by_gateway(A, {"x", "y"})
    roomy = placed_by_gateway(B, {"x"})
    assert adapter_fits(full, "x") and not adapter_fits(full, "z")
    assert adapter_fits(roomy, "z")
    assert served_adapters(full) >= {"x", "y"}


def test_lora_affinity_reads_what_the_gateway_loaded() -> None:
    from epp.scheduling.scorers.lora_affinity import LoraAffinityScorer
    from epp.scheduling.scorers.lora_affinity import Params as LoraParams

    scorer = LoraAffinityScorer("lora", LoraParams())
    holder, roomy, full = (
        placed_by_gateway(A, {"x"}),
        placed_by_gateway(B, {"y"}),
        placed_by_gateway(C, {"y", "z"}),
    )
    scores = scorer.score(make_request(lora="x"), [holder, roomy, full])
    assert scores == {A: 1.0, B: 0.8, C: 0.0}
