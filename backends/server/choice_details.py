"""The per-choice extras of a finished response: the chosen tokens' ``logprobs`` and the most
likely tokens' at each position (OpenAI's completion and chat shapes, as vLLM fills them) and
vLLM's ``return_token_ids`` fields."""

from __future__ import annotations

from collections.abc import Sequence

from backends.engine.engine import RequestStream
from backends.engine.sequence import TopLogprobs
from backends.server.protocol import GenerationRequest
from kvgate.wire.request_tokenizer import RequestTokenizer


def logprobs_field(
    req: GenerationRequest, tokenizer: RequestTokenizer, stream: RequestStream
) -> dict[str, object] | None:
    """The whole choice's ``logprobs`` (None unless asked for)."""
    seq = stream.seq
    ids = seq.token_ids[seq.num_prompt_tokens :][: len(seq.output_logprobs)]
    return logprobs_of(req, tokenizer, ids, seq.output_logprobs, seq.output_top_logprobs)


def logprobs_of(
    req: GenerationRequest,
    tokenizer: RequestTokenizer,
    token_ids: list[int],
    logprobs: list[float],
    tops: Sequence[TopLogprobs] = (),
    text_offset: int = 0,
) -> dict[str, object] | None:
    """``logprobs`` of ``token_ids`` in the request's shape (chat or completion), with each
    position's most likely tokens (``tops``, aligned with ``token_ids``) where asked for."""
    if not req.sampling.logprobs:
        return None
    texts = [tokenizer.decode([token]) for token in token_ids]
    alternatives = [
        [(tokenizer.decode([token]), lp) for token, lp in top] for top in tops[: len(texts)]
    ] or [[] for _ in texts]
    if req.is_chat:
        return {
            "content": [
                {
                    "token": t,
                    "logprob": lp,
                    "bytes": list(t.encode()),
                    "top_logprobs": [
                        {"token": a, "logprob": alp, "bytes": list(a.encode())} for a, alp in alt
                    ],
                }
                for t, lp, alt in zip(texts, logprobs, alternatives, strict=False)
            ]
        }
    offsets, offset = [], text_offset
    for text in texts:
        offsets.append(offset)
        offset += len(text)
    return {
        "tokens": texts,
        "token_logprobs": logprobs[: len(texts)],
        # the chosen token and the most likely ones (vLLM's: up to logprobs + 1 entries)
        "top_logprobs": [
            {t: lp, **dict(alt)} for t, lp, alt in zip(texts, logprobs, alternatives, strict=False)
        ],
        "text_offset": offsets,
    }


def prompt_logprobs_field(
    req: GenerationRequest, tokenizer: RequestTokenizer, stream: RequestStream
) -> list[dict[str, dict[str, object]] | None] | None:
    """vLLM's ``prompt_logprobs`` (None unless asked for): None for the first prompt token, then
    each one's ``{token id: {logprob, rank, decoded_token}}``, the prompt's token first and the
    likeliest tokens at its position after it."""
    if req.sampling.prompt_logprobs is None:
        return None
    seq = stream.seq
    positions: list[dict[str, dict[str, object]] | None] = [None]
    for token, (logprob, rank, top) in zip(
        seq.prompt_token_ids[1:], seq.prompt_logprobs, strict=False
    ):
        position = {str(token): _logprob(tokenizer, token, logprob, rank)}
        for likeliest, (other, other_logprob) in enumerate(top, start=1):
            position.setdefault(str(other), _logprob(tokenizer, other, other_logprob, likeliest))
        positions.append(position)
    return positions


def _logprob(
    tokenizer: RequestTokenizer, token: int, logprob: float, rank: int
) -> dict[str, object]:
    return {"logprob": logprob, "rank": rank, "decoded_token": tokenizer.decode([token])}


def token_id_fields(req: GenerationRequest, stream: RequestStream) -> dict[str, object]:
    """``token_ids`` of the choice (and, for completions, ``prompt_token_ids``) when asked."""
    if not req.return_token_ids:
        return {}
    seq = stream.seq
    fields: dict[str, object] = {"token_ids": seq.token_ids[seq.num_prompt_tokens :]}
    if not req.is_chat:
        fields["prompt_token_ids"] = list(seq.prompt_token_ids)
    return fields
