"""Parse and validate OpenAI completion and chat requests into engine inputs.

Every problem raises ``RequestError`` naming the offending parameter, which the server turns
into an OpenAI-shaped error body; nothing here touches the engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from backends.engine.kv_transfer_params import KVTransferParams, KVTransferParamsError
from backends.engine.sequence import MAX_LOGPROBS, SamplingParams
from kvgate.wire.request_tokenizer import RequestTokenizer
from kvgate.wire.tokenizer import ChatTemplateError

if TYPE_CHECKING:
    from backends.server.kv_hints import RetainHint

MAX_STOP_STRINGS = 16


class RequestError(ValueError):
    """A bad request: ``status`` 400 (invalid) or 404 (unknown model)."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status


MAX_N = 128  # samples per prompt a request may ask for


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """What the server needs to run a completion or chat request."""

    model: str
    prompts: list[list[int]]
    sampling: SamplingParams
    stream: bool
    include_usage: bool
    stop: tuple[str, ...]
    priority: int
    is_chat: bool
    return_token_ids: bool = False
    cache_salt: str | None = None  # vLLM's: prefix-cache sharing only within one salt
    kv_transfer: KVTransferParams | None = None  # prefill/decode disaggregation (vLLM's)
    n: int = 1  # samples of each prompt: choice prompt_index * n + sample
    # vLLM's stream_options.continuous_usage_stats: each chunk says the tokens so far
    continuous_usage: bool = False
    tool_call: str | None = None  # the function a chat answer must call (a forced tool_choice)
    retain: RetainHint | None = None  # keep the blocks after the request (``kv_hints``)


def _get_int(body: Mapping[str, object], key: str, default: int | None) -> int | None:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"{key} must be an integer", key)
    return value


def _get_float(body: Mapping[str, object], key: str, default: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RequestError(f"{key} must be a number", key)
    return float(value)


def _get_bool(body: Mapping[str, object], key: str) -> bool:
    value = body.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise RequestError(f"{key} must be a boolean", key)
    return value


def _stop_strings(body: Mapping[str, object]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise RequestError("stop must be a non-empty string or a list of them", "stop")
    if len(stop) > MAX_STOP_STRINGS:
        raise RequestError(f"stop accepts at most {MAX_STOP_STRINGS} strings", "stop")
    return tuple(stop)


def _token_list(value: list[object], vocab_size: int, where: str) -> list[int]:
    for token in value:
        if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < vocab_size:
            raise RequestError(
                f"{where}: token ids must be integers in [0, {vocab_size})", "prompt"
            )
    return [t for t in value if isinstance(t, int)]


def parse_prompts(value: object, tokenizer: RequestTokenizer, vocab_size: int) -> list[list[int]]:
    """``prompt`` as OpenAI allows it: a string, strings, token ids, or lists of token ids."""
    prompts: list[object]
    if isinstance(value, str):
        prompts = [value]
    elif isinstance(value, list) and value:
        is_token_list = all(isinstance(t, int) and not isinstance(t, bool) for t in value)
        prompts = [value] if is_token_list else value
    else:
        raise RequestError(
            "prompt must be a non-empty string, list of strings or token ids", "prompt"
        )
    result: list[list[int]] = []
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            ids = tokenizer.prompt_ids(prompt)
        elif isinstance(prompt, list):
            ids = _token_list(prompt, vocab_size, f"prompt[{i}]")
        else:
            raise RequestError(f"prompt[{i}] must be a string or a list of token ids", "prompt")
        if not ids:
            raise RequestError("prompt must not be empty", "prompt")
        result.append(ids)
    return result


CHAT_ROLES = ("system", "developer", "user", "assistant", "tool", "function")


def parse_messages(
    value: object, tokenizer: RequestTokenizer, continue_final: bool = False
) -> list[list[int]]:
    if not isinstance(value, list) or not value:
        raise RequestError("messages must be a non-empty list", "messages")
    if not all(isinstance(m, Mapping) for m in value):
        raise RequestError("each message must be an object", "messages")
    for number, message in enumerate(value):
        role = message.get("role")
        if role not in CHAT_ROLES:
            raise RequestError(
                f"messages[{number}].role must be one of {', '.join(CHAT_ROLES)}; got {role!r}",
                f"messages[{number}].role",
            )
    try:
        return [tokenizer.chat_ids(value, continue_final)]
    except ChatTemplateError as exc:
        raise RequestError(str(exc), "messages") from exc


def parse_request(
    body: object,
    tokenizer: RequestTokenizer,
    *,
    is_chat: bool,
    default_max_tokens: int,
    vocab_size: int | None = None,
) -> GenerationRequest:
    """The request's prompts and sampling; ``vocab_size`` bounds given token ids (the model's
    vocabulary, which may be larger than the tokenizer's)."""
    if not isinstance(body, Mapping):
        raise RequestError("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise RequestError("model is required and must be a string", "model")
    if is_chat:
        prompts = parse_messages(body.get("messages"), tokenizer, _continues(body))
        max_tokens = _get_int(body, "max_completion_tokens", None)
        if max_tokens is None:
            max_tokens = _get_int(body, "max_tokens", default_max_tokens)
    else:
        if "prompt" not in body:
            raise RequestError("prompt is required", "prompt")
        prompts = parse_prompts(body["prompt"], tokenizer, vocab_size or tokenizer.vocab_size)
        max_tokens = _get_int(body, "max_tokens", default_max_tokens)
    n = _get_int(body, "n", 1) or 0
    if not 1 <= n <= MAX_N:
        raise RequestError(f"n must be in [1, {MAX_N}]; got {n}", "n")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, Mapping):
        raise RequestError("stream_options must be an object", "stream_options")
    include_usage = bool(options and options.get("include_usage") is True)
    continuous_usage = bool(options and options.get("continuous_usage_stats") is True)
    temperature = _get_float(body, "temperature", 1.0)
    top_p = _get_float(body, "top_p", 1.0)
    seed = _get_int(body, "seed", None)
    ignore_eos = _get_bool(body, "ignore_eos")
    stop_token_ids = _stop_token_ids(body)
    logprobs, top_logprobs = _wanted_logprobs(body, is_chat)
    try:
        sampling = SamplingParams(
            max_tokens=max_tokens if max_tokens is not None else default_max_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=_get_int(body, "top_k", -1) or 0,
            min_p=_get_float(body, "min_p", 0.0),
            seed=seed,
            ignore_eos=ignore_eos,
            min_tokens=_get_int(body, "min_tokens", 0) or 0,
            stop_token_ids=stop_token_ids,
            logprobs=logprobs,
            top_logprobs=top_logprobs,
            prompt_logprobs=_prompt_logprobs(body),
        )
    except ValueError as exc:
        raise RequestError(str(exc), str(exc).split(" ", 1)[0]) from exc
    return GenerationRequest(
        model=model,
        prompts=prompts,
        sampling=sampling,
        stream=_get_bool(body, "stream"),
        include_usage=include_usage,
        stop=_stop_strings(body),
        priority=_get_int(body, "priority", 0) or 0,
        is_chat=is_chat,
        return_token_ids=_get_bool(body, "return_token_ids"),
        cache_salt=_cache_salt(body),
        kv_transfer=_kv_transfer(body, len(prompts) * n),
        n=n,
        continuous_usage=continuous_usage,
    )


def _continues(body: Mapping[str, object]) -> bool:
    """vLLM's ``continue_final_message``: the model goes on with the final (assistant) message
    instead of starting a new one, so ``add_generation_prompt`` must be false."""
    continues = _get_bool(body, "continue_final_message")
    prompt = body.get("add_generation_prompt", True)
    if not isinstance(prompt, bool):
        raise RequestError("add_generation_prompt must be a boolean", "add_generation_prompt")
    if continues and prompt:
        raise RequestError(
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
            "continue_final_message",
        )
    return continues


def _cache_salt(body: Mapping[str, object]) -> str | None:
    value = body.get("cache_salt")
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise RequestError("cache_salt must be a non-empty string", "cache_salt")
    return value


def _kv_transfer(body: Mapping[str, object], num_prompts: int) -> KVTransferParams | None:
    raw = body.get("kv_transfer_params")
    if raw is None:
        return None
    try:
        params = KVTransferParams.parse(raw)
    except KVTransferParamsError as exc:
        name = "kv_transfer_params" + (f".{exc.field}" if exc.field else "")
        raise RequestError(str(exc), name) from exc
    if num_prompts != 1 and (params.do_remote_decode or params.do_remote_prefill):
        raise RequestError(
            "kv_transfer_params needs a single prompt and n of 1", "kv_transfer_params"
        )
    if params.do_remote_decode and _get_bool(body, "stream"):
        raise RequestError(
            "a prefill for a remote decode (do_remote_decode) must not stream",
            "kv_transfer_params.do_remote_decode",
        )
    return params


def _stop_token_ids(body: Mapping[str, object]) -> tuple[int, ...]:
    value = body.get("stop_token_ids")
    if value is None:
        return ()
    if not isinstance(value, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value
    ):
        raise RequestError("stop_token_ids must be a list of token ids", "stop_token_ids")
    return tuple(t for t in value if isinstance(t, int))


def _prompt_logprobs(body: Mapping[str, object]) -> int | None:
    """vLLM's ``prompt_logprobs``, not with a stream (vLLM's rule; its range is
    ``SamplingParams``')."""
    value = _get_int(body, "prompt_logprobs", None)
    if value and body.get("stream") is True:
        raise RequestError(
            "prompt_logprobs are not available when stream is true", "prompt_logprobs"
        )
    return value


def _wanted_logprobs(body: Mapping[str, object], is_chat: bool) -> tuple[bool, int]:
    """Whether the chosen tokens' log-probabilities are asked for, and how many of the most
    likely tokens' at each position: chat's ``logprobs: true`` with ``top_logprobs`` (0-20,
    only with ``logprobs``), completions' ``logprobs`` (0-20), as vLLM reads them."""
    value = body.get("logprobs")
    if is_chat:
        if value is not None and not isinstance(value, bool):
            raise RequestError("logprobs must be a boolean", "logprobs")
        top = _get_int(body, "top_logprobs", 0) or 0
        if top and value is not True:
            raise RequestError("top_logprobs needs logprobs set to true", "top_logprobs")
        name = "top_logprobs"
    else:
        asked = _get_int(body, "logprobs", None)
        if asked is None:
            return False, 0
        top, name = asked, "logprobs"
    if not 0 <= top <= MAX_LOGPROBS:
        raise RequestError(f"{name} must be in [0, {MAX_LOGPROBS}]; got {top}", name)
    return value is not None and value is not False, top
