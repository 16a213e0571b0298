"""How a broken stream goes on: what it had sent the client (``Progress``, parsed from the events
``SSERelay(record=True)`` kept; nothing is parsed unless the stream breaks), the request that
continues it elsewhere (``continuation``), and that request's stream rewritten into the first
one's (``ContinuationRelay``). ``gateway.request.stream_resume`` runs it.

The continuation goes on:

- from token ids, where the engines return them (vLLM's ``return_token_ids``, which the gateway
  asks for and strips again unless the client asked): a completion whose prompt is the prompt's
  ids and the ids generated so far, so nothing is tokenized again and a greedy answer joins up
  token for token with an uninterrupted one;
- else from text: a chat request ends with the assistant message so far and
  ``continue_final_message`` (no new generation prompt), as vLLM takes it; a completion's
  prompt is its prompt and the text so far. The gateway then asks the engines for vLLM's
  ``continuous_usage_stats`` (stripped again from what the client gets): each chunk's count of
  the tokens so far, since an event may carry several tokens (stream intervals, speculative
  decoding), so the tokens generated are the engine's count, not the events'.

``max_tokens`` (and ``min_tokens``) shrink by what was generated. A stream that broke after its
last token only gets its missing end (``ending``). Not resumable (``resumable``): several
choices (``n`` > 1), tool calls, log-probabilities, structured output (a grammar's state cannot
be carried over), a completion of several prompts or of token ids, anything but chat and
completions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import orjson

from gateway.base.api import CHAT, COMPLETIONS, Api
from kvgate.wire.sse import SSERelay, error_message, event_object

# sampling fields a continuation keeps (the rest of a chat body is the chat's own)
SAMPLING = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "include_stop_str_in_output",
    "priority",
    "cache_salt",
    "user",
)
# what a continuation cannot carry over
UNRESUMABLE = frozenset(
    {
        "tools",
        "functions",
        "response_format",
        "guided_json",
        "guided_regex",
        "guided_choice",
        "guided_grammar",
        "structured_outputs",
        "best_of",
        "echo",
        "suffix",
    }
)
_DONE = b"data: [DONE]\n\n"


def resumable(api: Api, body: Mapping[str, object]) -> bool:
    """Whether a stream of ``body`` in ``api`` can be continued elsewhere if it breaks."""
    if not api.resumable or body.get("n") not in (None, 1):
        return False
    if body.get("logprobs") or body.get("top_logprobs") or body.get("prompt_logprobs"):
        return False
    if not api.chat and not isinstance(body.get("prompt"), str):
        return False
    return UNRESUMABLE.isdisjoint(body) or not any(body.get(name) for name in UNRESUMABLE)


@dataclass
class Progress:
    """What a stream has sent the client so far (its one choice)."""

    chat: bool
    id: str = ""
    created: int = 0
    model: str = ""
    text: str = ""
    events: int = 0  # content events: a lower bound of the tokens, where nothing says more
    token_ids: list[int] | None = None  # what was generated, where the engine said
    prompt_token_ids: list[int] | None = None
    prompt_tokens: int | None = None  # the engine's counts, where its chunks carry usage
    completion_tokens: int | None = None  # ... of the whole answer so far
    finish_reason: str | None = None
    resumable: bool = True
    extras: dict[str, object] = field(default_factory=dict)

    @classmethod
    def of(cls, chat: bool, recorded: list[bytes]) -> Progress:
        """From the events a stream forwarded (their ``data:`` JSON)."""
        progress = cls(chat)
        for batch in recorded:
            for event in batch.split(b"\n\n"):
                chunk = event_object(event)
                if chunk is not None:
                    progress.learn(chunk)
        return progress

    @property
    def generated(self) -> int:
        """Output tokens so far: the ids, else the engine's count, else the events."""
        if self.token_ids is not None:
            return len(self.token_ids)
        return self.completion_tokens if self.completion_tokens is not None else self.events

    @property
    def started(self) -> bool:
        return bool(self.id)

    def learn(self, chunk: Mapping[str, object]) -> None:
        """One chunk of the stream, in its own (chat or completion) shape."""
        if not self.id:
            self.id = str(chunk.get("id", ""))
            created = chunk.get("created")
            self.created = created if isinstance(created, int) else 0
            self.model = str(chunk.get("model", ""))
        prompt_ids = chunk.get("prompt_token_ids")
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            if self.prompt_tokens is None:
                self.prompt_tokens = _count(usage.get("prompt_tokens"))
            self.completion_tokens = _count(usage.get("completion_tokens"))
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            return
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            if choice.get("index", 0) != 0:
                self.resumable = False
                continue
            prompt_ids = choice.get("prompt_token_ids", prompt_ids)
            self.learn_choice(choice)
        if isinstance(prompt_ids, list) and self.prompt_token_ids is None:
            self.prompt_token_ids = [int(t) for t in prompt_ids]

    def learn_choice(self, choice: Mapping[str, object]) -> None:
        """The first choice's part of one chunk (its shape: ``chat``'s)."""
        delta = choice.get("delta") if self.chat else choice
        if not isinstance(delta, dict):
            return
        if delta.get("tool_calls") or delta.get("function_call"):
            self.resumable = False
        text = delta.get("content" if self.chat else "text")
        if isinstance(text, str) and text:
            self.text += text
            self.events += 1
        ids = choice.get("token_ids")
        if isinstance(ids, list):
            self.token_ids = (self.token_ids or []) + [int(t) for t in ids]
        reason = choice.get("finish_reason")
        if isinstance(reason, str):
            self.finish_reason = reason


def continuation(
    body: Mapping[str, object], progress: Progress, token_ids: bool
) -> tuple[str, dict[str, object]]:
    """The request that goes on from ``progress`` (path and body: a completion of the token
    ids so far, else the stream's own API from its text); ``token_ids``: ask the engine for
    its ids, so that a later break can go on from them too."""
    generated = progress.generated
    limits: dict[str, int] = {}
    for key in ("max_tokens", "max_completion_tokens", "min_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            limits[key] = max(1 if key != "min_tokens" else 0, value - generated)
    options: dict[str, object] = {"include_usage": True}
    stream: dict[str, object] = {"stream": True, "stream_options": options}
    if token_ids:
        stream["return_token_ids"] = True
    else:
        options["continuous_usage_stats"] = True
    if progress.prompt_token_ids is not None and progress.token_ids is not None:
        kept = {k: body[k] for k in SAMPLING if k in body}
        if "max_completion_tokens" in limits:
            limits["max_tokens"] = limits.pop("max_completion_tokens")
        ids = progress.prompt_token_ids + progress.token_ids
        return COMPLETIONS.path, {"model": body["model"], "prompt": ids, **kept, **limits, **stream}
    if progress.chat:
        messages = list(body["messages"])  # type: ignore[call-overload]
        messages.append({"role": "assistant", "content": progress.text})
        extra = {"continue_final_message": True, "add_generation_prompt": False}
        return CHAT.path, {**body, "messages": messages, **extra, **limits, **stream}
    prompt = str(body["prompt"]) + progress.text
    return COMPLETIONS.path, {**body, "prompt": prompt, **limits, **stream}


def ending(progress: Progress, client_wants_usage: bool) -> bytes | None:
    """The missing end of a stream whose answer was complete when it broke (its usage, where
    the ids tell it and the client asked, and ``[DONE]``); None if it was not complete."""
    if progress.finish_reason is None:
        return None
    usage = whole_usage(progress, None)
    if client_wants_usage and usage is not None:
        return _event(_usage_chunk(progress, usage)) + _DONE
    return _DONE


def whole_usage(
    progress: Progress, last: Mapping[str, object] | None, before: int = 0
) -> dict[str, object] | None:
    """The usage of the whole answer: the first stream's prompt and everything generated; from
    the ids where known, else from ``last``, a continuation's usage whose prompt held the
    ``before`` tokens generated before it (the first stream's prompt as its engine counted it,
    where its chunks said), else from the engines' counts so far."""
    if progress.prompt_token_ids is not None and progress.token_ids is not None:
        prompt, completion = len(progress.prompt_token_ids), len(progress.token_ids)
    elif last is not None:
        reported = progress.prompt_tokens
        prompt = max(0, _int(last.get("prompt_tokens")) - before) if reported is None else reported
        completion = before + _int(last.get("completion_tokens"))
    elif progress.prompt_tokens is not None and progress.completion_tokens is not None:
        prompt, completion = progress.prompt_tokens, progress.completion_tokens
    else:
        return None
    usage: dict[str, object] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    details = last.get("prompt_tokens_details") if last is not None else None
    if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
        usage["prompt_tokens_details"] = {"cached_tokens": min(prompt, details["cached_tokens"])}
    return usage


class ContinuationRelay(SSERelay):
    """A continuation's stream, rewritten into the first stream's shape as it is relayed: its
    id, creation time and model; chat deltas where the first stream was a chat (a token-id
    continuation is a completion); no second opening chunk; one usage, of the whole answer
    (sent if the client asked); token ids only if the client asked. What it relays is added to
    ``progress``, so that a later break goes on from there."""

    def __init__(self, progress: Progress, *, client_wants_usage: bool, client_ids: bool) -> None:
        super().__init__(strip_usage=not client_wants_usage)
        self.progress = progress
        self.client_ids = client_ids
        self.before = progress.generated  # tokens generated before this continuation

    def feed(self, chunk: bytes) -> bytes:
        complete = self._complete(chunk)
        if not complete:
            return b""
        out: list[bytes] = []
        for event in complete.split(b"\n\n"):
            if not event or self.failed:
                continue
            if event.strip() == _DONE.strip():
                self.saw_done = True
                out.append(_DONE)
                continue
            data = event_object(event)
            if data is None:
                continue
            self.failed = error_message(data)
            if self.failed:
                continue
            rewritten = self._rewrite(data)
            if rewritten is not None:
                out.append(_event(rewritten))
        return b"".join(out)

    def _rewrite(self, data: dict[str, object]) -> dict[str, object] | None:
        progress = self.progress
        choices = data.get("choices")
        usage = data.get("usage")
        if choices and isinstance(usage, dict):  # the engine's count so far
            progress.completion_tokens = self.before + _int(usage.get("completion_tokens"))
        if not choices:
            if isinstance(usage, dict):
                self.usage = whole_usage(progress, usage, self.before)
                if not self.strip_usage and self.usage is not None:
                    return _usage_chunk(progress, self.usage)
            return None
        if not isinstance(choices, list) or not isinstance(choices[0], dict):
            return None
        choice = choices[0]
        delta = choice.get("delta")
        text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
        text = text if isinstance(text, str) else ""
        ids = choice.get("token_ids")
        reason = choice.get("finish_reason")
        learned = {"delta": {"content": text}} if progress.chat else {"text": text}
        progress.learn_choice({**learned, "token_ids": ids, "finish_reason": reason})
        shown_ids = self.client_ids and isinstance(ids, list) and bool(ids)
        if not text and reason is None and not shown_ids:
            return None  # an opening chunk (the role), or tokens with no text of their own yet
        shaped: dict[str, object] = {"index": 0, "logprobs": None, "finish_reason": reason}
        if progress.chat:
            shaped["delta"] = {"content": text}
        else:
            shaped["text"] = text
        if shown_ids:
            shaped["token_ids"] = ids
        return {**_head(progress), "choices": [shaped]}


def _head(progress: Progress) -> dict[str, object]:
    kind = "chat.completion.chunk" if progress.chat else "text_completion"
    return {"id": progress.id, "object": kind, "created": progress.created, "model": progress.model}


def _usage_chunk(progress: Progress, usage: dict[str, object]) -> dict[str, object]:
    return {**_head(progress), "choices": [], "usage": usage}


def _event(data: Mapping[str, object]) -> bytes:
    return b"data: " + orjson.dumps(data) + b"\n\n"


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
