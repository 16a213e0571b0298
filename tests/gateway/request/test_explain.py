"""The routing decision a caller reads: in full for callers who may see other tenants'
traffic, without what the shared index says for the others; ``pick`` where it was sent."""

from __future__ import annotations

import orjson

from gateway.base.identity import Identity
from gateway.request.explain import REPLY, explained, sent_elsewhere
from gateway.routing.embedded_epp import EmbeddedEpp
from gateway.routing.endpoint_picker import PickRequest, endpoint_states
from policies.explain_section import Explain
from policies.loader import load_policy_text

POLICY = load_policy_text("""
pools: {p: {endpoints: [127.0.0.1:1, 127.0.0.1:2]}}
routes: [{model: m, pool: p}]
""")
EXPLAIN = Explain(tenants=("*",), match_details=("ops",))


def explained_to(tenant: str) -> tuple[dict[str, object], str]:
    """The decision, in full, and the header a caller of ``tenant`` reads."""
    picker = EmbeddedEpp(POLICY, endpoint_states(POLICY))
    pick = PickRequest("m", {"model": "m", "prompt": "a prompt " * 40}, {}, Identity(tenant))
    decided, header = explained("p", picker.rank("p", pick), EXPLAIN, tenant, REPLY)
    assert header is not None
    return decided, header


def test_a_caller_who_may_see_matches_reads_the_whole_decision() -> None:
    decided, header = explained_to("ops")
    replied = orjson.loads(header)
    assert replied == decided
    assert "prefix" in replied and "decided_by" in replied and "withheld" not in replied


def test_another_caller_reads_it_without_what_the_shared_index_says() -> None:
    decided, header = explained_to("app")
    replied = orjson.loads(header)
    assert "prefix" in decided  # the log keeps it all
    withheld = set(replied["withheld"])
    assert {"prefix", "spread", "backlog", "session"} == withheld
    assert "prefix" not in replied and "decided_by" not in replied
    for candidate in replied["candidates"]:
        assert "total" not in candidate and not set(candidate["scores"]) & withheld


def test_the_pick_is_where_the_request_was_sent() -> None:
    decided, header = explained_to("ops")
    first = decided["pick"]
    assert sent_elsewhere(decided, header, str(first)) is None  # it went where it was picked
    other = "127.0.0.1:2" if first == "127.0.0.1:1" else "127.0.0.1:1"
    moved = sent_elsewhere(decided, header, other)  # the first choice's breaker was open
    assert moved is not None and moved[1] is not None
    assert (moved[0]["pick"], moved[0]["first_choice"]) == (other, first)
    replied = orjson.loads(moved[1])
    assert (replied["pick"], replied["first_choice"]) == (other, first)
    assert decided["pick"] == first  # the decision as it was made is not changed
