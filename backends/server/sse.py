"""Server-sent-event chunks of OpenAI streaming responses, pre-formatted per request."""

from __future__ import annotations

import json

from backends.server.protocol import GenerationRequest
from backends.server.tool_calls import arguments_delta, call_id
from backends.server.tool_calls import finish_reason as answer_reason
from kvgate.wire.openai_errors import sse_error_event

DONE = "data: [DONE]\n\n"


class ChunkFormatter:
    """Formats one request's SSE events; the fixed JSON prefix is built once."""

    def __init__(self, req: GenerationRequest, request_id: str, created: int) -> None:
        model = json.dumps(req.model)
        self.is_chat = req.is_chat
        self.tool = req.tool_call  # each chat choice streams one call of it, not content
        self.request_id = request_id
        self._calling: set[int] = set()  # choices whose call has started
        if req.is_chat:
            ident, kind = f"chatcmpl-{request_id}", "chat.completion.chunk"
        else:
            ident, kind = f"cmpl-{request_id}", "text_completion"
        self.head = (
            f'data: {{"id":"{ident}","object":"{kind}","created":{created},"model":{model},'
            f'"choices":'
        )

    def opening(self, prompt_token_ids: list[int] | None = None) -> str:
        """The chat stream's first chunk (the assistant role, and vLLM's ``prompt_token_ids``
        when asked); empty for completions."""
        if not self.is_chat:
            return ""
        prompt = (
            ""
            if prompt_token_ids is None
            else f',"prompt_token_ids":{json.dumps(prompt_token_ids)}'
        )
        return (
            self.head + '[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,'
            f'"finish_reason":null}}]{prompt}}}\n\n'
        )

    def delta(
        self,
        index: int,
        text: str,
        finish_reason: str | None,
        logprobs: dict[str, object] | None = None,
        token_ids: list[int] | None = None,
        prompt_token_ids: list[int] | None = None,
        usage: dict[str, object] | None = None,
    ) -> str:
        """One choice's chunk; ``logprobs`` and vLLM's ``token_ids`` of the delta when asked
        (and, on a completion choice's first chunk, its ``prompt_token_ids``); ``usage``: the
        tokens so far (vLLM's ``continuous_usage_stats``)."""
        finish_reason = answer_reason(self.tool, finish_reason)
        finish = f'"{finish_reason}"' if finish_reason else "null"
        content = json.dumps(text)
        if self.is_chat and self.tool:
            call = self._call_piece(index, text, finish_reason is not None)
            choice = f'{{"index":{index},"delta":{{"tool_calls":[{call}]}}'
        elif self.is_chat:
            choice = f'{{"index":{index},"delta":{{"content":{content}}}'
        else:
            choice = f'{{"index":{index},"text":{content}'
        extra = "null" if logprobs is None else json.dumps(logprobs, separators=(",", ":"))
        if token_ids is not None:
            extra += f',"token_ids":{json.dumps(token_ids)}'
        if prompt_token_ids is not None:
            extra += f',"prompt_token_ids":{json.dumps(prompt_token_ids)}'
        counts = "" if usage is None else f',"usage":{json.dumps(usage, separators=(",", ":"))}'
        return f'{self.head}[{choice},"logprobs":{extra},"finish_reason":{finish}}}]{counts}}}\n\n'

    def _call_piece(self, index: int, text: str, last: bool) -> str:
        """A choice's tool call as it streams: its id and function name first, then pieces of
        its arguments (``backends.server.tool_calls``)."""
        first = index not in self._calling
        self._calling.add(index)
        arguments = json.dumps(arguments_delta(text, first, last))
        if not first:
            return f'{{"index":0,"function":{{"arguments":{arguments}}}}}'
        ident, name = call_id(self.request_id, index), json.dumps(self.tool)
        return (
            f'{{"index":0,"id":"{ident}","type":"function",'
            f'"function":{{"name":{name},"arguments":{arguments}}}}}'
        )

    def usage(self, usage: dict[str, object]) -> str:
        return f'{self.head}[],"usage":{json.dumps(usage, separators=(",", ":"))}}}\n\n'

    @staticmethod
    def error(message: str, error_type: str = "server_error") -> str:
        return sse_error_event(message, error_type)
