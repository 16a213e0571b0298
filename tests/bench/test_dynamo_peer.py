"""Dynamo as a peer of ``make bench-routing`` sees the token ids the engines cache: the model
folder it is given tokenizes and renders chat exactly as the reference backend does, and the
relay worker turns an engine's streamed answer into Dynamo's outputs without losing its end."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jinja2
import pytest
from tokenizers import Tokenizer

from bench.dynamo_peer import write_model_folder
from bench.dynamo_worker import Answer, completion_body
from kvgate.wire.request_tokenizer import ReferenceTokenizer

TEXTS = ["plain words", "  spaces\nand\ttabs  ", "é ü 漢字 🙂", "<|im_start|>user\n<|im_end|>"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model_folder(tmp_path_factory.mktemp("model"), 4096)


@pytest.mark.parametrize("text", TEXTS)
def test_the_folder_s_tokenizer_is_the_reference_backend_s(folder: Path, text: str) -> None:
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    ids = tokenizer.encode(text, add_special_tokens=True).ids
    assert ids == ReferenceTokenizer().prompt_ids(text)
    assert tokenizer.decode(ids) == text
    assert tokenizer.token_to_id("<|endoftext|>") == ReferenceTokenizer().eos_token_ids[0]


def test_the_folder_s_chat_template_renders_as_the_reference_backend_does(folder: Path) -> None:
    config = json.loads((folder / "tokenizer_config.json").read_text())
    messages = [{"role": "system", "content": TEXTS[2]}, {"role": "user", "content": TEXTS[1]}]
    rendered = jinja2.Template(config["chat_template"]).render(
        messages=messages, add_generation_prompt=True
    )
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    assert tokenizer.encode(rendered).ids == ReferenceTokenizer().chat_ids(messages)


def test_a_preprocessed_request_becomes_a_token_id_completion() -> None:
    request = {
        "token_ids": [1, 2, 3],
        "stop_conditions": {"max_tokens": 32, "ignore_eos": True},
        "sampling_options": {"temperature": 0.0, "seed": None},
    }
    body = completion_body(request, "m")
    assert body["prompt"] == [1, 2, 3]
    assert (body["max_tokens"], body["ignore_eos"], body["temperature"]) == (32, True, 0.0)
    assert body["stream"] and body["return_token_ids"] and "seed" not in body


def test_an_answer_ends_once_with_its_finish_reason_and_usage() -> None:
    answer = Answer()
    usage = {
        "prompt_tokens": 3,
        "completion_tokens": 2,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    events: list[dict[str, Any]] = [
        {"choices": [{"token_ids": [7]}]},
        {"choices": [{"token_ids": [8], "finish_reason": "length"}]},
        {"choices": [], "usage": usage},
    ]
    outputs = [out for event in events for out in answer.outputs(event)]
    assert outputs == [
        {"token_ids": [7]},
        {"token_ids": [8]},
        {"token_ids": [], "finish_reason": "length", "completion_usage": usage},
    ]
    assert answer.ended
