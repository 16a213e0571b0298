"""A model folder's tokenizer and chat template, applied as a model server applies them
(checked against vLLM's own /tokenize by the vLLM tier, tests/vllm)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

from epp.datalayer.tokenize import make_tokenizer, request_token_ids
from kvgate.wire.model_tokenizer import ModelTokenizer
from kvgate.wire.tokenizer import ChatTemplateError

SPECIAL = ["<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"]
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


def model_folder(root: Path, template: str | None = TEMPLATE) -> Path:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 20, trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", 0)]
    )
    root.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(root / "tokenizer.json"))
    config = {"bos_token": {"content": "<|begin_of_text|>"}, "eos_token": "<|eot_id|>"}
    (root / "tokenizer_config.json").write_text(json.dumps(config))
    if template is not None:
        (root / "chat_template.jinja").write_text(template)
    return root


def test_prompts_get_bos_and_chats_get_it_once_from_the_template(tmp_path: Path) -> None:
    model = ModelTokenizer(model_folder(tmp_path / "m"))
    prompt = model.prompt_ids("the lazy dog")
    assert prompt[0] == 0 and prompt[1:] == model.encode("the lazy dog", add_special_tokens=False)
    messages: list[dict[str, object]] = [
        {"role": "system", "content": "  be brief "},
        {
            "role": "user",
            "content": [{"type": "text", "text": "the"}, {"type": "text", "text": "fox"}],
        },
    ]
    rendered = model.render_chat(messages)
    assert rendered == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nbe brief<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nthe\nfox<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    ids = model.chat_ids(messages)
    assert ids.count(0) == 1 and ids[0] == 0  # BOS once, written by the template
    assert request_token_ids({"messages": messages}, model) == ids
    assert request_token_ids({"prompt": "the lazy dog"}, model) == prompt
    assert request_token_ids({"prompt": [5, 6, 7]}, model) == [5, 6, 7]


def test_a_folder_without_a_template_and_bad_folders(tmp_path: Path) -> None:
    folder = model_folder(tmp_path / "plain", template=None)
    plain = make_tokenizer(str(folder / "tokenizer.json"))  # the file's path works too
    assert plain.chat_ids([{"role": "user", "content": "the fox"}])  # the reference template
    with pytest.raises(ChatTemplateError):
        ModelTokenizer(folder).render_chat([{"role": "user", "content": "x"}])
    with pytest.raises(ValueError, match="cannot load tokenizer"):
        ModelTokenizer(tmp_path)
    raising = model_folder(tmp_path / "raising", "{{ raise_exception('no system role') }}")
    with pytest.raises(ChatTemplateError, match="no system role"):
        ModelTokenizer(raising).chat_ids([{"role": "system", "content": "x"}])


def test_continue_final_message_cuts_the_template_after_the_final_content(tmp_path: Path) -> None:
    """As vLLM: rendered without a generation prompt, cut after the last message's content."""
    model = ModelTokenizer(model_folder(tmp_path / "m"))
    messages = [{"role": "user", "content": "the fox"}, {"role": "assistant", "content": "the"}]
    ids = model.chat_ids(messages, continue_final=True)
    rendered = model.render_chat(messages, add_generation_prompt=False)
    assert rendered.endswith("assistant<|end_header_id|>\n\nthe<|eot_id|>")
    assert ids == model.encode(rendered.removesuffix("<|eot_id|>"), add_special_tokens=False)
    assert request_token_ids({"messages": messages, "continue_final_message": True}, model) == ids
    assert request_token_ids({"messages": messages}, model) == model.chat_ids(messages)
    with pytest.raises(ChatTemplateError, match="does not render"):
        ModelTokenizer(model_folder(tmp_path / "silent", "{{ bos_token }}")).chat_ids(
            messages, continue_final=True
        )
