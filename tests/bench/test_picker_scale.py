"""The picker-at-scale benchmark fills the index it measures, in both prefix modes."""

from __future__ import annotations

import pytest

from bench.picker_scale import CHAIN, fill, measure, policy_text
from epp.service import EppService
from policies.loader import load_policy_text


@pytest.mark.parametrize("precise", [False, True])
def test_the_index_holds_the_blocks_it_was_filled_with(precise: bool) -> None:
    service = EppService(load_policy_text(policy_text(10, precise)))
    fill(service, 100 * CHAIN, seed=1)
    assert service.prefix is not None
    held = [service.prefix.blocks_of(e.address) for e in service.datastore.all()]
    assert held == [10 * CHAIN] * 10


def test_a_measurement_reports_its_picks() -> None:
    figures = measure(40, 20 * CHAIN, picks=30, precise=False)
    assert 0 < figures["p50_us"] <= figures["p99_us"] and figures["picks_per_s"] > 0
