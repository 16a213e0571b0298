"""``/v1/completions`` and ``/v1/chat/completions``, streaming (SSE) or not.

A request's sequences are aborted in the engine whenever the handler ends early (client gone,
stop string, error), so their KV blocks are freed at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections.abc import AsyncIterator

from aiohttp import web

from backends.engine.engine import RequestStream
from backends.engine.sequence import FinishReason, SamplingParams, Sequence
from backends.server.choice_details import (
    logprobs_field,
    logprobs_of,
    prompt_logprobs_field,
    token_id_fields,
)
from backends.server.errors import error_response
from backends.server.kv_hints import RetainHint, retain_hint
from backends.server.prefill_hop import prefillers, run_prefill_hop
from backends.server.protocol import GenerationRequest, RequestError, parse_request
from backends.server.request_body import BodyError, read_object
from backends.server.sse import DONE, ChunkFormatter
from backends.server.state import STATE, ServerState
from backends.server.text_stream import TextStream
from backends.server.tool_calls import call_id, finish_reason, forced_tool, tool_message

log = logging.getLogger(__name__)

# (choice index, text delta, finish reason, token ids of the delta)
ChoiceEvent = tuple[int, str, str | None, list[int]]


class EngineAborted(RuntimeError):
    """The engine dropped a sequence that the handler did not abort (runner failure)."""


class SSEResponse(web.StreamResponse):
    """A stream whose headers leave with its first chunk (one write fewer per request)."""

    _send_headers_immediately = False


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, is_chat=False)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, is_chat=True)


def parse_generation(
    state: ServerState, body: object, *, is_chat: bool
) -> tuple[GenerationRequest, str | None]:
    """The request and the LoRA adapter its model names; ``RequestError`` when it is bad."""
    started = time.thread_time()
    try:
        req = parse_request(
            body,
            state.tokenizer,
            is_chat=is_chat,
            default_max_tokens=state.default_max_tokens(is_chat),
            vocab_size=state.vocab_size,
        )
    finally:
        state.metrics.tokenize_seconds += time.thread_time() - started
    assert isinstance(body, dict)  # parse_request checked it
    tool, retain = forced_tool(body) if is_chat else None, retain_hint(body)
    if tool is not None or retain is not None:
        req = dataclasses.replace(req, tool_call=tool, retain=retain)
    return req, state.resolve_model(req.model)


def request_error(exc: RequestError) -> web.Response:
    """The error response of a bad request."""
    code = "model_not_found" if exc.status == 404 else None
    return error_response(exc.status, exc.message, exc.param, code)


async def _generate(request: web.Request, *, is_chat: bool) -> web.StreamResponse:
    state = request.app[STATE]
    request_id = request.headers.get("x-request-id") or uuid.uuid4().hex
    try:
        body = await read_object(request)
    except BodyError as exc:
        return error_response(exc.status, exc.message)
    try:
        req, lora = parse_generation(state, body, is_chat=is_chat)
    except RequestError as exc:
        return request_error(exc)
    if state.prefill_session is not None and req.kv_transfer is None:
        targets = prefillers(request.headers)
        if targets:
            params, outcome = await run_prefill_hop(
                state.prefill_session, targets, request.path, body, request_id,
                state.prefill_timeout,
            )  # fmt: skip
            if state.pd is not None and state.pd.metrics is not None:
                state.pd.metrics.prefill_hops.labels(outcome).inc()
            req = dataclasses.replace(req, kv_transfer=params)
    streams: list[RequestStream] = []
    try:
        for prompt in req.prompts:
            first = None  # the first sample computes the prompt; the others share its blocks
            for sample in range(req.n):
                stream = state.engine.add_request(
                    prompt,
                    _sampling_of(req.sampling, sample),
                    lora_name=lora,
                    cache_salt=req.cache_salt,
                    priority=req.priority,
                    request_id=request_id,
                    kv_transfer=req.kv_transfer if state.pd is not None else None,
                    parent=first,
                )
                first = first or stream
                streams.append(stream)
    except ValueError as exc:
        for stream in streams:
            state.engine.abort(stream)
        return error_response(400, str(exc), "max_tokens")
    try:
        if req.stream:
            response = await _stream(request, state, req, streams, request_id)
        else:
            response = await _complete(state, req, streams, request_id)
        if req.retain is not None:
            _retain(state, req, streams, req.retain)
        return response
    finally:
        for stream in streams:
            state.engine.abort(stream)
            if state.tracer is not None:
                state.tracer.record(request.headers, stream, req.model)


def _retain(
    state: ServerState, req: GenerationRequest, streams: list[RequestStream], hint: RetainHint
) -> None:
    """Keep the blocks of each finished prompt whose reason the hint names; release those of
    one that ended otherwise (its session will not be back for them)."""
    for stream in streams[:: req.n]:
        reason = stream.finish_reason
        if not stream.seq.is_finished or reason in (None, FinishReason.ABORT):
            continue
        if finish_reason(req.tool_call, reason.value) in hint.on:
            state.engine.retain(stream, hint.ttl, hint.owner)
        else:
            state.engine.release(stream)


def _sampling_of(sampling: SamplingParams, sample: int) -> SamplingParams:
    """A prompt's ``sample``-th sampling: a seeded request's samples differ by their seeds
    (``seed + sample``, as vLLM seeds them), else they are the same parameters."""
    if sample == 0 or sampling.seed is None:
        return sampling
    return dataclasses.replace(sampling, seed=(sampling.seed + sample + 2**63) % 2**64 - 2**63)


async def choice_events(
    state: ServerState, req: GenerationRequest, index: int, stream: RequestStream
) -> AsyncIterator[ChoiceEvent]:
    """Text deltas of one choice with their token ids, one per batch of new tokens; the last
    event carries the finish reason. Tokens whose text is held back (an unfinished character,
    a possible stop string) still get their delta, with empty text, as vLLM streams them: a
    client sees each token when it is made, the first one included."""
    text_stream = TextStream(state.tokenizer.decoder(), req.stop)
    pending: list[int] = []
    while True:
        tokens = await stream.next_tokens()
        pending += tokens
        finished = stream.seq.is_finished
        text = text_stream.feed(tokens, final=finished)
        if text_stream.stopped:
            state.engine.abort(stream)
            yield index, text, "stop", pending
            return
        if finished:
            if stream.finish_reason is FinishReason.ABORT:
                raise EngineAborted("the engine aborted the request")
            reason = stream.finish_reason.value if stream.finish_reason else "stop"
            yield index, text, reason, pending
            return
        if text or pending:
            yield index, text, None, pending
            pending = []


def _all_choice_events(
    state: ServerState, req: GenerationRequest, streams: list[RequestStream]
) -> AsyncIterator[ChoiceEvent]:
    if len(streams) == 1:
        return choice_events(state, req, 0, streams[0])
    return _merged_choice_events(state, req, streams)


async def _merged_choice_events(
    state: ServerState, req: GenerationRequest, streams: list[RequestStream]
) -> AsyncIterator[ChoiceEvent]:
    queue: asyncio.Queue[ChoiceEvent | BaseException | None] = asyncio.Queue()

    async def pump(index: int, stream: RequestStream) -> None:
        try:
            async for event in choice_events(state, req, index, stream):
                await queue.put(event)
            await queue.put(None)
        except EngineAborted as exc:
            await queue.put(exc)

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()


def _usage_so_far(seq: Sequence, completion: int) -> dict[str, object]:
    """One choice's tokens so far, as vLLM's ``continuous_usage_stats`` puts them in a chunk."""
    prompt = seq.num_prompt_tokens
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _usage(streams: list[RequestStream], n: int) -> dict[str, object]:
    """Each prompt counted once (its first sample's), every sample's output."""
    prompt = sum(s.seq.num_prompt_tokens for s in streams[::n])
    completion = sum(s.seq.num_output_tokens for s in streams)
    cached = sum(s.seq.num_cached_tokens for s in streams[::n])
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


async def _complete(
    state: ServerState, req: GenerationRequest, streams: list[RequestStream], request_id: str
) -> web.Response:
    texts = [""] * len(streams)
    reasons: list[str | None] = [None] * len(streams)
    try:
        async for index, text, reason, _ in _all_choice_events(state, req, streams):
            texts[index] += text
            reasons[index] = reason or reasons[index]
    except EngineAborted as exc:
        return error_response(500, str(exc))
    created = int(time.time())
    if req.is_chat:
        tool = req.tool_call
        choices: list[dict[str, object]] = [
            {
                "index": i,
                "message": (
                    tool_message(tool, t, call_id(request_id, i))
                    if tool
                    else {"role": "assistant", "content": t}
                ),
                "logprobs": logprobs_field(req, state.tokenizer, streams[i]),
                "finish_reason": finish_reason(tool, reasons[i]),
                **token_id_fields(req, streams[i]),
            }
            for i, t in enumerate(texts)
        ]
        kind, prefix = "chat.completion", "chatcmpl-"
    else:
        choices = [
            {
                "index": i,
                "text": t,
                "logprobs": logprobs_field(req, state.tokenizer, streams[i]),
                "finish_reason": reasons[i],
                "stop_reason": None,
                **token_id_fields(req, streams[i]),
                **_prompt_logprobs(req, state, streams[i]),
            }
            for i, t in enumerate(texts)
        ]
        kind, prefix = "text_completion", "cmpl-"
    body = {
        "id": prefix + request_id,
        "object": kind,
        "created": created,
        "model": req.model,
        "choices": choices,
        "usage": _usage(streams, req.n),
    }
    if req.is_chat and req.return_token_ids:
        body["prompt_token_ids"] = list(streams[0].seq.prompt_token_ids)
    if req.is_chat:  # vLLM's chat response carries them beside the choices
        body.update(_prompt_logprobs(req, state, streams[0]))
    if state.pd is not None and (held := state.pd.response_params(streams[0].seq)) is not None:
        body["kv_transfer_params"] = held.to_json()
    return web.json_response(body, headers={"x-request-id": request_id})


def _prompt_logprobs(
    req: GenerationRequest, state: ServerState, stream: RequestStream
) -> dict[str, object]:
    field = prompt_logprobs_field(req, state.tokenizer, stream)
    return {} if field is None else {"prompt_logprobs": field}


async def _stream(
    request: web.Request,
    state: ServerState,
    req: GenerationRequest,
    streams: list[RequestStream],
    request_id: str,
) -> web.StreamResponse:
    headers = {
        "Content-Type": "text/event-stream",
        "Cache-Control": "no-cache",
        "x-request-id": request_id,
    }
    response = SSEResponse(headers=headers)
    await response.prepare(request)
    fmt = ChunkFormatter(req, request_id, int(time.time()))
    try:
        tail = await write_deltas(response, fmt, state, req, streams)
        if req.include_usage:
            tail.append(fmt.usage(_usage(streams, req.n)))
        tail.append(DONE)
    except EngineAborted as exc:
        tail = [fmt.error(str(exc))]  # and no [DONE]: the client must not see a clean end
    except ConnectionResetError:
        log.debug("client of %s went away mid-stream", request_id)
        return response
    try:
        await response.write_eof("".join(tail).encode())
    except ConnectionResetError:
        log.debug("client of %s went away at the end of its stream", request_id)
    return response


async def write_deltas(
    response: web.StreamResponse,
    fmt: ChunkFormatter,
    state: ServerState,
    req: GenerationRequest,
    streams: list[RequestStream],
) -> list[str]:
    """Write every delta but the last of a single choice, which is returned to send last. A
    chat's opening chunk goes out with its first delta, when the first token is made, as vLLM
    sends it (sent before, it would be a client's and the gateway's first token, at once)."""
    ids = req.return_token_ids
    opening = fmt.opening(list(streams[0].seq.prompt_token_ids) if ids else None)
    tail: list[str] = []
    emitted = [0] * len(streams)  # output tokens sent so far, per choice
    async for index, text, reason, tokens in _all_choice_events(state, req, streams):
        seq = streams[index].seq
        logprobs = logprobs_of(
            req,
            state.tokenizer,
            tokens,
            seq.output_logprobs[emitted[index] : emitted[index] + len(tokens)],
            seq.output_top_logprobs[emitted[index] : emitted[index] + len(tokens)],
        )
        first = emitted[index] == 0
        emitted[index] += len(tokens)
        prompt_ids = list(seq.prompt_token_ids) if ids and first and not req.is_chat else None
        so_far = _usage_so_far(seq, emitted[index]) if req.continuous_usage else None
        chunk = fmt.delta(
            index, text, reason, logprobs, tokens if ids else None, prompt_ids, so_far
        )
        if opening:
            chunk, opening = opening + chunk, ""
        if reason is not None and len(streams) == 1:
            tail.append(chunk)
        else:
            await response.write(chunk.encode())
    return tail
