"""Token usage as each API reports it, read in one set of terms: the prompt's tokens (all of
them, cached or not), the completion's, and the prompt's tokens the engine's prefix cache held.

- Chat and completions: ``prompt_tokens``, ``completion_tokens``,
  ``prompt_tokens_details.cached_tokens`` (vLLM with ``--enable-prompt-tokens-details``).
- The Responses API: ``input_tokens`` (all of the prompt), ``output_tokens``,
  ``input_tokens_details.cached_tokens``.
- Anthropic's Messages API: ``input_tokens`` counts only what was neither read from nor written
  to the cache, so the prompt is ``input_tokens + cache_read_input_tokens +
  cache_creation_input_tokens``, the cached part ``cache_read_input_tokens``.
"""

from __future__ import annotations

# One answer's usage: its prompt's tokens, its completion's (each None where the usage lacks
# it) and the prompt's cached tokens. A plain tuple: a NamedTuple's constructor is interpreted
# Python even in the compiled build, on every answer.
TokenCounts = tuple[int | None, int | None, int]


def token_counts(usage: dict[str, object]) -> TokenCounts:
    """The usage object of a chat, completions, Responses or Messages answer, in chat terms."""
    # perf: on every answer; chat's spelling first, no ABC checks (compiled with the relay)
    if "prompt_tokens" in usage or "completion_tokens" in usage:
        prompt, completion = (
            _count(usage.get("prompt_tokens")),
            _count(usage.get("completion_tokens")),
        )
        details = usage.get("prompt_tokens_details")
    else:
        prompt, completion = _count(usage.get("input_tokens")), _count(usage.get("output_tokens"))
        read = _count(usage.get("cache_read_input_tokens"))
        written = _count(usage.get("cache_creation_input_tokens"))
        if read is not None or written is not None:  # Anthropic's: the prompt in three parts
            if prompt is not None:
                prompt += (read or 0) + (written or 0)
            return prompt, completion, read or 0
        details = usage.get("input_tokens_details")
    cached = _count(details.get("cached_tokens")) if type(details) is dict else None
    return prompt, completion, cached or 0


def _count(value: object) -> int | None:
    return value if type(value) is int else None
