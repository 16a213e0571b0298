"""Tokenization behind a small interface, and the deterministic chat template.

The default ``ByteTokenizer`` maps each UTF-8 byte to its own id (0-255) and reserves 256 for
end-of-sequence: the same text always yields the same ids and nothing is downloaded. The EPP's
precise prefix mode renders and tokenizes requests with these same functions.
"""

from __future__ import annotations

import codecs
from collections.abc import Mapping, Sequence
from typing import Protocol


class Tokenizer(Protocol):
    """Text to token ids and back; what the backend serves with and the EPP tokenizes with."""

    eos_token_id: int
    vocab_size: int

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; deterministic."""
        ...

    def decoder(self) -> IncrementalDecoder:
        """A fresh streaming decoder (handles characters split across tokens)."""
        ...


class IncrementalDecoder(Protocol):
    def decode(self, token_ids: Sequence[int], final: bool = False) -> str: ...


class ByteTokenizer:
    eos_token_id = 256
    vocab_size = 257

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.decoder().decode(token_ids, final=True)

    def decoder(self) -> ByteDecoder:
        return ByteDecoder()

    def printable_ids(self) -> list[int]:
        """Ids the simulated runner draws from: lowercase letters and spaces, like words."""
        return list(b"abcdefghijklmnopqrstuvwxyz     etaoinshr")


class ByteDecoder:
    def __init__(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def decode(self, token_ids: Sequence[int], final: bool = False) -> str:
        try:
            data = bytes(token_ids)
        except ValueError:  # special tokens (EOS) carry no text
            data = bytes(t for t in token_ids if t < 256)
        return self._utf8.decode(data, final=final)


class ChatTemplateError(ValueError):
    """A chat message that the template cannot render."""


def render_content(content: object, path: str) -> str:
    """Message content as text: a string, or a list of ``{"type": "text", "text": ...}`` parts."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list):
        texts: list[str] = []
        for i, part in enumerate(content):
            if not isinstance(part, Mapping) or part.get("type") != "text":
                raise ChatTemplateError(f"{path}[{i}]: only text content parts are supported")
            text = part.get("text")
            if not isinstance(text, str):
                raise ChatTemplateError(f"{path}[{i}].text: must be a string")
            texts.append(text)
        return "".join(texts)
    raise ChatTemplateError(f"{path}: must be a string or a list of content parts")


def render_chat(
    messages: Sequence[Mapping[str, object]], add_generation_prompt: bool = True
) -> str:
    """Render every message the same way every time (ChatML-style markers)."""
    parts: list[str] = []
    for i, message in enumerate(messages):
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise ChatTemplateError(f"messages[{i}].role: must be a non-empty string")
        text = render_content(message.get("content"), f"messages[{i}].content")
        parts.append(f"<|im_start|>{role}\n{text}<|im_end|>\n")
    if add_generation_prompt:
        parts.append("<|im_start|>assistant\n")
    return "".join(parts)


def continued(rendered: str, messages: Sequence[Mapping[str, object]]) -> str:
    """``rendered`` (a chat rendered without a generation prompt) cut after the final
    message's content, so the model goes on with that message: vLLM's
    ``continue_final_message``, as transformers applies it (a template may trim the content:
    it is found stripped, and kept with its trailing space where the template kept that).
    ``ChatTemplateError`` when the template left the content out."""
    if not messages:
        raise ChatTemplateError("continue_final_message needs a final message to continue")
    final = render_content(messages[-1].get("content"), f"messages[{len(messages) - 1}].content")
    at = rendered.rfind(final.strip())
    if at < 0:
        raise ChatTemplateError("the chat template does not render the final message's content")
    kept = final.lstrip()
    if rendered[at : at + len(kept)] == kept:
        return rendered[: at + len(kept)]
    return rendered[: at + len(final.strip())]
