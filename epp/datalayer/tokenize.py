"""Tokenize a request the way the model server does, for precise prefix routing.

``tokenizer: byte`` (the default): kvgate's reference backend's byte tokenizer and chat
template. ``tokenizer: PATH``: the model's own folder (``tokenizer.json``,
``tokenizer_config.json``, ``chat_template.jinja``; a path to the ``tokenizer.json`` itself
works too), applied as vLLM applies it (``kvgate.wire.model_tokenizer``): completion prompts
with the model's special tokens (BOS), chat requests through its chat template. A folder
without a chat template renders chat with the reference template.
"""

from __future__ import annotations

from collections.abc import Mapping

from kvgate.wire.request_tokenizer import RequestTokenizer, make_tokenizer
from kvgate.wire.tokenizer import ChatTemplateError

__all__ = ["RequestTokenizer", "make_tokenizer", "request_token_ids"]


def request_token_ids(body: Mapping[str, object], tokenizer: RequestTokenizer) -> list[int]:
    """The prompt's token ids: chat messages, a prompt string, or given token ids (a chat the
    template cannot render has none)."""
    messages = body.get("messages")
    if isinstance(messages, list):
        try:
            chat = [m for m in messages if isinstance(m, Mapping)]
            return tokenizer.chat_ids(chat, body.get("continue_final_message") is True)
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
