"""Relay an upstream SSE stream event by event: read usage, drop the usage chunk the gateway
injected (when the client did not ask for it), and notice ``[DONE]`` (a Responses API stream:
its terminal event, and the response's id; a Messages API stream: ``message_stop``).

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
        self, *, strip_usage: bool, record: bool = False, strip_token_ids: bool = False
    ) -> None:
        """``record``: keep the events forwarded (``recorded``), as a stream that may have to
        be continued elsewhere needs; ``strip_token_ids``: drop vLLM's ``token_ids`` and
        ``prompt_token_ids`` fields (asked for by the gateway, not the client) from what is
        forwarded, not from what is recorded."""
        self.strip_usage = strip_usage
        self.usage: dict[str, object] | None = None
        self.saw_done = False  # the stream's end: [DONE] (a response's terminal event)
        self.response_id = ""  # a Responses API stream's response id
        self.recorded: list[bytes] | None = [] if record else None
        self.strip_token_ids = strip_token_ids
        self._buffer = bytearray()  # the start of an event whose end has not come yet
        self._cr = False  # a chunk ended in CR: it may be the first half of a CRLF

    def feed(self, chunk: bytes) -> bytes:
        """The bytes to forward after ``chunk`` arrived (possibly empty); ``EventTooLarge``
        when the event waiting for its end has grown past ``MAX_EVENT_BYTES``."""
        complete = self._complete(chunk)
        if not complete:
            return b""
        if self._plain(complete):
            out = complete
        else:
            kept = [event for event in complete.split(b"\n\n") if event and self._keep(event)]
            out = b"".join(event + b"\n\n" for event in kept)
        recorded = self.recorded
        if recorded is not None and out:
            recorded.append(out)
            if self.strip_token_ids and _TOKEN_IDS in out:
                out = without_token_ids(out)
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

    def _plain(self, events: bytes) -> bool:
        """Whether ``events`` are forwarded as they are, unread."""
        return _USAGE not in events and _DONE not in events

    def _keep(self, event: bytes) -> bool:
        payload = _data_of(event)
        if payload is None:
            return True
        if payload == _DONE:
            self.saw_done = True
            return True
        if _USAGE not in payload:
            return True
        try:
            parsed = orjson.loads(payload)
        except ValueError:
            return True
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

    def _plain(self, events: bytes) -> bool:
        return _RESPONSE not in events and _ERROR not in events

    def _keep(self, event: bytes) -> bool:
        parsed = event_object(event)
        if parsed is None:
            return True
        kind, response = parsed.get("type"), parsed.get("response")
        if kind == "error":
            self.saw_done = True  # the upstream's own account of the failure
        elif isinstance(response, dict):
            if not self.response_id and isinstance(response.get("id"), str):
                self.response_id = response["id"]
            if kind in TERMINAL_EVENTS:
                self.saw_done = True
                if isinstance(response.get("usage"), dict):
                    self.usage = response["usage"]
        return True


class MessagesRelay(SSERelay):
    """An Anthropic Messages stream (``event:`` names, no ``[DONE]``): its end is
    ``message_stop`` or an ``error`` event; its usage is ``message_start``'s message's, updated
    by each ``message_delta``'s (the output tokens, and with vLLM the input's again). Nothing is
    dropped."""

    def __init__(self) -> None:
        super().__init__(strip_usage=False)

    def error_event(self, message: str, code: str) -> bytes:
        return messages_error_event(message).encode()

    def _plain(self, events: bytes) -> bool:
        return _USAGE not in events and _MESSAGE_STOP not in events and _ERROR not in events

    def _keep(self, event: bytes) -> bool:
        parsed = event_object(event)
        if parsed is None:
            return True
        kind = parsed.get("type")
        if kind in ("message_stop", "error"):
            self.saw_done = True
            return True
        if kind == "message_start":
            message = parsed.get("message")
            usage = message.get("usage") if isinstance(message, dict) else None
        else:
            usage = parsed.get("usage") if kind == "message_delta" else None
        if isinstance(usage, dict):
            self.usage = {**(self.usage or {}), **usage}
        return True


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


def _data_of(event: bytes) -> bytes | None:
    lines = [line[5:].lstrip(b" ") for line in event.split(b"\n") if line.startswith(b"data:")]
    return b"\n".join(lines) if lines else None


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
