"""The output limit an OpenAI request names: chat's ``max_completion_tokens``, the Responses
API's ``max_output_tokens``, or ``max_tokens`` (completions, and chat's older spelling)."""

from __future__ import annotations

from collections.abc import Mapping

OUTPUT_LIMITS = ("max_completion_tokens", "max_output_tokens", "max_tokens")


def requested_output_tokens(body: Mapping[str, object]) -> int | None:
    """The first output limit ``body`` names, when it is a positive integer; else None."""
    for name in OUTPUT_LIMITS:
        if name in body:
            value = body[name]
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
            return None
    return None
