"""A request's ``x-gateway-inference-objective`` names an objective of the policy; one mapped
to a priority class puts the request in that class when it is lighter than the caller's own,
never in a heavier one (a client cannot promote itself)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import aiohttp
import pytest

from epp.scheduling.registry import CATALOG
from loadtest.harness.processes import KvgateProcess
from policies.errors import PolicyError
from policies.loader import load_policy_text
from tests.integration.metrics_util import scrape

KEYS = {"sk-objective-interactive": "interactive", "sk-objective-batch": "batch"}


@pytest.mark.parametrize(
    ("key", "objective", "expected"),
    [
        ("sk-objective-interactive", "bulk", "batch"),  # lighter: taken
        ("sk-objective-batch", "chat", "batch"),  # heavier: refused, the caller's class stays
        ("sk-objective-interactive", "unlisted", "interactive"),
        ("sk-objective-interactive", "", "interactive"),
    ],
)
async def test_an_objective_can_lower_the_class_and_never_raise_it(
    start_backend: Callable[..., str],
    start_gateway: Callable[..., tuple[str, KvgateProcess]],
    key: str,
    objective: str,
    expected: str,
) -> None:
    backend = start_backend("--cost", "zero").removeprefix("http://")
    entries = ", ".join(
        f"{{sha256: {hashlib.sha256(k.encode()).hexdigest()}, tenant: t-{c}, class: {c}}}"
        for k, c in KEYS.items()
    )
    url, _ = start_gateway(f"""
auth: {{api_keys: [{entries}]}}
pools: {{p: {{endpoints: [{backend}]}}}}
routes: [{{model: kvgate-sim, pool: p}}]
epp:
  objectives:
    bulk: {{priority: -1, class: batch}}
    chat: {{priority: 10, class: interactive}}
observability: {{access_log: "off"}}
""")
    headers = {"authorization": f"Bearer {key}"}
    if objective:
        headers["x-gateway-inference-objective"] = objective
    body = {"model": "kvgate-sim", "prompt": "o", "max_tokens": 1}
    async with aiohttp.ClientSession() as session:
        for _ in range(3):
            async with session.post(f"{url}/v1/completions", json=body, headers=headers) as r:
                assert r.status == 200
    waits = {
        s.labels["class"]: s.value
        for s in scrape(url)["kvgate_queue_wait_seconds_count"]
        if s.value
    }
    assert waits == {expected: 3}


def test_an_objective_naming_an_unknown_class_is_a_policy_error() -> None:
    with pytest.raises(PolicyError) as err:
        load_policy_text(
            "pools: {p: {endpoints: [127.0.0.1:1]}}\nroutes: [{model: m, pool: p}]\n"
            "epp: {objectives: {bulk: {priority: -1, class: gold}}}",
            plugins=CATALOG,
        )
    assert err.value.errors == ["epp.objectives.bulk.class (line 3): unknown class 'gold'"]
