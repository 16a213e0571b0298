"""The routing decision a caller reads: in full for callers who may see other tenants'
traffic, without what the shared index says for the others; ``pick`` where it was sent."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.base.context import RequestContext
from gateway.base.identity import Identity
from gateway.request.explain import HEADER, REPLY, record_destination, record_explanation
from gateway.routing.embedded_epp import EmbeddedEpp
from gateway.routing.endpoint_picker import PickRequest, endpoint_states
from policies.explain_section import Explain
from policies.loader import load_policy_text

POLICY = load_policy_text("""
pools: {p: {endpoints: [127.0.0.1:1, 127.0.0.1:2]}}
routes: [{model: m, pool: p}]
""")
EXPLAIN = Explain(tenants=("*",), match_details=("ops",))


def explained(tenant: str) -> tuple[RequestContext, dict[str, Any]]:
    picker = EmbeddedEpp(POLICY, endpoint_states(POLICY))
    ctx = RequestContext("r", "/v1/completions")
    ctx.identity, ctx.explain = Identity(tenant), REPLY
    pick = PickRequest("m", {"model": "m", "prompt": "a prompt " * 40}, {}, ctx.identity)
    record_explanation(ctx, "p", picker.rank("p", pick), EXPLAIN)
    assert ctx.extra_headers is not None
    return ctx, orjson.loads(ctx.extra_headers[HEADER])


def test_a_caller_who_may_see_matches_reads_the_whole_decision() -> None:
    ctx, replied = explained("ops")
    assert replied == ctx.explanation
    assert "prefix" in replied and "decided_by" in replied and "withheld" not in replied


def test_another_caller_reads_it_without_what_the_shared_index_says() -> None:
    ctx, replied = explained("app")
    assert ctx.explanation is not None and "prefix" in ctx.explanation  # the log keeps it all
    withheld = set(replied["withheld"])
    assert {"prefix", "spread", "backlog", "session"} == withheld
    assert "prefix" not in replied and "decided_by" not in replied
    for candidate in replied["candidates"]:
        assert "total" not in candidate and not set(candidate["scores"]) & withheld


def test_the_pick_is_where_the_request_was_sent() -> None:
    ctx, replied = explained("ops")
    first = replied["pick"]
    other = "127.0.0.1:2" if first == "127.0.0.1:1" else "127.0.0.1:1"
    record_destination(ctx, other)  # the first choice's breaker was open
    assert ctx.explanation is not None and ctx.extra_headers is not None
    assert (ctx.explanation["pick"], ctx.explanation["first_choice"]) == (other, first)
    header = orjson.loads(ctx.extra_headers[HEADER])
    assert (header["pick"], header["first_choice"]) == (other, first)
