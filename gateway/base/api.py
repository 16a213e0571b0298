"""Which API a request speaks, decided once, from its path, when it is parsed: the ``Api``
record says per API what the request path would otherwise work out again from the path (how
its stream is read and ended, where its output limit goes, whether it can be resumed, kept by
the response cache, stored by the engine, and how its errors are shaped)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvgate.wire.messages_api import MESSAGES_PATH, chat_messages
from kvgate.wire.responses_api import RESPONSES_PATH, input_messages
from kvgate.wire.sse import MessagesRelay, ResponsesRelay, SSERelay

Body = dict[str, object]


def _as_is(body: Body) -> Body:
    return body


def _response_input(body: Body) -> Body:
    return {**body, "messages": input_messages(body)}


def _message_blocks(body: Body) -> Body:
    return {**body, "messages": chat_messages(body)}


@dataclass(frozen=True, slots=True)
class Api:
    """What the gateway knows of one API it proxies."""

    path: str
    streams: bool = True  # the endpoint can stream its answer
    chat: bool = False  # a chat's messages (a stream's choices are deltas)
    usage_on_request: bool = False  # its streams report usage only when stream_options asks
    resumable: bool = False  # a broken stream can go on from another endpoint
    output_field: str | None = "max_tokens"  # where an output limit goes (None: no output)
    cacheable: bool = True  # the response cache may keep its answers
    deterministic: bool = False  # every answer to the same body is the same (embeddings)
    stored: bool = False  # the engine stores what it creates (the Responses API)
    anthropic_errors: bool = False  # its errors are Anthropic's shape, not OpenAI's
    routed: Callable[[Body], Body] = _as_is  # the body as the picker reads it (chat messages)

    def relay(self, strip_usage: bool) -> SSERelay:
        """How a stream of this API is read and ended (not one that may be resumed)."""
        if self.stored:
            return ResponsesRelay()
        if self.anthropic_errors:
            return MessagesRelay()
        return SSERelay(strip_usage=strip_usage)


CHAT = Api("/v1/chat/completions", chat=True, usage_on_request=True, resumable=True)
COMPLETIONS = Api("/v1/completions", usage_on_request=True, resumable=True)
EMBEDDINGS = Api("/v1/embeddings", streams=False, output_field=None, deterministic=True)
RESPONSES = Api(
    RESPONSES_PATH,
    output_field="max_output_tokens",
    cacheable=False,
    stored=True,
    routed=_response_input,
)
MESSAGES = Api(MESSAGES_PATH, anthropic_errors=True, routed=_message_blocks)
# a path the policy passes through (multipart forms, audio): nothing is read from its answer
PASSTHROUGH = Api("", streams=False, output_field=None, cacheable=False)

APIS = {api.path: api for api in (CHAT, COMPLETIONS, EMBEDDINGS, RESPONSES, MESSAGES)}


def api_of(path: str) -> Api:
    """The API of a proxied path (a passthrough path's for any other)."""
    return APIS.get(path, PASSTHROUGH)
