"""A model's own tokenizer and chat template, applied as the model server applies them.

A model folder holds ``tokenizer.json`` (the ``tokenizers`` library's format, with its
post-processor: how BOS is added), ``tokenizer_config.json`` (special tokens, and the chat
template unless ``chat_template.jinja`` holds it). As vLLM does with transformers:

- a completion prompt is encoded *with* special tokens (the post-processor adds BOS);
- a chat request is rendered by the jinja2 template (sandboxed, ``trim_blocks`` and
  ``lstrip_blocks``, ``raise_exception``, ``strftime_now``, a ``tojson`` that keeps non-ASCII)
  with ``add_generation_prompt`` and the special tokens as variables, then encoded *without*
  special tokens (the template writes BOS itself), piece by piece between the template's
  special tokens, so a conversation's earlier turns are not encoded again
  (``kvgate.wire.segment_cache``).

Text content parts of a message are joined with newlines, as vLLM's "string" content format
does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from kvgate.wire.segment_cache import SegmentedEncoder
from kvgate.wire.tokenizer import ChatTemplateError, continued

SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token")


class ModelTokenizer:
    """Tokenizes prompts and chat requests as a model server with this model folder does."""

    def __init__(self, folder: str | Path) -> None:
        """Raises ``ValueError`` when the folder has no usable ``tokenizer.json``, or the
        ``tokenizers`` / ``jinja2`` packages are missing."""
        root = Path(folder)
        if root.is_file():  # a tokenizer.json path: its folder holds the rest
            root = root.parent
        try:
            from tokenizers import Tokenizer
        except ImportError as exc:  # pragma: no cover - a core dependency
            raise ValueError("a model tokenizer needs the 'tokenizers' package") from exc
        path = root / "tokenizer.json"
        try:
            self._tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises its own Exception type for a bad file
            raise ValueError(f"cannot load tokenizer {str(path)!r}: {exc}") from exc
        self.segments = SegmentedEncoder(self._tokenizer)
        config = _read_json(root / "tokenizer_config.json")
        self.special = {
            name: _token_text(config.get(name)) for name in SPECIAL_TOKENS if config.get(name)
        }
        template = _template_text(root, config)
        self._template = _compile(template) if template else None
        self.vocab_size: int = self._tokenizer.get_vocab_size(with_added_tokens=True)
        eos = self._tokenizer.token_to_id(self.special.get("eos_token", ""))
        self.eos_token_ids: tuple[int, ...] = () if eos is None else (eos,)

    @property
    def has_chat_template(self) -> bool:
        return self._template is not None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """``text``'s ids; without special tokens (a rendered chat), piece by piece between the
        added tokens, the pieces seen before taken from memory (``SegmentedEncoder``)."""
        if not add_special_tokens:
            return self.segments.encode(text)
        ids: list[int] = self._tokenizer.encode(text, add_special_tokens=True).ids
        return ids

    def render_chat(
        self, messages: Sequence[Mapping[str, object]], add_generation_prompt: bool = True
    ) -> str:
        """The chat rendered by the model's template; ``ChatTemplateError`` when the folder has
        none or a message cannot be rendered."""
        if self._template is None:
            raise ChatTemplateError("the model folder has no chat template")
        conversation = [_text_message(m, i) for i, m in enumerate(messages)]
        try:
            rendered: str = self._template.render(
                messages=conversation,
                add_generation_prompt=add_generation_prompt,
                tools=None,
                documents=None,
                **self.special,
            )
        except ChatTemplateError:
            raise
        except Exception as exc:  # jinja2's errors, and what the template raises
            raise ChatTemplateError(f"the chat template failed: {exc}") from exc
        return rendered

    def decode(self, token_ids: Sequence[int]) -> str:
        """The text of ``token_ids``, special tokens skipped (as vLLM's default)."""
        text: str = self._tokenizer.decode(list(token_ids), skip_special_tokens=True)
        return text

    def decoder(self) -> StreamDecoder:
        return StreamDecoder(self._tokenizer)

    def prompt_ids(self, text: str) -> list[int]:
        """A completion prompt's ids (with the special tokens the model adds, e.g. BOS)."""
        return self.encode(text, add_special_tokens=True)

    def chat_ids(
        self, messages: Sequence[Mapping[str, object]], continue_final: bool = False
    ) -> list[int]:
        """A chat request's ids: the rendered template, encoded without special tokens;
        ``continue_final``: without a generation prompt, cut after the final message's content
        (vLLM's ``continue_final_message``)."""
        text = self.render_chat(messages, not continue_final)
        if continue_final:
            text = continued(text, messages)
        return self.encode(text, add_special_tokens=False)


class StreamDecoder:
    """Incremental detokenization (the ``tokenizers`` library's ``DecodeStream``): a byte-level
    character split across tokens comes out once complete."""

    def __init__(self, tokenizer: Any) -> None:
        from tokenizers.decoders import DecodeStream

        self._tokenizer = tokenizer
        self._stream = DecodeStream(skip_special_tokens=True)

    def decode(self, token_ids: Sequence[int], final: bool = False) -> str:
        parts = []
        for token in token_ids:
            piece = self._stream.step(self._tokenizer, token)
            if piece:
                parts.append(piece)
        return "".join(parts)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _token_text(value: object) -> str:
    if isinstance(value, Mapping):  # {"content": "<s>", ...}, as older configs write it
        content = value.get("content")
        return content if isinstance(content, str) else ""
    return value if isinstance(value, str) else ""


def _template_text(root: Path, config: Mapping[str, Any]) -> str | None:
    jinja = root / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
        template = named.get("default")
    return template if isinstance(template, str) else None


def _text_message(message: Mapping[str, object], index: int) -> dict[str, object]:
    content = message.get("content")
    if isinstance(content, list):
        texts = []
        for i, part in enumerate(content):
            if not isinstance(part, Mapping) or part.get("type") != "text":
                raise ChatTemplateError(
                    f"messages[{index}].content[{i}]: only text content parts are supported"
                )
            texts.append(str(part.get("text", "")))
        content = "\n".join(texts)
    return {**message, "content": content}


def _raise(message: str) -> None:
    raise ChatTemplateError(message)


def _tojson(
    value: object,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _compile(template: str) -> Any:
    """The template compiled the way transformers compiles chat templates."""
    try:
        from jinja2 import ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError as exc:  # pragma: no cover - a core dependency
        raise ValueError("a model chat template needs the 'jinja2' package") from exc
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)
