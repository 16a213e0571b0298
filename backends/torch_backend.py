"""``--runner torch``: the torch runner and the model's tokenizer, from the command line."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from backends.runner_parts import RunnerParts
from backends.runners.process_runner import ProcessRunner
from backends.runners.torch_runner import TorchRunner
from backends.runners.torch_setup import TorchModelSpec, build_torch_runner, choose_device
from kvgate.wire.request_tokenizer import RequestTokenizer, make_tokenizer


def build_torch_parts(args: argparse.Namespace) -> RunnerParts:
    if (args.model_path is None) == (args.preset is None):
        raise ValueError("--runner torch needs exactly one of --model-path DIR or --preset NAME")
    tokenizer = _tokenizer(args.tokenizer or args.model_path)
    spec = TorchModelSpec(
        model_path=args.model_path,
        preset=args.preset,
        seed=args.seed,
        dtype=args.dtype,
        device=args.device,
        kv_cache_memory=args.kv_cache_memory,
        max_loras=args.max_loras,
        max_lora_rank=args.max_lora_rank,
        packed_projections=not args.plain_matmul,
        vocab_size=tokenizer.vocab_size if args.preset else None,
    )
    eos = tuple(tokenizer.eos_token_ids)
    if args.model_path is not None:
        eos += _generation_eos(Path(args.model_path))
    eos = tuple(dict.fromkeys(eos))
    runner: TorchRunner | ProcessRunner
    if args.engine_process:
        runner = ProcessRunner(spec, eos)
    else:
        runner = build_torch_runner(spec, eos_token_ids=eos)
    config = runner.config
    eos_ids = tuple(dict.fromkeys(eos + config.eos_token_ids))
    return RunnerParts(
        runner,
        tokenizer,
        args.model_path or f"kvgate-{args.preset}",
        eos_ids,
        max_model_len=config.max_position_embeddings,
        vocab_size=config.vocab_size,
        load_lora=runner.load_lora_now,
        max_num_batched_tokens=step_budget(choose_device(args.device).type),
    )


def step_budget(device_type: str) -> int:
    """Tokens per step by default: on a CPU, 2,048, vLLM's CPU server default (a CPU's prefill
    is as efficient at 2,048 rows as at 4,096, and requests that arrive together then get their
    first tokens in turn instead of all at the end of one long step); elsewhere 4,096."""
    return 2048 if device_type == "cpu" else 4096


def _tokenizer(folder: str | None) -> RequestTokenizer:
    if folder is not None and (Path(folder) / "tokenizer.json").is_file():
        return make_tokenizer(folder)
    return make_tokenizer("byte")


def _generation_eos(folder: Path) -> tuple[int, ...]:
    """``generation_config.json``'s EOS ids, which vLLM also stops on."""
    try:
        raw = json.loads((folder / "generation_config.json").read_text())
    except (OSError, ValueError):
        return ()
    eos = raw.get("eos_token_id") if isinstance(raw, dict) else None
    if isinstance(eos, int):
        return (eos,)
    return tuple(t for t in eos if isinstance(t, int)) if isinstance(eos, list) else ()
