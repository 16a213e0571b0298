"""Next-token sampling from a step's logits, as vLLM's sampler behaves.

Per row: greedy when ``temperature`` is 0; otherwise logits / temperature, then min-p (tokens
less likely than ``min_p`` times the likeliest one are ruled out), top-k, then top-p (the
smallest set of most likely tokens whose probability reaches ``top_p``), renormalised (vLLM's
order), drawn from a generator seeded by the request's ``seed`` (so a seeded request is
reproducible whatever else is in the batch) or from the runner's shared generator.
End-of-sequence and stop tokens are masked until ``min_tokens`` tokens are out (on a copy: the
caller's logits are never changed). The chosen token's log-probability, and those of the
``top_logprobs`` most likely tokens, are the model's own (vLLM's default ``logprobs_mode``,
raw log-probabilities): from the logits before any masking.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from backends.engine.sequence import PromptLogprob, SamplingParams, TopLogprobs


@dataclass(frozen=True, slots=True)
class SampleRow:
    seq_id: int
    sampling: SamplingParams
    num_output_tokens: int  # tokens generated before this one


@dataclass(frozen=True, slots=True)
class Sampled:
    """One step's draws: each row's token, and where a row asks, its log-probability and its
    most likely tokens (aligned with the rows; None where not asked)."""

    tokens: list[int]
    logprobs: list[float | None] | None = None
    top_logprobs: list[TopLogprobs | None] | None = None


class Sampler:
    def __init__(self, eos_token_ids: Sequence[int], seed: int = 0) -> None:
        self.eos_token_ids = tuple(eos_token_ids)
        self._shared = torch.Generator().manual_seed(seed)
        self._generators: dict[int, torch.Generator] = {}

    def release(self, seq_id: int) -> None:
        self._generators.pop(seq_id, None)

    def sample(self, logits: torch.Tensor, rows: Sequence[SampleRow]) -> Sampled:
        """Tokens for each row of ``logits`` (``[rows, vocab]``), and their log-probs (and the
        most likely tokens') when any row asks for them."""
        raw = logits.float()
        masked = self._without_early_stops(raw, rows)
        tokens = masked.argmax(dim=-1)
        random_rows = [i for i, row in enumerate(rows) if not row.sampling.is_greedy]
        if random_rows:
            tokens = tokens.clone()
            for i in random_rows:
                tokens[i] = self._draw(masked[i], rows[i])
        chosen = tokens.tolist()
        asked = [row.sampling.top_logprobs if row.sampling.logprobs else -1 for row in rows]
        if max(asked) < 0:
            return Sampled(chosen)
        log_probs = torch.log_softmax(raw, dim=-1)
        logprobs = log_probs.gather(1, tokens[:, None])[:, 0].tolist()
        most = max(asked)
        tops: list[TopLogprobs | None] | None = None
        if most > 0:
            likeliest = _likeliest(log_probs, most)
            tops = [likeliest[i][:k] if k > 0 else None for i, k in enumerate(asked)]
        kept = [lp if k >= 0 else None for lp, k in zip(logprobs, asked, strict=True)]
        return Sampled(chosen, kept, tops)

    def _without_early_stops(self, logits: torch.Tensor, rows: Sequence[SampleRow]) -> torch.Tensor:
        """``logits`` with the end tokens ruled out in the rows still short of ``min_tokens``
        (a copy when any is: the caller's tensor is left as it was)."""
        masked = logits
        for i, row in enumerate(rows):
            sampling = row.sampling
            if row.num_output_tokens >= sampling.min_tokens:
                continue
            stops = list(sampling.stop_token_ids)
            if not sampling.ignore_eos:
                stops.extend(self.eos_token_ids)
            if stops:
                if masked is logits:
                    masked = logits.clone()
                masked[i, stops] = float("-inf")
        return masked

    def verify(
        self, logits: torch.Tensor, row: SampleRow, drafts: Sequence[int]
    ) -> tuple[list[int], int]:
        """Speculative decoding's check of ``drafts`` against the model: ``logits`` (``[1 +
        len(drafts), vocab]``) has, in row ``i``, the distribution of the token after
        ``drafts[:i]``. Returns the drafts kept and the token sampled after them.

        Greedy: a draft is kept while it is the argmax (the output is token for token the one
        without drafts). Sampled: draft ``i`` is kept with probability ``p_i(draft)`` (a
        prompt-lookup draft is one token for certain, so this is the rejection sampling of
        speculative decoding) and a rejected one is replaced by a draw from ``p_i`` without it,
        renormalised — each emitted token is distributed as ``p_i``, as without drafts."""
        steps = [
            SampleRow(row.seq_id, row.sampling, row.num_output_tokens + i)
            for i in range(len(drafts) + 1)
        ]
        logits = self._without_early_stops(logits.float(), steps)
        if row.sampling.is_greedy:
            targets = logits.argmax(dim=-1).tolist()
            kept = 0
            while kept < len(drafts) and targets[kept] == drafts[kept]:
                kept += 1
            return list(drafts[:kept]), targets[kept]
        generator = self._generator(row)
        for i, draft in enumerate(drafts):
            probs = self._probs(logits[i], row.sampling)
            if float(torch.rand((), generator=generator)) < float(probs[draft]):
                continue
            probs[draft] = 0.0
            if float(probs.sum()) <= 0.0:  # every token but the draft is ruled out
                return list(drafts[:i]), draft
            return list(drafts[:i]), int(torch.multinomial(probs, 1, generator=generator))
        last = self._probs(logits[len(drafts)], row.sampling)
        return list(drafts), int(torch.multinomial(last, 1, generator=generator))

    def _draw(self, logits: torch.Tensor, row: SampleRow) -> int:
        probs = self._probs(logits, row.sampling)
        return int(torch.multinomial(probs, 1, generator=self._generator(row)).item())

    @staticmethod
    def _probs(logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
        """One row's distribution, summing to 1: temperature, then min-p, top-k and top-p."""
        scaled = logits / sampling.temperature
        if sampling.min_p > 0.0:
            probs = torch.softmax(scaled, dim=-1)
            scaled = scaled.masked_fill(probs < sampling.min_p * probs.max(), float("-inf"))
        if 0 < sampling.top_k < scaled.shape[-1]:
            kth = torch.topk(scaled, sampling.top_k).values[-1]
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        probs = torch.softmax(scaled, dim=-1)
        if sampling.top_p < 1.0:
            sorted_probs, order = probs.sort(descending=True)
            before = sorted_probs.cumsum(-1) - sorted_probs  # mass of the more likely tokens
            sorted_probs = sorted_probs.masked_fill(before >= sampling.top_p, 0.0)
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
            probs /= probs.sum()  # the nucleus is the distribution: its mass is 1
        return probs

    def _generator(self, row: SampleRow) -> torch.Generator:
        if row.sampling.seed is None:
            return self._shared
        generator = self._generators.get(row.seq_id)
        if generator is None:
            generator = torch.Generator().manual_seed(row.sampling.seed & (2**63 - 1))
            self._generators[row.seq_id] = generator
        return generator


def prompt_logprobs(
    logits: torch.Tensor, next_tokens: Sequence[int], top: int
) -> list[PromptLogprob]:
    """For each row of ``logits`` (``[rows, vocab]``, the logits at one prompt position), the
    log-probability of the prompt's next token, its rank (1: the most likely) and the ``top``
    most likely tokens, from the unmodified distribution."""
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    chosen = log_probs.gather(1, torch.tensor(next_tokens, device=logits.device)[:, None])
    ranks = ((log_probs > chosen).sum(-1) + 1).tolist()
    likeliest = _likeliest(log_probs, top) if top else [()] * len(next_tokens)
    return list(zip(chosen[:, 0].tolist(), ranks, likeliest, strict=True))


def _likeliest(log_probs: torch.Tensor, k: int) -> list[TopLogprobs]:
    """Each row's ``k`` most likely tokens with their log-probabilities, most likely first."""
    values, ids = (part.tolist() for part in log_probs.topk(k, dim=-1))
    return [tuple(zip(i, v, strict=True)) for i, v in zip(ids, values, strict=True)]
