"""Random-weight Llama and Qwen2 checkpoints saved by transformers, with a locally trained
tokenizer: the peer the torch runner is checked against (nothing is downloaded)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

VOCAB = 1024


def _save(tmp: Path, family: str) -> Path:
    from tests.vllm.tiny_model import build_tokenizer

    folder = tmp / family
    folder.mkdir()
    build_tokenizer(folder)
    torch.manual_seed(0)
    shape = {
        "vocab_size": VOCAB,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 1024,
        "bos_token_id": 0,
        "eos_token_id": 4,
    }
    if family == "llama":
        config = transformers.LlamaConfig(
            **shape,
            tie_word_embeddings=False,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 4.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 256,
            },
        )
        model = transformers.LlamaForCausalLM(config)
    else:
        config = transformers.Qwen2Config(**shape, tie_word_embeddings=True, rope_theta=1e6)
        model = transformers.Qwen2ForCausalLM(config)
    # larger weights than the init's 0.02 make greedy choices depend on the whole context
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 2:
                param.normal_(0, 0.08)
    model.save_pretrained(folder, safe_serialization=True)
    return folder


@pytest.fixture(scope="session")
def model_folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("hf-models")
    return {family: _save(tmp, family) for family in ("llama", "qwen2")}


@pytest.fixture(scope="session")
def hf_models(model_folders: dict[str, Path]) -> dict[str, object]:
    return {
        family: transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
        for family, folder in model_folders.items()
    }


def hf_greedy(model: object, prompt: list[int], num_tokens: int) -> list[int]:
    """transformers' greedy continuation of ``prompt`` through its own KV cache, never stopping
    at EOS (as ``ignore_eos``; ``generate``'s ``min_new_tokens`` would mask EOS instead)."""
    tokens: list[int] = []
    # the cache's argument and output field: ``cache`` from transformers 5.2x, before that
    # ``past_key_values`` (which the newer ones warn of)
    arguments = inspect.signature(model.forward).parameters  # type: ignore[attr-defined]
    cache = "cache" if "cache" in arguments else "past_key_values"
    with torch.no_grad():
        out = model(torch.tensor([prompt]), use_cache=True)  # type: ignore[operator]
        for _ in range(num_tokens):
            token = int(out.logits[0, -1].argmax())
            tokens.append(token)
            past = {cache: getattr(out, cache)}
            out = model(torch.tensor([[token]]), use_cache=True, **past)  # type: ignore[operator]
    return tokens
