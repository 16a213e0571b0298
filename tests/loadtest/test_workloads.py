"""The load tester's workload generators: seeded (the same seed, the same requests) and of the
shapes their options say."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from pathlib import Path

import pytest

from loadtest.workloads.agentic import AgentShape, agentic
from loadtest.workloads.chats import multi_turn, shared_prefix
from loadtest.workloads.lora_mix import with_adapters, zipf_weights
from loadtest.workloads.sharegpt import DatasetError, load_sharegpt
from loadtest.workloads.synthetic import long_context, random_lengths


def test_shared_prefix_is_seeded_and_shuffled() -> None:
    first, again, other = (
        shared_prefix(4, 3, 200, 1),
        shared_prefix(4, 3, 200, 1),
        shared_prefix(4, 3, 200, 2),
    )
    assert first == again
    assert first != other
    assert len(first) == 12 and all(len(chain) == 1 for chain in first)
    groups = [chain[0].group for chain in first]
    assert Counter(groups) == {f"app-{g}": 3 for g in range(4)}
    assert groups != sorted(groups)  # shuffled, not grouped
    systems = {chain[0].messages[0]["content"] for chain in first}
    assert len(systems) == 4 and all(len(s) >= 200 for s in systems)


def test_multi_turn_resends_the_growing_history() -> None:
    chains = multi_turn(2, 3, 100, 20, 5)
    assert [len(c) for c in chains] == [3, 3]
    first, second, third = chains[0]
    assert second.messages[: len(first.messages)] == first.messages
    assert third.messages[: len(second.messages)] == second.messages
    assert [m["role"] for m in third.messages] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
    ]
    assert first.headers["x-session-id"] == first.group


def test_random_lengths_stay_in_their_range() -> None:
    chains = random_lengths(200, 100, 40, 0.5, 3)
    assert chains == random_lengths(200, 100, 40, 0.5, 3)
    sizes = [len(c[0].messages[0]["content"]) for c in chains]
    outputs = [c[0].max_tokens for c in chains]
    assert min(sizes) >= 50 and max(sizes) <= 150 + len("request 3-199: ")
    assert all(o is not None and 20 <= o <= 60 for o in outputs)
    assert len(set(outputs)) > 10  # they do vary
    with pytest.raises(ValueError, match="range ratio"):
        random_lengths(1, 10, 10, 1.0, 0)


def test_long_context_documents_are_the_shared_prefix() -> None:
    chains = long_context(3, 4, 2000, 0, chars_per_token=2)
    assert len(chains) == 12
    by_group: dict[str, set[str]] = {}
    for chain in chains:
        document = chain[0].messages[1]["content"].split("\n\nquestion")[0]
        by_group.setdefault(chain[0].group, set()).add(document)
    assert len(by_group) == 3
    assert all(len(docs) == 1 and len(next(iter(docs))) >= 4000 for docs in by_group.values())


def _dataset(tmp_path: Path, entries: object) -> Path:
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(entries))
    return path


def test_sharegpt_first_turns_with_vllms_filter(tmp_path: Path) -> None:
    entries = [
        {
            "conversations": [
                {"from": "human", "value": "a" * 40},
                {"from": "gpt", "value": "b" * 80},
            ]
        },
        {
            "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "b" * 80}]
        },  # prompt < 4 tokens
        {
            "conversations": [
                {"from": "human", "value": "a" * 5000},
                {"from": "gpt", "value": "b" * 80},
            ]
        },  # > 1024
        {"conversations": [{"from": "gpt", "value": "only a reply"}]},
        {
            "conversations": [
                {"from": "human", "value": "c" * 40},
                {"from": "gpt", "value": "d" * 40},
                {"from": "human", "value": "e" * 40},
                {"from": "gpt", "value": "f" * 40},
            ]
        },
    ]
    path = _dataset(tmp_path, entries)
    first = load_sharegpt(path, None, 0, "first", chars_per_token=4)
    assert sorted(len(c) for c in first) == [1, 1]
    assert {c[0].max_tokens for c in first} == {20, 10}
    whole = load_sharegpt(path, None, 0, "all", chars_per_token=4)
    long_one = next(c for c in whole if len(c) == 2)
    assert [m["role"] for m in long_one[1].messages] == ["user", "assistant", "user"]
    assert load_sharegpt(path, 1, 0) == load_sharegpt(path, 1, 0)
    assert len(load_sharegpt(path, 1, 0)) == 1


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ({"not": "a list"}, "a JSON list"),
        ([{"x": 1}], "entry 0"),
        ([{"conversations": [{"from": "human"}]}], "turn 0"),
    ],
)
def test_sharegpt_says_what_is_wrong(tmp_path: Path, entries: object, message: str) -> None:
    with pytest.raises(DatasetError, match=message):
        load_sharegpt(_dataset(tmp_path, entries), None, 0)


def test_sharegpt_file_that_is_not_json(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text("[{")
    with pytest.raises(DatasetError, match=r"broken\.json"):
        load_sharegpt(path, None, 0)


def test_lora_mix_is_zipf_and_keeps_a_conversation_on_one_adapter() -> None:
    assert zipf_weights(3, 1.0) == pytest.approx([6 / 11, 3 / 11, 2 / 11])
    chains = with_adapters(shared_prefix(4, 250, 20, 0), ["a", "b", "c"], 1.0, 7)
    counts = Counter(c[0].model for c in chains)
    assert counts["a"] > counts["b"] > counts["c"] > 0
    assert counts["a"] / len(chains) == pytest.approx(6 / 11, abs=0.05)
    sessions = with_adapters(multi_turn(20, 3, 50, 10, 0), ["x", "y"], 1.0, 1)
    assert all(len({r.model for r in chain}) == 1 for chain in sessions)
    assert sessions[0][0].body("base", 8)["model"] == sessions[0][0].model
    with pytest.raises(ValueError, match="at least one adapter"):
        with_adapters(chains, [], 1.0, 0)


def test_lora_mix_by_group_keeps_a_system_prompt_on_one_adapter() -> None:
    adapters = [f"a{i}" for i in range(8)]
    chains = with_adapters(shared_prefix(40, 5, 20, 0), adapters, 1.0, 3, by_group=True)
    by_group: dict[str, set[str | None]] = {}
    for chain in chains:
        for request in chain:
            by_group.setdefault(request.group, set()).add(request.model)
    assert len(by_group) == 40
    assert all(len(models) == 1 for models in by_group.values())
    assert len({m for models in by_group.values() for m in models}) > 2  # still a mix


def test_custom_jsonl_round_trips_and_keeps_order(tmp_path: Path) -> None:
    from loadtest.workloads.custom_jsonl import load_custom, write_custom

    chains = shared_prefix(2, 3, 50, 0)
    path = tmp_path / "w.jsonl"
    write_custom(chains, path, output_tokens=7)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0] == {
        "prompt": "\n".join(m["content"] for m in chains[0][0].messages),
        "output_tokens": 7,
    }
    loaded = load_custom(path)
    assert [c[0].messages[0]["content"] for c in loaded] == [line["prompt"] for line in lines]
    assert {c[0].max_tokens for c in loaded} == {7}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"prompt": 3}', r"w\.jsonl:1: expected an object"),
        ('\n{"prompt": "a", "output_tokens": 0}', r":2: 'output_tokens'"),
        ("{", r":1: "),
    ],
)
def test_custom_jsonl_says_which_line_is_wrong(tmp_path: Path, text: str, message: str) -> None:
    from loadtest.workloads.custom_jsonl import load_custom

    path = tmp_path / "w.jsonl"
    path.write_text(text)
    with pytest.raises(DatasetError, match=message):
        load_custom(path)


def test_shared_prefix_question_length() -> None:
    (chain,) = shared_prefix(1, 1, 100, 0, question_chars=300)
    question = chain[0].messages[1]["content"]
    assert len(question) == len("question 0: ") + 300


def test_sessions_over_shared_system_prompts_share_only_those() -> None:
    chains = multi_turn(12, 3, 100, 20, 5, systems=3)
    systems = {chain[0].messages[0]["content"] for chain in chains}
    assert len(systems) == 3  # each session under one of three prompts
    assert len({chain[0].headers["x-session-id"] for chain in chains}) == 12
    assert multi_turn(12, 3, 100, 20, 5, systems=3) == chains  # seeded
    assert multi_turn(2, 3, 100, 20, 5) == multi_turn(2, 3, 100, 20, 5, systems=0)


def test_agent_sessions_append_tool_results_after_a_pause() -> None:
    shape = AgentShape(agents=2, system_chars=900, min_calls=3, max_calls=6, tool_chars=200)
    chains = agentic(8, shape, 4)
    assert chains == agentic(8, shape, 4) and chains != agentic(8, shape, 5)
    assert all(3 <= len(c) <= 6 for c in chains)
    systems = {c[0].messages[0]["content"] for c in chains}
    assert len(systems) == 2 and all('"name": "read_file"' in s for s in systems)
    for chain in chains:
        assert chain[0].pause == 0 and all(r.pause > 0 for r in chain[1:])
        for before, after in itertools.pairwise(chain):
            assert after.messages[: len(before.messages)] == before.messages
            assert [m["role"] for m in after.messages[len(before.messages) :]] == [
                "assistant",
                "tool",
            ]
        choices = [r.fields["tool_choice"] for r in chain]
        assert choices == ["required"] * (len(chain) - 1) + ["none"]  # the last answers in text
        assert all(r.fields["tools"] for r in chain)
        call = chain[-1].messages[-2]["tool_calls"][0]
        assert chain[-1].messages[-1]["tool_call_id"] == call["id"]
        assert chain[0].headers == {"x-session-id": chain[0].group}
        assert chain[0].body("m", 8)["user"] == chain[0].group
    tools = [len(c[-1].messages[-1]["content"]) for c in chains]
    assert min(tools) < 200 < max(tools)  # drawn around the median, short and long


@pytest.mark.parametrize(
    ("via", "header", "field"),
    [
        ("x-claude-code-session-id", "x-claude-code-session-id", None),
        ("prompt_cache_key", None, "prompt_cache_key"),
        ("user", None, "user"),
        ("none", None, None),
    ],
)
def test_agent_sessions_name_themselves_as_asked(
    via: str, header: str | None, field: str | None
) -> None:
    request = agentic(1, AgentShape(min_calls=1, max_calls=1, session_via=via), 0)[0][0]
    body = request.body("m", 8)
    assert request.headers == ({header: request.group} if header else {})
    assert (body.get(field) if field else None) == (request.group if field else None)
    if via == "none":
        assert "user" not in body and "prompt_cache_key" not in body
    with pytest.raises(ValueError, match="session_via"):
        AgentShape(session_via="cookie")
