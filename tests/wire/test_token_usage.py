"""Usage read in one set of terms from each API's spelling: chat, Responses, Anthropic's
Messages (whose ``input_tokens`` leaves out what the cache read or wrote)."""

from __future__ import annotations

import pytest

from kvgate.wire.token_usage import TokenCounts, token_counts


@pytest.mark.parametrize(
    ("usage", "counts"),
    [
        ({"prompt_tokens": 4, "completion_tokens": 1}, (4, 1, 0)),
        (
            {
                "prompt_tokens": 9,
                "completion_tokens": 2,
                "prompt_tokens_details": {"cached_tokens": 8},
            },
            (9, 2, 8),
        ),
        ({"input_tokens": 4, "output_tokens": 1}, (4, 1, 0)),
        (
            {"input_tokens": 9, "output_tokens": 2, "input_tokens_details": {"cached_tokens": 5}},
            (9, 2, 5),
        ),
        (  # Anthropic's: 3 uncached + 16 read + 2 written = a prompt of 21
            {
                "input_tokens": 3,
                "output_tokens": 7,
                "cache_read_input_tokens": 16,
                "cache_creation_input_tokens": 2,
            },
            (21, 7, 16),
        ),
        (
            {"input_tokens": 3, "output_tokens": 7, "cache_read_input_tokens": None},
            (3, 7, 0),
        ),
        ({"prompt_tokens": 4}, (4, None, 0)),
        ({"prompt_tokens": True, "completion_tokens": "2"}, (None, None, 0)),
        ({"prompt_tokens_details": {"cached_tokens": "x"}}, (None, None, 0)),
    ],
)
def test_each_spelling_reads_as_prompt_completion_and_cached(
    usage: dict[str, object], counts: TokenCounts
) -> None:
    assert token_counts(usage) == counts
