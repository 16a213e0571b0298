"""The picker's own load signal (requests in flight, counted at dispatch and finish) and the
plugins of the default profile: active-request-scorer, load-balance-filter,
cold-spread-scorer."""

from __future__ import annotations

import pytest

from epp.datalayer.placement import add_placed
from epp.scheduling.filters.load_balance import LoadBalanceFilter, Params
from epp.scheduling.handle import PluginHandle
from epp.scheduling.scorers.active_requests import ActiveRequestScorer
from epp.scheduling.scorers.cold_spread import ColdSpreadScorer
from epp.scheduling.scorers.prefix_cache import PrefixCacheScorer
from epp.service import EppService
from policies.loader import load_policy_text
from tests.epp.builders import make_endpoint, make_request

A, B, C = "10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"


def loaded(*counts: int) -> list:  # type: ignore[type-arg]
    endpoints = [make_endpoint(a) for a in (A, B, C)[: len(counts)]]
    for endpoint, count in zip(endpoints, counts, strict=True):
        endpoint.in_flight = count
    return endpoints


def test_in_flight_counts_dispatch_until_finished_or_refused() -> None:
    service = EppService(
        load_policy_text(
            f"pools: {{p: {{endpoints: [{A}, {B}]}}}}\nroutes: [{{model: m, pool: p}}]\n"
        )
    )
    a, b = service.datastore.endpoints("p")
    request = make_request("hello")
    first, second = service.dispatched(request, a), service.dispatched(request, a)
    refused = service.dispatched(request, b)
    assert (a.in_flight, b.in_flight) == (2, 1)
    service.finished(first)
    service.finished(first)  # idempotent
    service.refused(refused)
    assert (a.in_flight, b.in_flight) == (1, 0)
    service.refused(second)
    service.finished(second)  # refused already took it back
    assert a.in_flight == 0


def test_requests_over_before_a_scrape_leave_the_saturation_queue() -> None:
    """A steady stream of short requests to one endpoint between two scrapes is no queue
    there: only those sent since the scrape and not over yet count toward it (before, every
    pick since the scrape did, and a one-endpoint pool under a steady load was held back as
    saturated)."""
    service = EppService(
        load_policy_text(f"pools: {{p: {{endpoints: [{A}]}}}}\nroutes: [{{model: m, pool: p}}]\n")
    )
    (a,) = service.datastore.endpoints("p")
    a.metrics.scraped_at = 100.0  # a scrape, 0 waiting
    now = 100.1
    for _ in range(20):  # more than the saturation queue (5), one after another
        service.finished(service.dispatched(make_request("hi"), a))
    assert a.load.dispatched == 0
    assert service.saturation.unsaturated([a], now) == [a]

    burst = [service.dispatched(make_request("hi"), a) for _ in range(5)]
    assert service.saturation.unsaturated([a], now) == []  # five open at once: a queue
    a.metrics.scraped_at, a.load.dispatched = 100.2, 0  # a scrape shows them (as the scraper does)
    service.finished(burst[0])  # sent before that scrape: nothing to take off
    service.refused(burst[1])
    assert (a.load.dispatched, a.in_flight) == (0, 3)
    late = service.dispatched(make_request("hi"), a)
    service.refused(late)  # never reached it: taken off the queue too
    assert a.load.dispatched == 0


def test_active_request_scorer_prefers_the_least_in_flight() -> None:
    scorer = ActiveRequestScorer("active")
    assert scorer.score(make_request(), loaded(4, 2, 0)) == {A: 0.0, B: 0.5, C: 1.0}
    assert scorer.score(make_request(), loaded(3, 3, 3)) == {A: 1.0, B: 1.0, C: 1.0}


@pytest.mark.parametrize(
    ("counts", "params", "kept"),
    [
        ((11, 2, 3), Params(), [B, C]),  # 11 is more than 8 above 2 and more than 2 x 2
        ((10, 2, 3), Params(), [A, B, C]),  # only 8 above the least
        ((50, 30, 30), Params(), [A, B, C]),  # 20 above but within 2 x 30
        ((61, 30, 30), Params(), [B, C]),
        ((9, 2, 3), Params(abs_threshold=4, rel_threshold=1.5), [B, C]),
        ((11, 2, 3), Params(abs_threshold=10), [A, B, C]),
        ((9,), Params(), [A]),
    ],
)
def test_load_balance_filter(counts: tuple[int, ...], params: Params, kept: list[str]) -> None:
    endpoints = loaded(*counts)
    chosen = LoadBalanceFilter("balance", params).filter(make_request(), endpoints)
    assert [e.address for e in chosen] == kept


NEUTRAL = {A: 0.5, B: 0.5, C: 0.5}  # a request some endpoint holds: the prefix scorer decides


@pytest.mark.parametrize(
    ("num_gpu_blocks", "among_full", "expected", "warm_expected"),
    [
        # caches of 32 blocks (8 of 16 tokens): 8, 4 and 0 held differ by a quarter or more,
        # for a request some endpoint holds too (what it adds evicts others' blocks from a full
        # cache, not from an empty one)
        (8, "placed", {A: 0.0, B: 0.5, C: 1.0}, {A: 0.0, B: 0.5, C: 1.0}),
        # caches of 4,000 blocks hold 8, 4 and 0: no real difference in room, which a min-max
        # scaling would blow up to 0 against 1 (every new conversation went to the
        # busiest engine); below a quarter of a cache it counts in proportion ...
        (1000, "fill", {A: 0.0, B: 0.004, C: 0.008}, NEUTRAL),
        # ... or by the new content placed on each lately: A 300 tokens, B 100, C 200
        (1000, "placed", {A: 0.0, B: 1.0, C: 0.5}, NEUTRAL),
        # not scraped yet (capacity unknown): min-max
        (0, "placed", {A: 0.0, B: 0.5, C: 1.0}, NEUTRAL),
    ],
)
def test_cold_spread_places_new_prefixes_where_caches_hold_least(
    num_gpu_blocks: int,
    among_full: str,
    expected: dict[str, float],
    warm_expected: dict[str, float],
) -> None:
    handle = PluginHandle()
    prefix = PrefixCacheScorer.from_config(
        "prefix", {"block_size_tokens": 4, "chars_per_token": 1}, handle
    )
    spread = ColdSpreadScorer.from_config("spread", {"among_full": among_full}, handle)
    a, b, c = (make_endpoint(x) for x in (A, B, C))
    for endpoint, tokens in ((a, 300), (b, 100), (c, 200)):
        add_placed(endpoint, tokens)
    for endpoint in (a, b, c):
        endpoint.metrics.num_gpu_blocks = num_gpu_blocks  # of 16 tokens: 4 index blocks each
    for text in ("aaaabbbbccccdddd", "eeeeffffgggghhhh"):
        prefix.index.learn(make_request(text), a)
    prefix.index.learn(make_request("iiiijjjjkkkkllll"), b)
    cold = make_request("zzzzyyyyxxxxwwww")
    assert spread.score(cold, [a, b, c]) == pytest.approx(expected)
    warm = make_request("aaaabbbbccccdddd and more")
    assert spread.score(warm, [a, b, c]) == pytest.approx(warm_expected)


def test_cold_spread_without_a_prefix_index_is_neutral() -> None:
    spread = ColdSpreadScorer.from_config("spread", {}, PluginHandle())
    assert spread.score(make_request("x"), loaded(1, 2)) == {A: 0.5, B: 0.5}


@pytest.mark.parametrize(
    ("prefix_weight", "active_weight", "diverted"), [(3, 1, 0.0), (1, 10, 1.0)]
)
def test_a_pick_that_passes_over_a_warm_endpoint_is_counted(
    prefix_weight: int, active_weight: int, diverted: float
) -> None:
    """Cold misses the scores chose (the warm endpoint passed the filters) are
    counted, so a benchmark can report them as a share of decisions."""
    service = EppService(
        load_policy_text(f"""
pools: {{p: {{endpoints: [{A}, {B}]}}}}
routes: [{{model: m, pool: p}}]
epp:
  plugins:
    - {{name: prefix, type: prefix-cache-scorer, params: {{block_size_tokens: 4, chars_per_token: 1}}}}
    - {{name: active, type: active-request-scorer}}
    - {{name: pick, type: max-score-picker}}
  profiles: [{{name: default, plugins: [{{ref: prefix, weight: {prefix_weight}}}, {{ref: active, weight: {active_weight}}}, {{ref: pick}}]}}]
""")
    )
    a, _ = service.datastore.endpoints("p")
    warm = "aaaabbbbccccddddeeee"
    service.dispatched(service.scheduling_request("p", "1", "m", {"prompt": warm}, {}), a)
    a.in_flight = 3  # busier than b, not overloaded (no filter in this profile)
    request = service.scheduling_request("p", "2", "m", {"prompt": warm + " more"}, {})
    target = service.pick("p", request).result.target
    assert target is not None and target.address == (B if diverted else A)
    assert request.prefix_match == {A: 5, B: 0}
    counted = service.metrics.registry.get_sample_value(
        "kvgate_epp_warm_diverted_total", {"pool": "p"}
    )
    assert (counted or 0.0) == diverted


def test_placed_content_halves_every_half_life() -> None:
    from epp.datalayer.placement import HALF_LIFE, placed

    endpoint = make_endpoint(A)
    assert placed(endpoint, 5.0) == 0.0
    add_placed(endpoint, 1_000, now=10.0)
    add_placed(endpoint, 1_000, now=10.0 + HALF_LIFE)  # the first 1,000 count 500 by now
    assert placed(endpoint, 10.0 + HALF_LIFE) == pytest.approx(1_500)
    assert placed(endpoint, 10.0 + 2 * HALF_LIFE) == pytest.approx(750)
