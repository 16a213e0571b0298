"""Tokenize a request the way the backend does, for precise prefix routing.

``byte``: the reference backend's byte tokenizer and chat template. A path to an HF
``tokenizer.json`` uses the ``tokenizers`` package (install it to use this mode); chat requests
are then rendered with the reference template too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from kvgate.wire.tokenizer import ByteTokenizer, ChatTemplateError, render_chat

Encoder = Callable[[str], list[int]]


def make_encoder(tokenizer: str) -> Encoder:
    if tokenizer == "byte":
        return ByteTokenizer().encode
    try:
        from tokenizers import Tokenizer
    except ImportError as exc:
        raise ValueError("an HF tokenizer.json needs the 'tokenizers' package") from exc
    try:
        hf = Tokenizer.from_file(tokenizer)
    except Exception as exc:  # tokenizers raises its own Exception type for a bad file
        raise ValueError(f"cannot load tokenizer {tokenizer!r}: {exc}") from exc
    return lambda text: list(hf.encode(text, add_special_tokens=False).ids)


def request_token_ids(body: Mapping[str, object], encode: Encoder) -> list[int]:
    """The prompt's token ids: rendered chat messages, a prompt string, or given token ids."""
    messages = body.get("messages")
    if isinstance(messages, list):
        try:
            return encode(render_chat([m for m in messages if isinstance(m, Mapping)]))
        except ChatTemplateError:
            return []
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return encode(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return [t for t in prompt if isinstance(t, int)]
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        return encode(prompt[0])
    return []
