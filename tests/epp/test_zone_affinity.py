"""The zone scorer: its own zone first, then its region, while they have room; the service
counts the picks that leave the zone."""

from __future__ import annotations

import dataclasses

from epp.framework import Endpoint
from epp.scheduling.saturation import SaturationDetector
from epp.scheduling.scorers.zone_affinity import ZoneAffinityScorer
from epp.service import EppService
from policies.loader import load_policy_text
from tests.epp.builders import make_endpoint, make_request

SCORER = ZoneAffinityScorer("zone", "a", "r", SaturationDetector())


def placed(address: str, zone: str | None, region: str | None = None, queue: int = 0) -> Endpoint:
    labels = {k: v for k, v in (("zone", zone), ("region", region)) if v is not None}
    endpoint = make_endpoint(address, queue=queue)
    return dataclasses.replace(endpoint, spec=dataclasses.replace(endpoint.spec, labels=labels))


def test_nearest_first_and_an_unlabelled_endpoint_counts_as_near() -> None:
    endpoints = [
        placed("a:1", "a", "r"),
        placed("b:1", "b", "r"),
        placed("c:1", "c", "elsewhere"),
        placed("n:1", None),
    ]
    assert SCORER.score(make_request(), endpoints) == {
        "a:1": 1.0,
        "b:1": 0.75,
        "c:1": 0.5,
        "n:1": 1.0,
    }


def test_a_full_zone_spills_to_the_nearest_with_room_and_nearness_decides_when_all_are_full() -> (
    None
):
    full = 5  # the default saturation queue depth
    endpoints = [placed("a:1", "a", "r", full), placed("b:1", "b", "r"), placed("c:1", "c", "x")]
    assert SCORER.score(make_request(), endpoints) == {"a:1": 0.0, "b:1": 0.75, "c:1": 0.5}
    endpoints = [placed("a:1", "a", "r", full), placed("b:1", "b", "r", full)]
    assert SCORER.score(make_request(), endpoints) == {"a:1": 1.0, "b:1": 0.75}


def test_without_a_zone_of_its_own_every_endpoint_is_near() -> None:
    scorer = ZoneAffinityScorer("zone", "", "", SaturationDetector())
    assert scorer.score(make_request(), [placed("b:1", "b")]) == {"b:1": 1.0}


POLICY = """
pools:
  p:
    endpoints:
      - {address: 127.0.0.1:1, labels: {zone: a}}
      - {address: 127.0.0.1:2, labels: {zone: b}}
routes: [{model: m, pool: p}]
epp:
  zone: a
  plugins:
    - {name: zone, type: zone-affinity-scorer}
    - {name: pick, type: max-score-picker}
  profiles: [{name: default, plugins: [{ref: zone}, {ref: pick}]}]
"""


def test_the_service_counts_requests_sent_out_of_the_zone() -> None:
    service = EppService(load_policy_text(POLICY))
    near, far = service.datastore.all()
    for endpoint in (near, far):
        endpoint.metrics = make_endpoint(queue=5 if endpoint is near else 0).metrics
    request = make_request("x", model="m")
    decision = service.pick("p", request)
    assert decision.result.target is far
    assert service.metrics.cross_zone_picks.labels("p")._value.get() == 0  # not sent yet
    service.dispatched(request, far)
    assert service.metrics.cross_zone_picks.labels("p")._value.get() == 1


def test_a_first_choice_in_the_zone_skipped_by_its_breaker_counts_where_it_went() -> None:
    service = EppService(load_policy_text(POLICY))
    near, far = service.datastore.all()
    request = make_request("x", model="m")
    assert service.pick("p", request).result.target is near  # the picker's first choice...
    service.dispatched(request, far)  # ... skipped (its breaker open): the request crossed
    assert service.metrics.cross_zone_picks.labels("p")._value.get() == 1
