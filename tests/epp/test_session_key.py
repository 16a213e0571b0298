"""Which conversation a request belongs to: header, ``user`` field, or its first turn."""

from __future__ import annotations

import pytest

from epp.framework import SchedulingRequest
from epp.scheduling.scorers.session_affinity import SessionAffinityScorer
from epp.scheduling.session_key import session_key
from tests.epp.builders import make_endpoint

SYSTEM = {"role": "system", "content": "You are terse."}
FIRST = {"role": "user", "content": "What is a KV cache?"}
REPLY = {"role": "assistant", "content": "Saved attention keys and values."}
SECOND = {"role": "user", "content": "And a prefix cache?"}


@pytest.mark.parametrize(
    ("body", "headers", "expected"),
    [
        ({"messages": [FIRST], "user": "ann"}, {"x-session-id": "s-1"}, "id:s-1"),
        ({"messages": [FIRST], "user": "ann"}, {}, "user:ann"),
        ({"prompt": "hello", "user": "ann"}, {}, "user:ann"),
        ({"prompt": "hello"}, {}, None),
        ({"messages": [SYSTEM]}, {}, None),  # no user turn yet
        ({"messages": "not a list"}, {}, None),
        ({"messages": [FIRST], "user": ""}, {"x-session-id": ""}, "turn:"),
    ],
)
def test_session_sources_in_order(
    body: dict[str, object], headers: dict[str, str], expected: str | None
) -> None:
    key = session_key(body, headers)
    if expected == "turn:":
        assert key is not None and key.startswith("turn:")
    else:
        assert key == expected


def test_every_turn_of_a_conversation_has_its_first_turns_session() -> None:
    first = session_key({"messages": [SYSTEM, FIRST]}, {})
    later = session_key({"messages": [SYSTEM, FIRST, REPLY, SECOND]}, {})
    assert first is not None and first == later
    other_system = {"role": "system", "content": "You are verbose."}
    assert session_key({"messages": [other_system, FIRST]}, {}) != first
    assert session_key({"messages": [SYSTEM, SECOND]}, {}) != first


def test_the_scorer_sends_a_later_turn_where_the_first_went() -> None:
    scorer = SessionAffinityScorer.from_config("s", {})
    a, b = make_endpoint("10.0.0.1:8000"), make_endpoint("10.0.0.2:8000")
    turn_one = SchedulingRequest("1", "m", "", body={"messages": [SYSTEM, FIRST]})
    scorer.score(turn_one, [a, b])
    scorer.on_pick(turn_one, b)
    turn_two = SchedulingRequest("2", "m", "", body={"messages": [SYSTEM, FIRST, REPLY, SECOND]})
    assert scorer.score(turn_two, [a, b]) == {a.address: 0.0, b.address: 1.0}
    stranger = SchedulingRequest("3", "m", "", body={"messages": [SECOND]})
    assert scorer.score(stranger, [a, b]) == {a.address: 0.0, b.address: 0.0}
