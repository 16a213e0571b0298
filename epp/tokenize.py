"""Tokenize a request the way the model server does, for precise prefix routing.

``tokenizer: byte`` (the default): kvgate's reference backend's byte tokenizer and chat
template. ``tokenizer: PATH``: the model's own folder (``tokenizer.json``,
``tokenizer_config.json``, ``chat_template.jinja``; a path to the ``tokenizer.json`` itself
works too), applied as vLLM applies it (``kvgate.wire.model_tokenizer``): completion prompts
with the model's special tokens (BOS), chat requests through its chat template. A folder
without a chat template renders chat with the reference template.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from kvgate.wire.model_tokenizer import ModelTokenizer
from kvgate.wire.tokenizer import ByteTokenizer, ChatTemplateError, render_chat


class RequestTokenizer(Protocol):
    """Token ids of what a request asks the model server to compute."""

    def prompt_ids(self, text: str) -> list[int]:
        """A completion prompt's ids."""
        ...

    def chat_ids(self, messages: Sequence[Mapping[str, object]]) -> list[int]:
        """A chat request's ids; ``ChatTemplateError`` when it cannot be rendered."""
        ...


class ReferenceTokenizer:
    """kvgate's reference backend: bytes, and its ChatML-style template."""

    def __init__(self) -> None:
        self._bytes = ByteTokenizer()

    def prompt_ids(self, text: str) -> list[int]:
        return self._bytes.encode(text)

    def chat_ids(self, messages: Sequence[Mapping[str, object]]) -> list[int]:
        return self._bytes.encode(render_chat(messages))


class _ModelWithReferenceChat:
    """A model's tokenizer whose folder has no chat template: the reference template."""

    def __init__(self, model: ModelTokenizer) -> None:
        self._model = model

    def prompt_ids(self, text: str) -> list[int]:
        return self._model.prompt_ids(text)

    def chat_ids(self, messages: Sequence[Mapping[str, object]]) -> list[int]:
        return self._model.encode(render_chat(messages), add_special_tokens=False)


def make_tokenizer(tokenizer: str) -> RequestTokenizer:
    """``byte``, or a model folder (or its ``tokenizer.json``); ``ValueError`` if unusable."""
    if tokenizer == "byte":
        return ReferenceTokenizer()
    model = ModelTokenizer(tokenizer)
    return model if model.has_chat_template else _ModelWithReferenceChat(model)


def request_token_ids(body: Mapping[str, object], tokenizer: RequestTokenizer) -> list[int]:
    """The prompt's token ids: chat messages, a prompt string, or given token ids (a chat the
    template cannot render has none)."""
    messages = body.get("messages")
    if isinstance(messages, list):
        try:
            return tokenizer.chat_ids([m for m in messages if isinstance(m, Mapping)])
        except ChatTemplateError:
            return []
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return tokenizer.prompt_ids(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return [t for t in prompt if isinstance(t, int)]
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        return tokenizer.prompt_ids(prompt[0])
    return []
