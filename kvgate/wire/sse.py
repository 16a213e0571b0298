"""Relay an upstream SSE stream event by event: read usage, drop the usage chunk the gateway
injected (when the client did not ask for it), and notice ``[DONE]`` (a Responses API stream:
its terminal event, and the response's id; a Messages API stream: ``message_stop``).

An engine that fails mid-stream says so in the stream itself: vLLM with a ``data:`` event
whose object is an ``error`` (then ``[DONE]``), Anthropic's API and the Responses API with an
``error`` event. Such an event is not forwarded: the relay notes the engine's message
(``failed``) and forwards nothing after it, and the caller treats the stream as broken (it
goes on elsewhere, or ends with the gateway's own error event).

Only complete events (ending in a blank line) are forwarded; a partial event waits for the rest,
up to ``MAX_EVENT_BYTES``: an upstream that sends more without ending an event (not SSE, or
broken) fails the stream (``EventTooLarge``) instead of growing the gateway's memory without
bound. Each chunk is searched for the event's end where it arrives, so a long event costs time
in proportion to its size, not to its size squared.
"""

from __future__ import annotations

import re

import orjson
from mypy_extensions import mypyc_attr

from kvgate.wire.messages_api import error_event as messages_error_event
from kvgate.wire.openai_errors import responses_error_event, sse_error_event
from kvgate.wire.responses_api import TERMINAL_EVENTS

_USAGE = b'"usage"'
_TOKEN_IDS = b'token_ids"'
# a vLLM return_token_ids field, matched where ``_TOKEN_IDS`` was found
_TOKEN_ID_FIELD = re.compile(rb'"(?:prompt_)?token_ids"\s*:\s*(?:\[[^\]]*\]|null)')
_SPACE = b" \t\r\n"
_DONE = b"[DONE]"
_RESPONSE = b'"response"'
_ERROR = b'"error"'
_MESSAGE_STOP = b'"message_stop"'
MAX_EVENT_BYTES = 16 << 20  # of one event still waiting for its end


# mypyc cannot compile a subclass of a builtin exception into a native class: a plain one.
@mypyc_attr(native_class=False)
class EventTooLarge(ValueError):
    """The upstream sent more than ``MAX_EVENT_BYTES`` without ending an event."""


class SSERelay:
    """Forwards complete SSE events, notes usage and ``[DONE]``, drops the injected usage chunk."""

    def __init__(
        self,
        *,
        strip_usage: bool,
        record: bool = False,
        strip_token_ids: bool = False,
        strip_counts: bool = False,
    ) -> None:
        """``record``: keep the events forwarded (``recorded``), as a stream that may have to
        be continued elsewhere needs; ``strip_token_ids``: drop vLLM's ``token_ids`` and
        ``prompt_token_ids`` fields, ``strip_counts`` the usage of chunks that carry choices
        (vLLM's ``continuous_usage_stats``), asked for by the gateway, not the client, from
        what is forwarded, not from what is recorded. The usage last seen is ``usage``."""
        self.strip_usage = strip_usage
        self.strip_counts = strip_counts
        self.usage: dict[str, object] | None = None
        self.saw_done = False  # the stream's end: [DONE] (a response's terminal event)
        self.response_id = ""  # a Responses API stream's response id
        self.recorded: list[bytes] | None = [] if record else None
        self.strip_token_ids = strip_token_ids
        self.failed = ""  # the engine's in-band error, once one came (nothing goes out after it)
        self._buffer = bytearray()  # the start of an event whose end has not come yet
        self._cr = False  # a chunk ended in CR: it may be the first half of a CRLF

    def feed(self, chunk: bytes) -> bytes:
        """The bytes to forward after ``chunk`` arrived (possibly empty); ``EventTooLarge``
        when the event waiting for its end has grown past ``MAX_EVENT_BYTES``."""
        complete = self._complete(chunk)
        if not complete:
            return b""
        first = self._first_mark(complete)
        if first < 0:
            out = complete
        else:  # the events before the first that may matter are passed on unread
            cut = -1 if self.failed else complete.rfind(b"\n\n", 0, first)
            start = cut + 2 if cut >= 0 else 0
            head, rest = complete[:start], complete[start:]
            kept = [event for event in rest.split(b"\n\n") if event and self._keep(event)]
            out = head + b"".join(event + b"\n\n" for event in kept)
        recorded = self.recorded
        if recorded is not None and out:
            recorded.append(out)
            if self.strip_token_ids and _TOKEN_IDS in out:
                out = without_token_ids(out)
            if self.strip_counts and _USAGE in out:
                out = without_chunk_usage(out)
        return out

    def _complete(self, chunk: bytes) -> bytes:
        """The complete events the stream holds after ``chunk`` arrived (possibly none)."""
        if self._cr:
            chunk, self._cr = b"\r" + chunk, False
        # perf: find, not ``in``: ``bytes in bytes`` first tries the needle as an integer, and
        # raises and clears a TypeError inside CPython each time
        if chunk.find(b"\r") >= 0:
            if chunk.endswith(b"\r"):
                chunk, self._cr = chunk[:-1], True
            chunk = chunk.replace(b"\r\n", b"\n")
        buffer = self._buffer
        if buffer:
            # the buffer holds no blank line: one can only end in what just came
            start = len(buffer) - 1
            buffer += chunk
            end = buffer.rfind(b"\n\n", start)
            if end < 0:
                self._check_size()
                return b""
            complete, self._buffer = bytes(buffer[: end + 2]), buffer[end + 2 :]
        else:
            end = chunk.rfind(b"\n\n")
            if end < 0:
                buffer += chunk
                self._check_size()
                return b""
            complete, rest = chunk[: end + 2], chunk[end + 2 :]
            if rest:
                buffer += rest
        self._check_size()
        return complete

    def _check_size(self) -> None:
        if len(self._buffer) > MAX_EVENT_BYTES:
            raise EventTooLarge(
                f"upstream sent over {MAX_EVENT_BYTES >> 20} MiB without ending an SSE event"
            )

    @property
    def pending(self) -> bytes:
        """An incomplete trailing event (the upstream ended mid-event)."""
        return bytes(self._buffer) + (b"\r" if self._cr else b"")

    def error_event(self, message: str, code: str) -> bytes:
        """The event that tells the client its stream failed midway."""
        return sse_error_event(message, code=code).encode()

    def _first_mark(self, events: bytes) -> int:
        """Where the first of what the relay reads (usage, ``[DONE]``, an error) is in
        ``events``; -1 where none is: they are forwarded as they are, unread."""
        return _first_of(events, (_USAGE, _DONE, _ERROR))

    def _keep(self, event: bytes) -> bool:
        if self.failed:
            return False
        payload = _data_of(event)
        if payload is None:
            return True
        if payload == _DONE:
            self.saw_done = True
            return True
        has_error = payload.find(_ERROR) >= 0
        if _USAGE not in payload and not has_error:
            return True
        try:
            parsed = orjson.loads(payload)
        except ValueError:
            return True
        if has_error and isinstance(parsed, dict):
            message = error_message(parsed)
            if message:
                self.failed = message
                return False
        if isinstance(parsed, dict) and isinstance(parsed.get("usage"), dict):
            self.usage = parsed["usage"]
            if self.strip_usage and not parsed.get("choices"):
                return False
        return True


class ResponsesRelay(SSERelay):
    """A Responses API stream (``event:`` names, no ``[DONE]``): its end is a terminal event
    (``response.completed``, ``.incomplete``, ``.failed``) or an ``error`` event; usage and the
    response id come from the events' ``response`` objects. Nothing is dropped."""

    def __init__(self) -> None:
        super().__init__(strip_usage=False)

    def error_event(self, message: str, code: str) -> bytes:
        return responses_error_event(message, code).encode()

    def _first_mark(self, events: bytes) -> int:
        return _first_of(events, (_RESPONSE, _ERROR))

    def _keep(self, event: bytes) -> bool:
        if self.failed:
            return False
        parsed = event_object(event)
        if parsed is None:
            return True
        kind, response = parsed.get("type"), parsed.get("response")
        if kind == "error":
            self.failed = error_message(parsed) or "the upstream sent an error event"
            return False
        if isinstance(response, dict):
            if not self.response_id and isinstance(response.get("id"), str):
                self.response_id = response["id"]
            if kind in TERMINAL_EVENTS:
                self.saw_done = True
                if isinstance(response.get("usage"), dict):
                    self.usage = response["usage"]
        return True


class MessagesRelay(SSERelay):
    """An Anthropic Messages stream (``event:`` names, no ``[DONE]``): its end is
    ``message_stop``; an ``error`` event is a failure. Its usage is known at its final
    ``message_delta`` (the output tokens, and with vLLM the input's again), over what
    ``message_start`` said: a stream cut before it has no usage (``message_start``'s output
    is 0, not the answer's). Nothing else is dropped."""

    def __init__(self) -> None:
        super().__init__(strip_usage=False)
        self._started: dict[str, object] = {}  # message_start's usage

    def error_event(self, message: str, code: str) -> bytes:
        return messages_error_event(message).encode()

    def _first_mark(self, events: bytes) -> int:
        return _first_of(events, (_USAGE, _MESSAGE_STOP, _ERROR))

    def _keep(self, event: bytes) -> bool:
        if self.failed:
            return False
        parsed = event_object(event)
        if parsed is None:
            return True
        kind = parsed.get("type")
        if kind == "message_stop":
            self.saw_done = True
        elif kind == "error":
            self.failed = error_message(parsed) or "the upstream sent an error event"
            return False
        elif kind == "message_start":
            message = parsed.get("message")
            usage = message.get("usage") if isinstance(message, dict) else None
            if isinstance(usage, dict):
                self._started = usage
        elif kind == "message_delta":
            usage = parsed.get("usage")
            if isinstance(usage, dict):
                self.usage = {**self._started, **usage}
        return True


def error_message(event: dict[str, object]) -> str:
    """The message of an in-band error event ("" when ``event`` is not one): vLLM's
    ``{"error": {"message": ...}}`` (or its older ``{"object": "error", "message": ...}``),
    Anthropic's and the Responses API's ``{"type": "error", "error": {...}}``."""
    error = event.get("error")
    if isinstance(error, dict):
        message = error.get("message")
        return message if isinstance(message, str) and message else "the upstream failed"
    if isinstance(error, str) and error:
        return error
    if event.get("object") == "error" or event.get("type") == "error":
        message = event.get("message")
        return message if isinstance(message, str) and message else "the upstream failed"
    return ""


def usage_of(body: bytes) -> dict[str, object] | None:
    """The ``usage`` object of a JSON response body; None when there is none.

    Only the object after the last ``"usage"`` key is parsed (servers put usage near the end;
    parsing a whole body builds every choice and message just to drop them), its end found by
    counting braces; if that slice is not a JSON object, the whole body is parsed instead.
    """
    at = body.rfind(_USAGE)
    if at < 0:
        return None
    start = body.find(b"{", at)
    if start < 0 or body[at + len(_USAGE) : start].strip() != b":":
        return _usage_of_whole(body)  # "usage": null, or not a key followed by an object
    end = _object_end(body, start)
    if end > 0:
        try:
            usage = orjson.loads(body[start:end])
        except ValueError:
            usage = None
        if isinstance(usage, dict):
            return usage
    return _usage_of_whole(body)


def _usage_of_whole(body: bytes) -> dict[str, object] | None:
    try:
        parsed = orjson.loads(body)
    except ValueError:
        return None
    usage = parsed.get("usage") if isinstance(parsed, dict) else None
    return usage if isinstance(usage, dict) else None


def _object_end(data: bytes, start: int) -> int:
    """The index after the ``}`` that closes the ``{`` at ``start`` (-1 if none), counting
    braces only: right for usage objects, which hold numbers and nested objects. Counting
    starts inside the object, so a flat one costs one search for each brace."""
    depth, index = 1, start + 1
    while True:
        close = data.find(b"}", index)
        if close < 0:
            return -1
        opening = data.find(b"{", index, close)
        if opening >= 0:
            depth += 1
            index = opening + 1
            continue
        depth -= 1
        index = close + 1
        if depth == 0:
            return index


def event_object(event: bytes) -> dict[str, object] | None:
    """An event's data as a JSON object (None when it has no data, or data of another kind)."""
    payload = _data_of(event)
    if payload is None:
        return None
    try:
        parsed = orjson.loads(payload)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def _first_of(events: bytes, marks: tuple[bytes, ...]) -> int:
    """The first position of any of ``marks`` in ``events``; -1 where none is."""
    first = -1
    for mark in marks:
        found = events.find(mark)
        if found >= 0 and (first < 0 or found < first):
            first = found
    return first


def _data_of(event: bytes) -> bytes | None:
    lines = [line[5:].lstrip(b" ") for line in event.split(b"\n") if line.startswith(b"data:")]
    return b"\n".join(lines) if lines else None


def without_chunk_usage(events: bytes) -> bytes:
    """``events`` without the ``usage`` of chunks that carry choices (a usage chunk of its
    own stays): the per-chunk counts of vLLM's ``continuous_usage_stats``."""
    out: list[bytes] = []
    for event in events.split(b"\n\n"):
        if not event:
            continue
        data = event_object(event) if event.find(_USAGE) >= 0 else None
        if data is not None and data.get("choices") and "usage" in data:
            del data["usage"]
            event = b"data: " + orjson.dumps(data)
        out.append(event + b"\n\n")
    return b"".join(out)


def without_token_ids(events: bytes) -> bytes:
    """``events`` without vLLM's ``token_ids`` / ``prompt_token_ids`` fields, each with the
    comma that joins it to its object (a key inside a string is escaped, ``\\"token_ids\\"``,
    and never matches)."""
    # perf: found with bytes.find and matched only there; one regex over every event cost 5 µs
    at = events.find(_TOKEN_IDS)
    if at < 0:
        return events
    parts: list[bytes] = []
    kept = 0
    while at >= 0:
        key = at - 1 if events[at - 1 : at] == b'"' else at - 8
        found = _TOKEN_ID_FIELD.match(events, key) if key >= 0 else None
        if found is None:
            at = events.find(_TOKEN_IDS, at + 1)
            continue
        start, end = found.span()
        before = start
        while before > 0 and events[before - 1] in _SPACE:
            before -= 1
        if events[before - 1 : before] == b",":
            start = before - 1
        else:
            after = end
            while after < len(events) and events[after] in _SPACE:
                after += 1
            if events[after : after + 1] == b",":
                end = after + 1
                while end < len(events) and events[end] in _SPACE:
                    end += 1
        parts.append(events[kept:start])
        kept = end
        at = events.find(_TOKEN_IDS, end)
    parts.append(events[kept:])
    return b"".join(parts)
