"""The tokenizer a model server serves with, chosen the same way by the EPP and the backend.

``byte`` (the default): kvgate's reference byte tokenizer and its ChatML-style template. A model
folder (or its ``tokenizer.json``): the model's own tokenizer, applied as vLLM applies it
(``kvgate.wire.model_tokenizer``): completion prompts with the model's special tokens (BOS),
chat requests through its chat template; a folder without a chat template renders chat with the
reference template. Both decode token ids back to text, incrementally for streams.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from kvgate.wire.model_tokenizer import ModelTokenizer
from kvgate.wire.tokenizer import ByteTokenizer, IncrementalDecoder, continued, render_chat


class RequestTokenizer(Protocol):
    """Token ids of what a request asks the model server to compute, and text back."""

    vocab_size: int
    eos_token_ids: tuple[int, ...]

    def prompt_ids(self, text: str) -> list[int]:
        """A completion prompt's ids."""
        ...

    def chat_ids(
        self, messages: Sequence[Mapping[str, object]], continue_final: bool = False
    ) -> list[int]:
        """A chat request's ids, with a generation prompt, or (``continue_final``) going on
        with the final message (vLLM's ``continue_final_message``); ``ChatTemplateError``
        when it cannot be rendered."""
        ...

    def decode(self, token_ids: Sequence[int]) -> str:
        """The text of ``token_ids`` (special tokens carry none)."""
        ...

    def decoder(self) -> IncrementalDecoder:
        """A fresh streaming decoder (characters split across tokens are held back)."""
        ...


class ReferenceTokenizer:
    """kvgate's reference backend: bytes, and its ChatML-style template."""

    def __init__(self) -> None:
        self._bytes = ByteTokenizer()
        self.vocab_size = ByteTokenizer.vocab_size
        self.eos_token_ids: tuple[int, ...] = (ByteTokenizer.eos_token_id,)

    def prompt_ids(self, text: str) -> list[int]:
        return self._bytes.encode(text)

    def chat_ids(
        self, messages: Sequence[Mapping[str, object]], continue_final: bool = False
    ) -> list[int]:
        if continue_final:
            return self._bytes.encode(continued(render_chat(messages, False), messages))
        return self._bytes.encode(render_chat(messages))

    def decode(self, token_ids: Sequence[int]) -> str:
        return self._bytes.decode(token_ids)

    def decoder(self) -> IncrementalDecoder:
        return self._bytes.decoder()

    def printable_ids(self) -> list[int]:
        return self._bytes.printable_ids()


class ModelWithReferenceChat:
    """A model's tokenizer whose folder has no chat template: the reference template."""

    def __init__(self, model: ModelTokenizer) -> None:
        self._model = model
        self.vocab_size = model.vocab_size
        self.eos_token_ids = model.eos_token_ids

    def prompt_ids(self, text: str) -> list[int]:
        return self._model.prompt_ids(text)

    def chat_ids(
        self, messages: Sequence[Mapping[str, object]], continue_final: bool = False
    ) -> list[int]:
        text = render_chat(messages, not continue_final)
        text = continued(text, messages) if continue_final else text
        return self._model.encode(text, add_special_tokens=False)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self._model.decode(token_ids)

    def decoder(self) -> IncrementalDecoder:
        return self._model.decoder()


def make_tokenizer(tokenizer: str) -> RequestTokenizer:
    """``byte``, or a model folder (or its ``tokenizer.json``); ``ValueError`` if unusable."""
    if tokenizer == "byte":
        return ReferenceTokenizer()
    model = ModelTokenizer(tokenizer)
    return model if model.has_chat_template else ModelWithReferenceChat(model)
