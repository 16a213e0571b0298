"""What a runner choice hands the server: the runner, its tokenizer and the model's facts."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from backends.engine.model_runner import ModelRunner
from kvgate.wire.request_tokenizer import RequestTokenizer


def _no_load(name: str, path: str) -> None:
    return None


@dataclass(frozen=True, slots=True)
class RunnerParts:
    runner: ModelRunner
    tokenizer: RequestTokenizer
    model_name: str  # the served name unless --model overrides it
    eos_token_ids: tuple[int, ...]
    max_model_len: int | None = None  # the model's context, when it has one
    vocab_size: int | None = None  # the model's vocabulary (may exceed the tokenizer's)
    load_lora: Callable[[str, str], None] = _no_load  # a start-up adapter (ValueError if bad)
    # tokens computed in one step unless --max-num-batched-tokens says otherwise
    max_num_batched_tokens: int = 4096
