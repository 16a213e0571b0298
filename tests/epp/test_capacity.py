"""Capacity weights for mixed hardware: an endpoint's ``capacity`` (the policy's) divides the
load every load signal reads — waiting queue, running and in-flight requests, token backlog,
new prefixes placed, the saturation threshold — and weighs the ties the pickers break, in the
EPP and in the gateway's least-in-flight default."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from epp.datalayer.placement import add_placed
from epp.framework import Endpoint
from epp.scheduling.filters.load_balance import LoadBalanceFilter, Params
from epp.scheduling.handle import PluginHandle
from epp.scheduling.pickers.max_score import MaxScorePicker
from epp.scheduling.pickers.max_score import Params as PickerParams
from epp.scheduling.saturation import SaturationDetector
from epp.scheduling.scorers.active_requests import ActiveRequestScorer
from epp.scheduling.scorers.cold_spread import ColdSpreadScorer
from epp.scheduling.scorers.prefix_cache import PrefixCacheScorer
from epp.scheduling.scorers.queue import QueueScorer
from epp.scheduling.scorers.running_requests import RunningRequestsScorer
from epp.scheduling.scorers.token_backlog import Params as BacklogParams
from epp.scheduling.scorers.token_backlog import TokenBacklogScorer
from epp.service import EppService
from gateway.routing.endpoint_picker import LeastInFlightPicker, PickRequest, endpoint_states
from policies.loader import load_policy_text
from policies.schema import Saturation
from tests.epp.builders import make_endpoint, make_request

BIG, SMALL = "10.0.0.1:8000", "10.0.0.2:8000"
POLICY = f"""
pools: {{p: {{endpoints: [{{address: "{BIG}", capacity: 3}}, "{SMALL}"]}}}}
routes: [{{model: m, pool: p}}]
"""


def pair(**loads: tuple[int, int]) -> tuple[Endpoint, Endpoint]:
    """A capacity-3 endpoint and a capacity-1 one; ``name=(big's, small's)`` sets the fields."""
    big, small = make_endpoint(BIG, capacity=3), make_endpoint(SMALL)
    for name, (on_big, on_small) in loads.items():
        for endpoint, value in ((big, on_big), (small, on_small)):
            if name in ("waiting", "running"):
                setattr(endpoint.metrics, name, value)
            elif name == "in_flight":
                endpoint.in_flight = value
            else:
                setattr(endpoint.load, name, value)
    return big, small


def test_the_policy_gives_each_endpoint_its_capacity() -> None:
    service = EppService(load_policy_text(POLICY))
    assert [e.capacity for e in service.datastore.endpoints("p")] == [3.0, 1.0]
    assert [e.capacity for e in endpoint_states(load_policy_text(POLICY))["p"]] == [3.0, 1.0]


@pytest.mark.parametrize("capacity", ["0", "-1", "x", "true"])
def test_a_capacity_that_is_not_a_positive_number_is_refused(capacity: str) -> None:
    text = POLICY.replace("capacity: 3", f"capacity: {capacity}")
    with pytest.raises(Exception, match=r"pools.p.endpoints\[0\].capacity"):
        load_policy_text(text)


@pytest.mark.parametrize(
    ("scorer", "field"),
    [
        (QueueScorer("queue"), "waiting"),
        (RunningRequestsScorer("running"), "running"),
        (ActiveRequestScorer("active"), "in_flight"),
    ],
)
def test_count_scorers_read_load_per_unit_of_capacity(scorer: object, field: str) -> None:
    request = make_request("x")
    # 5 on capacity 3 is less loaded than 2 on capacity 1; 9 on 3 is as loaded as 3 on 1
    scores = scorer.score(request, list(pair(**{field: (5, 2)})))  # type: ignore[attr-defined]
    assert scores == {BIG: 1.0, SMALL: 0.0}
    scores = scorer.score(request, list(pair(**{field: (9, 3)})))  # type: ignore[attr-defined]
    assert scores == {BIG: 1.0, SMALL: 1.0}


def test_the_token_backlog_is_a_time_to_get_through_it() -> None:
    scorer = TokenBacklogScorer("backlog", BacklogParams(), PluginHandle())
    big, small = pair(prefill_tokens=(3000, 1000))
    scores = scorer.score(make_request("x"), [big, small])
    assert scores[BIG] == scores[SMALL]  # three times the tokens, three times as fast
    big.load.prefill_tokens = 4500
    scores = scorer.score(make_request("x"), [big, small])
    assert scores[BIG] < scores[SMALL]


def test_new_prefixes_are_placed_in_proportion_to_capacity() -> None:
    handle = PluginHandle()
    PrefixCacheScorer.from_config("prefix", {}, handle)
    scorer = ColdSpreadScorer.from_config("spread", {}, handle)
    big, small = pair()
    now = time.monotonic()
    add_placed(big, 2000, now=now)
    add_placed(small, 1000, now=now)
    assert scorer.score(make_request("new"), [big, small]) == {BIG: 1.0, SMALL: 0.0}
    add_placed(big, 2000, now=now)  # 4000 on 3 against 1000 on 1: the small one's turn
    assert scorer.score(make_request("new"), [big, small]) == {BIG: 0.0, SMALL: 1.0}


def test_saturation_and_the_load_balance_filter_scale_with_capacity() -> None:
    detector = SaturationDetector(Saturation(queue_depth=5))
    big, small = pair(waiting=(12, 4))
    assert detector.unsaturated([big, small], time.monotonic()) == [big, small]
    big.metrics.waiting, small.metrics.waiting = 15, 5
    assert detector.unsaturated([big, small], time.monotonic()) == []
    balance = LoadBalanceFilter("balance", Params(abs_threshold=2, rel_threshold=1.5))
    big, small = pair(in_flight=(15, 2))  # 5 per unit against 2: over both thresholds
    assert balance.filter(make_request("x"), [big, small]) == [small]
    big.in_flight = 9  # 3 per unit against 2: within the absolute step
    assert balance.filter(make_request("x"), [big, small]) == [big, small]


def test_ties_go_to_each_endpoint_in_proportion_to_its_capacity() -> None:
    picker = MaxScorePicker("pick", PickerParams(seed=7))
    big, small = pair()
    firsts = Counter(
        picker.pick(make_request("x"), [(big, 1.0), (small, 1.0)])[0].address for _ in range(4000)
    )
    assert firsts[BIG] / 4000 == pytest.approx(0.75, abs=0.03)
    # a better score still wins whatever the capacity
    assert picker.pick(make_request("x"), [(big, 0.5), (small, 1.0)])[0] is small


def test_the_gateways_least_in_flight_picker_weighs_in_flight_and_ties_by_capacity() -> None:
    pools = endpoint_states(load_policy_text(POLICY))
    big, small = pools["p"]
    picker = LeastInFlightPicker(pools, seed=3)
    request = PickRequest("m", {}, {}, None)
    big.in_flight, small.in_flight = 5, 2
    assert picker.rank("p", request).next(set()) is big
    big.in_flight = 7
    assert picker.rank("p", request).next(set()) is small
    big.in_flight, small.in_flight = 0, 0
    firsts = Counter(picker.rank("p", request).next(set()) is big for _ in range(4000))
    assert firsts[True] / 4000 == pytest.approx(0.75, abs=0.03)
