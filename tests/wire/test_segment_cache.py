"""Encoding a rendered chat piece by piece between the tokenizer's added tokens, the pieces
seen before taken from memory, gives the tokenizer's own ids, token for token: a property test
over random conversations, with the vLLM tier's tiny model tokenizer (a byte-level BPE trained
here) and its Llama-3 chat template, and the reference chat template on the same tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer

from kvgate.wire.model_tokenizer import ModelTokenizer
from kvgate.wire.request_tokenizer import make_tokenizer
from kvgate.wire.segment_cache import SegmentedEncoder
from kvgate.wire.tokenizer import continued

pytest.importorskip("transformers")  # the tiny model's tokenizer is saved by transformers

WORDS = ["the", " fox", "gateway", " ünïcödé", "\n", "  ", "\t", "<|eot_id|>", "<|begin_of_text|>"]
WORDS += ["<|start_header_id|>", "tool", " result:", '{"a": 1}', "ok.", "é", "🙂", "x" * 40]
content = st.lists(st.sampled_from(WORDS), max_size=24).map("".join)
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool"]), "content": content}
)
conversation = st.lists(message, min_size=1, max_size=8)


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The tiny model's tokenizer folder, and the same tokenizer without a chat template."""
    from tests.vllm.tiny_model import build_tokenizer

    root = tmp_path_factory.mktemp("tiny")
    build_tokenizer(root)
    plain = tmp_path_factory.mktemp("plain")
    (plain / "tokenizer.json").write_bytes((root / "tokenizer.json").read_bytes())
    config = json.loads((root / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (plain / "tokenizer_config.json").write_text(json.dumps(config))
    return root, plain


def whole(folder: Path, text: str) -> list[int]:
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    ids: list[int] = tokenizer.encode(text, add_special_tokens=False).ids
    return ids


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(turns=st.lists(conversation, min_size=1, max_size=4))
def test_a_growing_conversation_encodes_as_the_whole_text_does(
    folders: tuple[Path, Path], turns: list[list[dict[str, object]]]
) -> None:
    tiny, plain = folders
    model = ModelTokenizer(tiny)
    assert model.segments.segmented
    reference = make_tokenizer(str(plain))
    history: list[dict[str, object]] = []
    for turn in turns:  # each call the conversation so far and a new turn
        history += turn
        text = model.render_chat(history)
        assert model.chat_ids(history) == whole(tiny, text)
        going_on = continued(model.render_chat(history, add_generation_prompt=False), history)
        assert model.chat_ids(history, continue_final=True) == whole(tiny, going_on)
        assert reference.chat_ids(history) == make_tokenizer(str(plain)).chat_ids(history)
    if len(history) > 1:
        assert model.segments.hits > 0  # the earlier turns came from memory


def test_pieces_are_remembered_within_bounds(folders: tuple[Path, Path]) -> None:
    tokenizer = Tokenizer.from_file(str(folders[0] / "tokenizer.json"))
    encoder = SegmentedEncoder(tokenizer, cache_chars=100)
    text = "<|start_header_id|>user<|end_header_id|>" + "the fox " * 10 + "<|eot_id|>"
    assert encoder.encode(text) == tokenizer.encode(text, add_special_tokens=False).ids
    misses = encoder.misses
    assert encoder.encode(text) == tokenizer.encode(text, add_special_tokens=False).ids
    assert encoder.misses == misses and encoder.hits == misses
    encoder.encode("<|eot_id|>" + "gateway " * 20)  # 160 characters: never kept
    assert encoder.encode(text) == tokenizer.encode(text, add_special_tokens=False).ids
    assert encoder.misses == misses + 1  # ... and nothing it held was dropped for it


def test_a_tokenizer_whose_pieces_depend_on_each_other_encodes_whole(
    folders: tuple[Path, Path],
) -> None:
    tokenizer = Tokenizer.from_file(str(folders[0] / "tokenizer.json"))
    tokenizer.add_special_tokens([AddedToken("<|tool|>", lstrip=True, rstrip=True)])
    encoder = SegmentedEncoder(tokenizer)
    assert not encoder.segmented  # the spaces beside <|tool|> belong to it
    text = "the fox  <|tool|>  gateway<|eot_id|>"
    assert encoder.encode(text) == tokenizer.encode(text, add_special_tokens=False).ids
