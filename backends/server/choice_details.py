"""The per-choice extras of a finished response: the chosen tokens' ``logprobs`` (OpenAI's
completion and chat shapes) and vLLM's ``return_token_ids`` fields."""

from __future__ import annotations

from backends.engine.engine import RequestStream
from backends.server.protocol import GenerationRequest
from kvgate.wire.request_tokenizer import RequestTokenizer


def logprobs_field(
    req: GenerationRequest, tokenizer: RequestTokenizer, stream: RequestStream
) -> dict[str, object] | None:
    """The whole choice's ``logprobs`` (None unless asked for)."""
    seq = stream.seq
    ids = seq.token_ids[seq.num_prompt_tokens :][: len(seq.output_logprobs)]
    return logprobs_of(req, tokenizer, ids, seq.output_logprobs)


def logprobs_of(
    req: GenerationRequest,
    tokenizer: RequestTokenizer,
    token_ids: list[int],
    logprobs: list[float],
    text_offset: int = 0,
) -> dict[str, object] | None:
    """``logprobs`` of ``token_ids`` in the request's shape (chat or completion)."""
    if not req.sampling.logprobs:
        return None
    texts = [tokenizer.decode([token]) for token in token_ids]
    if req.is_chat:
        return {
            "content": [
                {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
                for t, lp in zip(texts, logprobs, strict=False)
            ]
        }
    offsets, offset = [], text_offset
    for text in texts:
        offsets.append(offset)
        offset += len(text)
    return {
        "tokens": texts,
        "token_logprobs": logprobs[: len(texts)],
        "top_logprobs": [{t: lp} for t, lp in zip(texts, logprobs, strict=False)],
        "text_offset": offsets,
    }


def token_id_fields(req: GenerationRequest, stream: RequestStream) -> dict[str, object]:
    """``token_ids`` of the choice (and, for completions, ``prompt_token_ids``) when asked."""
    if not req.return_token_ids:
        return {}
    seq = stream.seq
    fields: dict[str, object] = {"token_ids": seq.token_ids[seq.num_prompt_tokens :]}
    if not req.is_chat:
        fields["prompt_token_ids"] = list(seq.prompt_token_ids)
    return fields
