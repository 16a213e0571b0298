"""A routing decision anyone can read, through a real gateway and picker: a caller the route
allows gets the decision in ``x-kvgate-explain`` (the pick, each filter's drops, each scorer's
weight and scores, the prefix it holds) and the access log has it; a caller it does not allow
gets nothing, as does one who did not ask; a sampled share is explained in the log only."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest

from loadtest.harness.processes import KvgateProcess

ALLOWED, OTHER = "sk-explain-ops", "sk-explain-app"
Start = Callable[..., tuple[str, KvgateProcess]]


def policy(endpoints: list[str], explain: str) -> str:
    keys = ", ".join(
        f"{{sha256: {hashlib.sha256(key.encode()).hexdigest()}, tenant: {tenant}}}"
        for key, tenant in ((ALLOWED, "ops"), (OTHER, "app"))
    )
    return f"""
auth: {{api_keys: [{keys}]}}
pools: {{p: {{endpoints: [{", ".join(endpoints)}]}}}}
routes: [{{model: kvgate-sim, pool: p, explain: {explain}}}]
"""


@pytest.fixture
def endpoints(start_backend: Callable[..., str]) -> list[str]:
    return [start_backend("--cost", "zero").removeprefix("http://") for _ in range(2)]


async def complete(url: str, key: str, ask: bool) -> dict[str, str]:
    body = {"model": "kvgate-sim", "prompt": "why here? " * 30, "max_tokens": 2}
    headers = {"authorization": f"Bearer {key}", **({"x-kvgate-explain": "1"} if ask else {})}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}/v1/completions", json=body, headers=headers) as response,
    ):
        assert response.status == 200, await response.text()
        return dict(response.headers)


def logged(log: Path) -> list[dict[str, object]]:
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("path") == "/v1/completions"]


async def test_an_allowed_caller_reads_the_decision_and_the_log_keeps_it(
    endpoints: list[str], start_gateway: Start, tmp_path: Path
) -> None:
    url, _ = start_gateway(policy(endpoints, "{tenants: [ops], match_details: [ops]}"))
    await complete(url, ALLOWED, ask=False)  # the prompt's blocks are now at one endpoint
    headers = await complete(url, ALLOWED, ask=True)
    decision = json.loads(headers["x-kvgate-explain"])
    assert decision["pool"] == "p" and decision["pick"] in endpoints
    assert decision["decided_by"] in decision["weights"]
    first = decision["candidates"][0]
    assert first["endpoint"] == decision["pick"]
    assert set(first["scores"]) == set(decision["weights"])
    total = sum(decision["weights"][n] * s for n, s in first["scores"].items())
    assert first["total"] == pytest.approx(total, abs=1e-3)
    assert decision["prefix"]["matched_tokens"] > 0  # the first request's prefix is there
    assert "x-kvgate-explain" not in await complete(url, OTHER, ask=True)  # not allowed
    assert "x-kvgate-explain" not in await complete(url, ALLOWED, ask=False)
    lines = logged(tmp_path / "gateway-0.log")
    assert [line["explain"] is not None for line in lines] == [False, True, False, False]
    assert lines[1]["explain"] == decision


async def test_a_sampled_share_is_explained_in_the_log_only(
    endpoints: list[str], start_gateway: Start, tmp_path: Path
) -> None:
    url, _ = start_gateway(policy(endpoints, "{sample: 1.0}"))
    headers = await complete(url, OTHER, ask=False)
    assert "x-kvgate-explain" not in headers
    [line] = logged(tmp_path / "gateway-0.log")
    explained = line["explain"]
    assert isinstance(explained, dict) and explained["pick"] == line["endpoint"]


async def test_a_caller_who_may_not_see_others_traffic_gets_no_cache_matches(
    endpoints: list[str], start_gateway: Start, tmp_path: Path
) -> None:
    """The prefix index is every tenant's: what it matched tells whether another tenant sent
    the same prompt. A caller allowed to ask, but not to see matches, gets the decision
    without them (the access log keeps them all)."""
    url, _ = start_gateway(policy(endpoints, "{tenants: ['*'], match_details: [ops]}"))
    await complete(url, ALLOWED, ask=False)  # ops sent this prompt: its blocks are cached
    probe = json.loads((await complete(url, OTHER, ask=True))["x-kvgate-explain"])
    assert "prefix" not in probe and "decided_by" not in probe
    assert set(probe["withheld"]) == {"backlog", "prefix", "session", "spread"}  # the defaults
    for candidate in probe["candidates"]:
        assert "total" not in candidate and not set(candidate["scores"]) & set(probe["withheld"])
    assert [c["endpoint"] for c in probe["candidates"]] == sorted(
        c["endpoint"] for c in probe["candidates"]
    )  # not in the ranking's order
    full = json.loads((await complete(url, ALLOWED, ask=True))["x-kvgate-explain"])
    assert full["prefix"]["matched_tokens"] > 0 and "withheld" not in full
    lines = logged(tmp_path / "gateway-0.log")
    assert lines[1]["explain"]["prefix"]["matched_tokens"] > 0  # type: ignore[index]
