"""Which conversation or agent session a request belongs to: what clients and agents send
(Claude Code's header, ``prompt_cache_key``, ``x-session-id``, ``session_id``, Anthropic's
``metadata.user_id``, ``user``), else its first turn; bounded, and the caller's tenant's own."""

from __future__ import annotations

import pytest

from epp.framework import SchedulingRequest
from epp.requestcontrol.pick_exchange import SiblingPick
from epp.scheduling.scorers.session_affinity import SessionAffinityScorer
from epp.scheduling.session_key import MAX_VALUE, session_key
from tests.epp.builders import make_endpoint

SYSTEM = {"role": "system", "content": "You are terse."}
FIRST = {"role": "user", "content": "What is a KV cache?"}
REPLY = {"role": "assistant", "content": "Saved attention keys and values."}
SECOND = {"role": "user", "content": "And a prefix cache?"}


@pytest.mark.parametrize(
    ("body", "headers", "expected"),
    [
        ({"prompt_cache_key": "k", "user": "ann"}, {"x-claude-code-session-id": "cc"}, "id:cc"),
        ({"prompt_cache_key": "k", "session_id": "b"}, {"x-session-id": "s-1"}, "cache:k"),
        ({"session_id": "b", "metadata": {"user_id": "u"}}, {"x-session-id": "s-1"}, "id:s-1"),
        ({"session_id": "b", "metadata": {"user_id": "u"}, "user": "ann"}, {}, "id:b"),
        ({"metadata": {"user_id": "u"}, "user": "ann"}, {}, "user:u"),
        ({"messages": [FIRST], "user": "ann"}, {"x-session-id": "s-1"}, "id:s-1"),
        ({"messages": [FIRST], "user": "ann"}, {}, "user:ann"),
        (
            {"prompt_cache_key": 3, "session_id": ["x"], "metadata": "m", "user": "ann"},
            {},
            "user:ann",
        ),
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


def test_a_long_value_is_kept_as_its_hash_and_a_tenant_keeps_its_own_sessions() -> None:
    long = "s" * (MAX_VALUE + 1)
    key = session_key({}, {"x-session-id": long})
    assert (
        key is not None and len(key) < 64 and key != session_key({}, {"x-session-id": long + "t"})
    )
    assert session_key({}, {"x-session-id": "s" * MAX_VALUE}) == "id:" + "s" * MAX_VALUE
    ours, theirs = (session_key({}, {"x-session-id": "s-1"}, tenant) for tenant in ("a", "b"))
    assert ours is not None and theirs is not None and ours != theirs


def test_a_session_goes_where_it_went_until_its_endpoint_is_saturated() -> None:
    scorer = SessionAffinityScorer.from_config("s", {})
    a, b = make_endpoint("10.0.0.1:8000"), make_endpoint("10.0.0.2:8000")
    call = SchedulingRequest("1", "m", "", headers={"x-claude-code-session-id": "agent-7"})
    scorer.on_pick(call, b)
    later = SchedulingRequest("2", "m", "", headers={"x-claude-code-session-id": "agent-7"})
    assert scorer.score(later, [a, b]) == {a.address: 0.0, b.address: 1.0}
    hot = make_endpoint("10.0.0.2:8000", queue=10)  # its queue past the saturation threshold
    again = SchedulingRequest("3", "m", "", headers={"x-claude-code-session-id": "agent-7"})
    assert scorer.score(again, [a, hot]) == {a.address: 0.0, hot.address: 0.0}


def test_a_session_stands_in_for_the_prefix_index_never_on_top_of_it() -> None:
    scorer = SessionAffinityScorer.from_config("s", {})
    a, b = make_endpoint("10.0.0.1:8000"), make_endpoint("10.0.0.2:8000")
    headers = {"x-session-id": "chat-1"}
    scorer.on_pick(SchedulingRequest("1", "m", "", headers=headers), b)
    known = SchedulingRequest("2", "m", "", headers=headers)
    known.prefix_match.update({a.address: 4, b.address: 30})  # its history, at b
    assert scorer.score(known, [a, b]) == {a.address: 0.0, b.address: 0.0}
    forgotten = SchedulingRequest("3", "m", "", headers=headers)
    forgotten.prefix_match.update({a.address: 4, b.address: 4})  # the system prompt, at both
    assert scorer.score(forgotten, [a, b]) == {a.address: 0.0, b.address: 1.0}


def test_a_tenant_cannot_steer_by_another_tenants_session_id() -> None:
    scorer = SessionAffinityScorer.from_config("s", {})
    a, b = make_endpoint("10.0.0.1:8000"), make_endpoint("10.0.0.2:8000")
    headers = {"x-session-id": "shared-name"}
    scorer.on_pick(SchedulingRequest("1", "m", "", headers=headers, tenant="acme"), b)
    probe = SchedulingRequest("2", "m", "", headers=headers, tenant="mallory")
    assert scorer.score(probe, [a, b]) == {a.address: 0.0, b.address: 0.0}


def test_a_siblings_pick_carries_its_session_and_an_older_one_none() -> None:
    pick = SiblingPick("10.0.0.2:8000", 5, None, [(1, [2, 3])], "id:agent-7")
    assert SiblingPick.unpack(pick.encode()) == pick
    older = SiblingPick.decode(["10.0.0.2:8000", 5, None, [(1, [2, 3])]])
    assert older.session == "" and older.keys == [(1, [2, 3])]


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
