"""HF transformers as the engine benchmark's baselines, run in a child process of their own.

``python -m bench.hf_peers MODEL MODE PROMPTS.json OUTPUT_TOKENS`` prints one JSON
line: output tokens, seconds, tokens/s. Modes: ``sequential`` (``generate`` one request at a
time), ``static8`` (left-padded static batches of 8), ``continuous`` (transformers' own
continuous batching, ``generate_batch``, sized for this CPU and run under ``torch.no_grad``:
``inference_mode`` breaks it). Every mode decodes greedily and ignores EOS.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any


def _generate(model: Any, torch: Any, prompts: list[list[int]], num_tokens: int) -> int:
    width = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for row, prompt in enumerate(prompts):  # left padding, as batched generation needs
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=num_tokens,
        min_new_tokens=num_tokens,
        do_sample=False,
        pad_token_id=0,
    )
    return int((out.shape[1] - width) * len(prompts))


def run(model_path: str, mode: str, prompts: list[list[int]], num_tokens: int) -> dict[str, float]:
    import torch
    import transformers

    auto: Any = transformers.AutoModelForCausalLM
    model = auto.from_pretrained(model_path, dtype=torch.float32).eval()
    with torch.no_grad():
        _generate(model, torch, prompts[:1], 2)  # warm-up
        start = time.perf_counter()
        if mode == "sequential":
            tokens = sum(_generate(model, torch, [p], num_tokens) for p in prompts)
        elif mode == "static8":
            tokens = sum(
                _generate(model, torch, prompts[i : i + 8], num_tokens)
                for i in range(0, len(prompts), 8)
            )
        elif mode == "continuous":
            config = getattr(transformers, "GenerationConfig")(  # noqa: B009 - untyped
                max_new_tokens=num_tokens,
                min_new_tokens=num_tokens,
                do_sample=False,
                eos_token_id=-1,
                pad_token_id=0,
            )
            batching = transformers.ContinuousBatchingConfig(
                num_blocks=256, max_batch_tokens=512, max_requests_per_batch=16
            )
            results = model.generate_batch(
                inputs=prompts,
                generation_config=config,
                continuous_batching_config=batching,
                warmup=False,
            )
            tokens = sum(len(r.generated_tokens) for r in results.values())
        else:
            raise SystemExit(f"unknown mode {mode!r}")
        seconds = time.perf_counter() - start
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}


def main() -> int:
    model_path, mode, prompts_file, num_tokens = sys.argv[1:5]
    with open(prompts_file) as handle:
        prompts = json.load(handle)
    print(json.dumps(run(model_path, mode, prompts, int(num_tokens))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
